"""PDF input, end to end against the stub server (and the fake vLLM package for the offline
scripts): one row per page, rendered once at the size each model wants, bad documents as
error rows, page selection, the text layer, resume at page granularity, shards over documents.

The PDFs are made here (tests/pdfs.py): flat pages of known colour, size and rotation, with real
text, so the stub's answer ("# Page WxH / mean colour r,g,b") says what reached the server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, load_output, load_script, page_image, run_script
from pdfs import Page, colour_of, hanging_pdf, make_pdf, zero_page_pdf

LIGHTON = "lighton-ocr3-saturate.py"  # longest edge 2048 on a 32 px grid
OVIS = "ovis-ocr2-server.py"  # a pixel cap (8.3 MP) on a 32 px grid
DEEPSEEK = "deepseek-ocr-server.py"  # no client-side bound: its authors' 144 DPI, 12 MP cap
ANSWER = re.compile(r"# Page (\d+)x(\d+)\n\nmean colour (\d+),(\d+),(\d+);")


def common(stub, *extra):
    return ["--server", stub.url, "--model", "ATH-MaaS/OvisOCR2", "--part-rows", "5",
            "--request-timeout", "60", *extra]


def answered(text: str | None) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(size, mean colour) of the page the stub was sent."""
    match = ANSWER.match(text or "")
    assert match, text
    w, h, r, g, b = map(int, match.groups())
    return (w, h), (r, g, b)


def close_to(colour, expected, tolerance=6) -> bool:
    return all(abs(a - round(b * 255)) <= tolerance for a, b in zip(colour, expected))


def stats_of(path: Path) -> dict:
    stats = json.loads(path.read_text())
    assert stats["rows_ok"] + stats["rows_failed"] + stats["rows_skipped"] + \
        stats["rows_text_layer"] + stats["rows_not_written"] == stats["rows_total"], stats
    return stats


def kill_9_after_requests(args: list[str], stub, requests: int) -> None:
    """Start the driver, and kill -9 it once the stub has seen this many requests."""
    driver = subprocess.Popen([sys.executable, str(ROOT / OVIS), *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(stub.requests()) < requests:
        assert time.monotonic() < deadline and driver.poll() is None, driver.stderr.read()
        time.sleep(0.05)
    driver.kill()
    driver.wait()


def no_traceback(run):
    assert "Traceback" not in run.stderr, run.stderr


def test_a_folder_of_pdfs_and_images_gives_one_row_per_page(tmp_path, stub_server):
    stub = stub_server()
    source = tmp_path / "scans"
    source.mkdir()
    (source / "a.pdf").write_bytes(make_pdf([Page(colour=colour_of(i), text=f"page {i + 1}")
                                             for i in range(5)]))
    (source / "b.pdf").write_bytes(make_pdf([Page(rotation=90, colour=(0.2, 0.5, 0.8)),
                                             Page(width=842, height=595, colour=(0.8, 0.3, 0.2))]))
    (source / "c.png").write_bytes(page_image(3))
    out = tmp_path / "out"
    run = run_script(LIGHTON, str(source), str(out), *common(stub, "--stats-json",
                                                             str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    rows = list(zip(ds["file_name"], ds["page_number"], ds["page_count"]))
    assert rows == [("a.pdf", n, 5) for n in range(1, 6)] + [("b.pdf", 1, 2), ("b.pdf", 2, 2),
                                                             ("c.png", None, None)]
    assert "pdf" not in ds.column_names  # the document is named by file_name, not carried
    assert ds["image"][:7] == [None] * 7 and ds["image"][7] is not None
    for i in range(5):
        size, colour = answered(ds["markdown"][i])
        assert size == (1568, 2048), size  # Letter at 400 DPI is 3400x4400: longest edge 2048
        assert close_to(colour, colour_of(i)), (colour, colour_of(i))
    rotated, landscape = answered(ds["markdown"][5])[0], answered(ds["markdown"][6])[0]
    assert rotated == (1568, 2048)  # a /Rotate 90 page of a landscape box reads upright
    assert landscape == (2048, 1440)  # A4 landscape: 842x595 pt, on the 32 px grid
    assert answered(ds["markdown"][7])[0] == (640, 820)  # the image, as before
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_total"] == 8 and stats["rows_ok"] == 8


@pytest.mark.parametrize("script, expected", [
    (OVIS, (2880, 2880)),  # the pixel cap, 2880x2880 on a 32 px grid
    (DEEPSEEK, (3464, 3464)),  # no bound of its own: 144 DPI, then the 12 MP cap
    (LIGHTON, (2048, 2048)),
])
def test_a_giant_page_is_rendered_at_the_bound_never_at_full_dpi(tmp_path, stub_server, script,
                                                                 expected):
    """A 200-inch page (14400 pt) at 400 DPI would be an 80,000-pixel bitmap."""
    stub = stub_server("--model", load_script(script).MODEL_ID)
    source = tmp_path / "in"
    source.mkdir()
    (source / "poster.pdf").write_bytes(make_pdf([Page(14400, 14400, colour=(0.9, 0.1, 0.1))]))
    started = time.monotonic()
    run = run_script(script, str(source), str(tmp_path / "out"), "--server", stub.url,
                     "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 0, run.stderr
    row = load_output(tmp_path / "out")[0]
    size, colour = answered(row["markdown"])
    assert size == expected and close_to(colour, (0.9, 0.1, 0.1))
    assert json.loads((tmp_path / "s.json").read_text())["peak_rss_bytes"] < 1.5e9
    assert time.monotonic() - started < 120


def test_bad_documents_become_error_rows_naming_the_reason(tmp_path, stub_server):
    stub = stub_server()
    source = tmp_path / "in"
    source.mkdir()
    good = make_pdf([Page(colour=colour_of(i)) for i in range(3)])
    (source / "1-good.pdf").write_bytes(good)
    (source / "2-encrypted.pdf").write_bytes(make_pdf([Page(text="secret")], password="pw"))
    (source / "3-truncated.pdf").write_bytes(good[:300])
    (source / "4-empty.pdf").write_bytes(zero_page_pdf())
    (source / "5-not-a-pdf.pdf").write_bytes(b"just text, named .pdf")
    (source / "6-good.pdf").write_bytes(make_pdf([Page(colour=(0.1, 0.6, 0.3))]))
    out = tmp_path / "out"
    run = run_script(OVIS, str(source), str(out), *common(stub, "--stats-json",
                                                          str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    no_traceback(run)
    ds = load_output(out)
    by_file = {}
    for row in ds:
        by_file.setdefault(row["file_name"], []).append(row)
    assert [r["page_number"] for r in by_file["1-good.pdf"]] == [1, 2, 3]
    assert all(r["markdown"] for r in by_file["1-good.pdf"] + by_file["6-good.pdf"])
    for name, reason in [("2-encrypted.pdf", "password"), ("3-truncated.pdf", "format"),
                         ("4-empty.pdf", "format"), ("5-not-a-pdf.pdf", "format")]:
        (row,) = by_file[name]  # one row: its pages cannot be counted
        assert reason in row["markdown_error"] and row["markdown_error_kind"] == "page", row
        assert row["markdown"] is None and row["page_number"] is None
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_total"] == 8 and stats["rows_ok"] == 4 and stats["rows_failed"] == 4
    assert len(stub.requests()) == 4  # nothing sent for a document that cannot be opened


@pytest.mark.parametrize("named", [False, True])
def test_a_pdf_typed_hub_style_dataset_keeps_its_columns_not_its_bytes(tmp_path, stub_server,
                                                                       named):
    """A `datasets.Pdf` column, found or named with --pdf-column, read as bytes by the script
    (the feature's own objects render at 72 DPI); the other columns repeat on each page; the
    PDF bytes stay out of the output."""
    import datasets

    stub = stub_server()
    docs = [make_pdf([Page(colour=colour_of(10 * d + i), text="x" * 200) for i in range(n)])
            for d, n in enumerate([2, 1, 3])]
    features = datasets.Features({"doc": datasets.Pdf(), "title": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"doc": [{"bytes": d, "path": f"d{i}.pdf"}
                                             for i, d in enumerate(docs)],
                                     "title": ["first", "second", "third"]}, features=features)
    source = tmp_path / "in" / "data.parquet"
    source.parent.mkdir()
    ds.to_parquet(str(source))
    out = tmp_path / "out"
    run = run_script(LIGHTON, str(source), str(out),
                     *common(stub, *(["--pdf-column", "doc"] if named else [])))
    assert run.returncode == 0, run.stderr
    result = load_output(out)
    assert result["title"] == ["first"] * 2 + ["second"] + ["third"] * 3
    assert result["page_number"] == [1, 2, 1, 1, 2, 3]
    assert result["page_count"] == [2, 2, 1, 3, 3, 3]
    assert result["doc"] == ["d0.pdf"] * 2 + ["d1.pdf"] + ["d2.pdf"] * 3  # its name, not its bytes
    for i, (d, p) in enumerate([(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]):
        assert close_to(answered(result["markdown"][i])[1], colour_of(10 * d + p), tolerance=12)
    assert sum(f.stat().st_size for f in (out / "data").glob("*.parquet")) < 100_000


def test_a_column_of_pdf_bytes_pages_and_a_selection_out_of_range(tmp_path, stub_server):
    import datasets

    stub = stub_server()
    docs = [make_pdf([Page(colour=colour_of(i)) for i in range(n)]) for n in (6, 1)]
    ds = datasets.Dataset.from_dict({"blob": docs, "id": ["long", "short"]})
    source = tmp_path / "in.parquet"
    ds.to_parquet(str(source))
    out = tmp_path / "out"
    run = run_script(OVIS, str(source), str(out), *common(stub, "--pdf-column", "blob",
                                                          "--pages", "2-3,5-"))
    assert run.returncode == 0, run.stderr
    result = load_output(out)
    assert list(zip(result["id"], result["page_number"])) == [
        ("long", 2), ("long", 3), ("long", 5), ("long", 6), ("short", None)]
    assert "none of --pages 2-3,5- is in this 1-page PDF" in result["markdown_error"][4]
    for i, page in enumerate([2, 3, 5, 6]):
        assert close_to(answered(result["markdown"][i])[1], colour_of(page - 1))
    refused = run_script(OVIS, str(source), str(out), *common(stub, "--pdf-column", "blob",
                                                              "--pages", "1-2"))
    assert refused.returncode == 2 and "pages" in refused.stderr  # another run: refused
    bad = run_script(OVIS, str(source), str(tmp_path / "o2"), *common(stub, "--pages", "3-1"))
    assert bad.returncode == 2 and "--pages" in bad.stderr
    no_traceback(bad)


def test_text_layer_and_skipping_pages_that_have_enough_text(tmp_path, stub_server):
    stub = stub_server()
    source = tmp_path / "in"
    source.mkdir()
    lines = "\n".join(f"Line {i} of a born-digital page with real text." for i in range(20))
    (source / "mixed.pdf").write_bytes(make_pdf([
        Page(text=lines), Page(colour=(0.3, 0.3, 0.3)), Page(text="Short caption"),
        Page(text=lines)]))
    out = tmp_path / "out"
    run = run_script(OVIS, str(source), str(out), *common(stub, "--skip-text-pages", "200",
                                                          "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert ds["markdown_text_layer"][0].splitlines()[0] == "Line 0 of a born-digital page with real text."
    assert ds["markdown_text_layer"][1] == "" and ds["markdown_text_layer"][2] == "Short caption"
    assert [s is not None for s in ds["markdown_skipped"]] == [True, False, False, True]
    assert "--skip-text-pages 200" in ds["markdown_skipped"][0]
    assert ds["markdown"][0] is None and ds["markdown"][1] and ds["markdown"][2]
    assert len(stub.requests()) == 2  # the pages with enough text were not sent
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_text_layer"] == 2 and stats["rows_ok"] == 2 and stats["rows_failed"] == 0
    assert "2 from their text layer" in run.stderr
    # ocr-compare.py tells a page not sent from a failed one: against a run that sent them all
    every = tmp_path / "every"
    assert run_script(OVIS, str(source), str(every), *common(stub)).returncode == 0
    figures = tmp_path / "parity.json"
    compared = run_script("ocr-compare.py", str(out), str(every), "--json", str(figures))
    assert compared.returncode == 0, compared.stderr
    parity = json.loads(figures.read_text())
    assert parity["rows_compared"] == 2 and parity["identical"] == 2
    assert (parity["skipped_a"], parity["skipped_b"]) == (2, 0)
    assert parity["excluded"]["a_failed"] == parity["excluded"]["both_failed"] == 0
    assert re.search(r"not sent, text layer enough: A / B +2 / 0\n", compared.stdout)
    scored = run_script("ocr-compare.py", str(out), "--reference", str(every),
                        "--reference-column", "markdown", "--json", str(figures))
    assert scored.returncode == 0, scored.stderr
    accuracy = json.loads(figures.read_text())
    assert accuracy["excluded"]["skipped"] == 2 and accuracy["error_rows"] == 0
    assert accuracy["rows_compared"] == 2 and accuracy["cer_micro"] == 0


def test_a_killed_run_resumes_at_the_page_inside_a_long_pdf(tmp_path, stub_server):
    """kill -9 in the middle of a 60-page PDF: the rerun sends only the pages not answered."""
    stub = stub_server("--latency", "0.15")
    source = tmp_path / "in"
    source.mkdir()
    (source / "long.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(60)]))
    out = tmp_path / "out"
    args = [str(source), str(out), *common(stub, "--concurrency", "2")]
    kill_9_after_requests(args, stub, 25)
    sent_before = len(stub.requests())
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    resent = len(stub.requests()) - sent_before
    assert 60 - sent_before <= resent <= 60 - sent_before + 2  # + the pages in flight
    ds = load_output(out)
    assert ds["page_number"] == list(range(1, 61))
    for i in range(60):
        assert close_to(answered(ds["markdown"][i])[1], colour_of(i))


def test_shards_split_documents_and_together_cover_every_page(tmp_path, stub_server):
    stub = stub_server()
    source = tmp_path / "in"
    source.mkdir()
    for d, n in enumerate([3, 1, 4, 2, 5]):
        (source / f"doc{d}.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(n)]))
    out = tmp_path / "out"
    for shard in (0, 1):
        run = run_script(OVIS, str(source), str(out), *common(stub, "--num-shards", "2",
                                                              "--shard-index", str(shard)))
        assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert list(zip(ds["file_name"], ds["page_number"])) == [
        (f"doc{d}.pdf", p) for d, n in enumerate([3, 1, 4, 2, 5]) for p in range(1, n + 1)]
    assert len(stub.requests()) == 15


def test_a_page_that_hangs_or_crashes_the_renderer_is_its_own_error_row(tmp_path, stub_server,
                                                                      monkeypatch):
    """The render deadline and a crashing PDFium, in-process: the worker processes are forked
    from this one, so a render function that hangs on page 2 and dies on page 4 reaches them.
    The pages are told apart by their widths (600 + i points)."""
    module = load_script(OVIS)
    stub = stub_server()
    source = tmp_path / "in"
    source.mkdir()
    (source / "doc.pdf").write_bytes(make_pdf([Page(width=600 + i, colour=colour_of(i))
                                               for i in range(6)]))
    real = module._render_pdf_page

    def render(page, *options):
        width = round(page.get_size()[0])
        if width == 601:
            time.sleep(60)  # page 2 hangs
        if width == 603:
            os._exit(1)  # page 4 takes its worker down
        return real(page, *options)

    monkeypatch.setattr(module, "_render_pdf_page", render)
    out = tmp_path / "out"
    code = module.main([str(source), str(out), "--server", stub.url, "--pdf-page-timeout", "3",
                        "--pdf-workers", "2"])
    assert code == 0
    ds = load_output(out)
    errors = ds["markdown_error"]
    assert "took more than 3 s" in errors[1] and "crashed on page 4" in errors[3], errors
    assert [e is None for e in errors] == [True, False, True, False, True, True]
    assert all(ds["markdown"][i] for i in (0, 2, 4, 5))
    assert ds["markdown_error_kind"][1] == ds["markdown_error_kind"][3] == "page"


def wait_for_a_renderer_to_hang(driver: subprocess.Popen, cpu_s: float = 2.0) -> None:
    """Until one of the driver's render processes has spent cpu_s of CPU: on the hanging page
    (a normal page of these tests takes a small fraction of that), whatever the load."""
    import psutil

    def cpu(process) -> float:
        try:
            times = process.cpu_times()
        except psutil.Error:  # a worker replaced meanwhile
            return 0.0
        return times.user + times.system

    parent = psutil.Process(driver.pid)
    deadline = time.monotonic() + 240  # for a page that never reaches the renderer, not load
    while not any(cpu(child) >= cpu_s for child in parent.children(recursive=True)):
        assert driver.poll() is None, driver.stderr.read()
        assert time.monotonic() < deadline, "no render process took up the hanging page"
        time.sleep(0.1)


@pytest.mark.parametrize("script", ["ovis-ocr2.py", OVIS])
def test_ctrl_c_while_a_page_hangs_the_renderer_exits_at_once(tmp_path, stub_server, script):
    """Ctrl-C (SIGINT to the terminal's process group) while PDFium hangs on a page: the run
    saves and exits at once, not after --pdf-page-timeout (its worker was waited for, up to
    120 s by default, a second Ctrl-C ignored); the rerun finishes with the page an error row."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a-hangs.pdf").write_bytes(hanging_pdf())
    (source / "b.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(3)]))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "fake_vllm_pkg")}
    shape = ["--batch-size", "2"] if script == "ovis-ocr2.py" else common(stub_server())
    args = [sys.executable, str(ROOT / script), str(source), str(out), *shape]
    # a page timeout no page reaches in this run: an exit that waits for the hung renderer
    # waits an hour, far past communicate's bound, however loaded the machine
    driver = subprocess.Popen(args + ["--pdf-page-timeout", "3600"], env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    wait_for_a_renderer_to_hang(driver)
    os.killpg(driver.pid, signal.SIGINT)
    try:
        _, stderr = driver.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        driver.kill()
        pytest.fail("the exit waited for the hung renderer (--pdf-page-timeout 3600)")
    assert driver.returncode == 130, stderr
    # the rerun's timeout: four times the 3 s a normal page overran at load 5-7 on 2 cores
    # (the hanging page spins a core for all of it: 30 s here cost a minute of the suite's CPU)
    run = run_script(script, *args[2:], "--pdf-page-timeout", "12", env=env)
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert ds["page_number"] == [1, 1, 2, 3]
    assert "took more than 12 s" in ds["markdown_error"][0]
    assert ds["markdown_error"][1:] == [None] * 3


def test_per_document_joins_pages_in_order_and_resumes_inside_a_document(tmp_path, stub_server):
    """--per-document: one row per PDF, its pages in order after <!-- page N --> lines, a failed
    page named in the error beside the good pages' text; kill -9 inside a document, and the
    rerun sends only the pages not answered (they wait in the journal, not in a part)."""
    stub = stub_server("--latency", "0.15", "--reject-smaller-than", "28")
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(40)]))
    (source / "b.pdf").write_bytes(make_pdf([Page(colour=colour_of(50)), Page(0.5, 0.5)]))
    (source / "c.pdf").write_bytes(make_pdf([Page()], password="pw"))
    (source / "d.png").write_bytes(page_image(4))
    out = tmp_path / "out"
    # --send-blank: b's second page (0.5 x 0.5 pt, a few pixels) is sent, so the server refuses it
    args = [str(source), str(out), *common(stub, "--per-document", "--concurrency", "2",
                                           "--send-blank")]
    kill_9_after_requests(args, stub, 15)
    assert not list((out / "data").glob("*.parquet"))  # document a is not whole yet
    sent_before = len(stub.requests())
    run = run_script(OVIS, *args, "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 0, run.stderr
    resent = len(stub.requests()) - sent_before  # of 43 pages: 40 + 2 + d.png
    assert 43 - sent_before <= resent <= 43 - sent_before + 2  # + the pages in flight
    ds = load_output(out)
    assert ds["file_name"] == ["a.pdf", "b.pdf", "c.pdf", "d.png"]
    assert ds["page_count"] == [40, 2, None, None] and "page_number" not in ds.column_names
    a = ds["markdown"][0]
    assert re.findall(r"<!-- page (\d+) -->", a) == [str(n) for n in range(1, 41)]
    for n, chunk in enumerate(a.split("<!-- page ")[1:]):
        assert close_to(answered(chunk.split("-->\n\n", 1)[1])[1], colour_of(n))
    assert ds["markdown_error"][0] is None
    b_text, b_error = ds["markdown"][1], ds["markdown_error"][1]
    assert b_text.startswith("<!-- page 1 -->") and b_text.endswith("<!-- page 2 -->")  # kept,
    # and the failed page's line without text
    assert b_error.startswith("page 2: ") and ds["markdown_error_kind"][1] == "page"
    assert "password" in ds["markdown_error"][2] and ds["markdown"][2] is None
    assert answered(ds["markdown"][3])[0] == (640, 820)  # an image row is as before
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_total"] == 4 and stats["rows_ok"] == 2 and stats["rows_failed"] == 2


def test_a_pdf_path_column_names_its_documents_and_a_replaced_pdf_is_another_run(tmp_path,
                                                                                 stub_server):
    """A column of PDF paths (relative to the table's folder): the output keeps each page's
    document path; a PDF replaced under the same path makes the rerun another run (refused),
    not a resume that labels pages with the wrong document."""
    import datasets

    stub = stub_server()
    folder = tmp_path / "in"
    (folder / "files").mkdir(parents=True)
    for d, n in enumerate([1, 2]):
        (folder / "files" / f"doc{d}.pdf").write_bytes(make_pdf([Page(colour=colour_of(i))
                                                                 for i in range(n)]))
    table = folder / "docs.parquet"
    datasets.Dataset.from_dict({"document": ["files/doc0.pdf", "files/doc1.pdf"]}).to_parquet(str(table))
    out = tmp_path / "out"
    args = [str(table), str(out), *common(stub, "--pdf-column", "document")]
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert list(zip(ds["document"], ds["page_number"])) == [
        ("files/doc0.pdf", 1), ("files/doc1.pdf", 1), ("files/doc1.pdf", 2)]
    (folder / "files" / "doc0.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(3)]))
    again = run_script(OVIS, *args)
    assert again.returncode == 2 and "pdf" in again.stderr, again.stderr
    restarted = run_script(OVIS, *args, "--restart")
    assert restarted.returncode == 0, restarted.stderr
    assert load_output(out)["page_number"] == [1, 2, 3, 1, 2]


def test_a_single_pdf_file_odd_names_and_the_card(tmp_path, stub_server):
    stub = stub_server()
    odd = tmp_path / "odd"
    odd.mkdir()
    name = os.fsdecode(b"caf\xe9.pdf")  # a Latin-1 name, not UTF-8
    (odd / name).write_bytes(make_pdf([Page(colour=colour_of(1)), Page(colour=colour_of(2))]))
    run = run_script(OVIS, str(odd), str(tmp_path / "o1"), *common(stub))
    assert run.returncode == 2 and "caf\\xe9.pdf" in run.stderr and "convmv" in run.stderr
    no_traceback(run)
    single = tmp_path / "report.PDF"
    single.write_bytes(make_pdf([Page(text="x" * 50), Page(colour=colour_of(3))]))
    out = tmp_path / "o2"
    run = run_script(OVIS, str(single), str(out), *common(stub, "--skip-text-pages", "20"))
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert ds["file_name"] == ["report.PDF"] * 2 and ds["page_number"] == [1, 2]
    assert ds["markdown_text_layer"][0] == "x" * 50 and ds["markdown"][0] is None
    card = (out / "README.md").read_text()
    assert "1 with text, 1 from their PDF text layer (not sent) and 0 error rows" in card
    assert "`page_number`" in card and "`markdown_skipped`" in card


def test_pdf_flags_that_would_only_fail_later_are_refused_up_front(tmp_path, stub_server):
    import datasets

    stub = stub_server()
    table = tmp_path / "t.parquet"
    datasets.Dataset.from_dict({"id": ["a", "b"], "blob": [b"not a pdf", b"nor this"]}).to_parquet(str(table))
    for flag, column in (("--pdf-column", "id"), ("--pdf-column", "blob")):
        run = run_script(OVIS, str(table), str(tmp_path / f"o-{column}"), *common(stub, flag, column))
        assert run.returncode == 2 and "holds no PDFs" in run.stderr, run.stderr
        no_traceback(run)
    missing = run_script(OVIS, str(table), str(tmp_path / "o3"), *common(stub))
    assert missing.returncode == 2 and "--pdf-column" in missing.stderr
    for value in ("0", "3-1", "x", "1,,2"):
        run = run_script(OVIS, str(table), str(tmp_path / "o4"), *common(stub, "--pages", value))
        assert run.returncode == 2 and "--pages" in run.stderr, (value, run.stderr)
    run = run_script(OVIS, str(table), str(tmp_path / "o5"), *common(stub, "--pdf-dpi", "50"))
    assert run.returncode == 2 and "--pdf-dpi" in run.stderr


def test_per_document_rerun_redoes_only_the_failed_pages(tmp_path, stub_server):
    """A document whose one page failed on the server's side is an error row; the rerun sends
    that page alone (its good pages wait in the journal), not the whole document."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.pdf").write_bytes(make_pdf([Page(colour=colour_of(i)) for i in range(5)]))
    out = tmp_path / "out"
    failing = stub_server("--fail-first", "1")
    args = [str(source), str(out), "--model", "ATH-MaaS/OvisOCR2", "--per-document",
            "--max-retries", "0", "--concurrency", "1"]
    run = run_script(OVIS, *args, "--server", failing.url)
    assert run.returncode == 0, run.stderr
    (row,) = load_output(out)
    assert row["markdown_error"].startswith("page 1: ") and row["markdown_error_kind"] == "server"
    failing.stop()
    healthy = stub_server()
    run = run_script(OVIS, *args, "--server", healthy.url)
    assert run.returncode == 0, run.stderr
    assert len(healthy.requests()) == 1  # page 1 only
    (row,) = load_output(out)
    assert row["markdown_error"] is None
    assert re.findall(r"<!-- page (\d) -->", row["markdown"]) == ["1", "2", "3", "4", "5"]
    assert not list((out / ".ocr" / "journal").rglob("*.jsonl"))


def test_per_document_with_skipped_pages_reads_in_order(tmp_path, stub_server):
    stub = stub_server()
    source = tmp_path / "in"
    source.mkdir()
    words = "born-digital text " * 5
    (source / "c.pdf").write_bytes(make_pdf([Page(text=words), Page(colour=colour_of(1)),
                                             Page(text=words), Page(colour=colour_of(3))]))
    (source / "d.pdf").write_bytes(make_pdf([Page(text=words)]))
    out = tmp_path / "out"
    run = run_script(OVIS, str(source), str(out), *common(stub, "--per-document",
                                                          "--skip-text-pages", "20",
                                                          "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    c, d = load_output(out)
    assert re.findall(r"<!-- page (\d) -->", c["markdown"]) == ["1", "2", "3", "4"]
    assert c["markdown"].split("<!-- page 2 -->")[0].strip().endswith(words.strip())
    assert "pages 1, 3 not sent" in c["markdown_skipped"]
    assert len(stub.requests()) == 2
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_ok"] == 1 and stats["rows_text_layer"] == 1  # d: its text layer only
    assert d["markdown_attempts"] == 0


def test_deepseek_renders_pdf_pages_at_its_authors_144_dpi(tmp_path, stub_server):
    """MODEL-FACTS.md, DeepSeek-OCR, "PDFs": the authors render pages at 144 DPI
    (DeepSeek-OCR-vllm/run_dpsk_ocr_pdf.py, `pdf_to_images_high_quality(pdf_path, dpi=144)`);
    the script rendered at 200. A Letter page (612x792 pt) at 144 DPI is 1224x1584 pixels."""
    stub = stub_server("--model", load_script(DEEPSEEK).MODEL_ID)
    source = tmp_path / "in"
    source.mkdir()
    (source / "letter.pdf").write_bytes(make_pdf([Page(colour=colour_of(3))]))
    run = run_script(DEEPSEEK, str(source), str(tmp_path / "out"), "--server", stub.url)
    assert run.returncode == 0, run.stderr
    size, colour = answered(load_output(tmp_path / "out")[0]["markdown"])
    assert size == (1224, 1584) and close_to(colour, colour_of(3))


def test_deepseek_figure_numbers_restart_on_each_page_of_a_joined_document(tmp_path, stub_server):
    """MODEL-FACTS.md, DeepSeek-OCR, "Figures": each `image` span becomes `![](images/N.jpg)`
    and a newline, N counting the page's figures from 0 (the authors' run_dpsk_ocr_pdf.py
    counts per page too, naming the page in the file: `images/{page}_{N}.jpg`). With
    --per-document the pages are joined after their `<!-- page N -->` lines, which tell the
    pages' figures apart; the blocks column keeps every figure's box."""
    figure = "<|ref|>image<|/ref|><|det|>[[{0}, 100, 500, 400]]<|/det|>\n"
    answer = (f"{figure.format(10)}\n<|ref|>text<|/ref|><|det|>[[10, 410, 900, 500]]<|/det|>\n"
              f"Body.\n\n{figure.format(20)}{figure.format(30)}")
    (tmp_path / "answer.txt").write_text(answer, encoding="utf-8")
    stub = stub_server("--model", load_script(DEEPSEEK).MODEL_ID,
                       "--answer-file", str(tmp_path / "answer.txt"))
    source = tmp_path / "in"
    source.mkdir()
    pages = [Page(colour=colour_of(1)), Page(colour=colour_of(2))]
    (source / "two.pdf").write_bytes(make_pdf(pages))
    run = run_script(DEEPSEEK, str(source), str(tmp_path / "out"), "--server", stub.url,
                     "--per-document", "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    row = load_output(tmp_path / "out")[0]
    page = "![](images/0.jpg)\n\nBody.\n\n![](images/1.jpg)\n\n![](images/2.jpg)"
    assert row["markdown"] == f"<!-- page 1 -->\n\n{page}\n\n<!-- page 2 -->\n\n{page}"
    assert [b["box"][0] for b in row["markdown_blocks"] if b["label"] == "image"] == \
        [10, 20, 30, 10, 20, 30]


@pytest.mark.parametrize("column", ["pdf", "page_number"])
def test_a_metadata_column_the_script_writes_is_refused_by_name(tmp_path, stub_server, column):
    """Issue #28: a metadata column `pdf` beside PDFs was a traceback."""
    stub = stub_server()
    source = tmp_path / "scans"
    source.mkdir()
    (source / "a.pdf").write_bytes(make_pdf([Page(colour=colour_of(0))]))
    (source / "metadata.csv").write_text(f"file_name,{column},shelf\na.pdf,x,A\n")
    run = run_script(OVIS, str(source), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "metadata.csv" in run.stderr and f"writes itself ({column};" in run.stderr
    no_traceback(run)
    assert stub.requests() == [] and not (tmp_path / "out" / "data").exists()


def test_a_pdf_run_recorded_by_the_version_before_the_document_count_resumes(tmp_path,
                                                                            stub_server):
    """The PDF fingerprint gained its document count (issue #28): an OUTPUT whose manifest
    records the earlier form (the digest alone) resumes the same documents, and a replaced
    PDF is still refused."""
    stub = stub_server()
    source = tmp_path / "scans"
    source.mkdir()
    for d in range(3):
        (source / f"d{d}.pdf").write_bytes(make_pdf([Page(colour=colour_of(d))]))
    out = tmp_path / "out"
    args = [str(source), str(out), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    manifest = out / ".ocr" / "manifest.json"
    recorded = json.loads(manifest.read_text())
    recorded["identity"]["pdf"] = recorded["identity"]["pdf"]["digest"]  # the earlier form
    manifest.write_text(json.dumps(recorded))
    again = run_script(OVIS, *args)
    assert again.returncode == 0, again.stderr
    assert len(stub.requests()) == 3  # nothing sent twice
    (source / "d0.pdf").write_bytes(make_pdf([Page(colour=colour_of(7))] * 2))
    changed = run_script(OVIS, *args)
    assert changed.returncode == 2 and "pdf" in changed.stderr, changed.stderr


def test_check_only_accepts_the_larger_max_samples_the_run_accepts(tmp_path, stub_server):
    """--check-only answers as the run does: it compared a PDF run's fingerprint without the
    earlier document count, so it refused a larger --max-samples that the run continues."""
    stub = stub_server()
    source = tmp_path / "scans"
    source.mkdir()
    for d in range(3):
        (source / f"d{d}.pdf").write_bytes(make_pdf([Page(colour=colour_of(d))]))
    args = [str(source), str(tmp_path / "out"), *common(stub)]
    assert run_script(OVIS, *args, "--max-samples", "2").returncode == 0
    check = run_script(OVIS, *args, "--max-samples", "3", "--check-only")
    answer = json.loads(check.stdout.splitlines()[-1]) if check.returncode == 0 else None
    assert answer is not None and answer.pop("run") and answer == {"rows": 3}, check.stderr


def test_a_larger_max_samples_over_pdfs_continues_the_run(tmp_path, stub_server):
    """Issue #28: the PDF fingerprint covered the selected documents only, so a larger
    --max-samples (which the README allows on an unsharded rerun) was refused."""
    stub = stub_server()
    source = tmp_path / "scans"
    source.mkdir()
    for d in range(4):
        (source / f"d{d}.pdf").write_bytes(make_pdf([Page(colour=colour_of(d + i))
                                                     for i in range(d % 2 + 1)]))
    out = tmp_path / "out"
    args = [str(source), str(out), *common(stub)]
    assert run_script(OVIS, *args, "--max-samples", "2").returncode == 0
    assert len(stub.requests()) == 3
    run = run_script(OVIS, *args, "--max-samples", "3")
    assert run.returncode == 0, run.stderr
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) == 6  # each page sent once
    ds = load_output(out)
    assert list(zip(ds["file_name"], ds["page_number"])) == [
        ("d0.pdf", 1), ("d1.pdf", 1), ("d1.pdf", 2), ("d2.pdf", 1), ("d3.pdf", 1), ("d3.pdf", 2)]
    (source / "d0.pdf").write_bytes(make_pdf([Page(colour=colour_of(0))] * 2))
    again = run_script(OVIS, *args)
    assert again.returncode == 2 and "pdf" in again.stderr, again.stderr
