"""ocr-compare.py --olmocr-bench: a small benchmark in olmOCR-Bench's layout, made here (PDFs of
flat colours, tests of the types present, absent, order, table and math), run through a model
script against the stub (which answers each page with the text --answer-map gives its colour),
then scored by the official scorer (olmocr[bench], installed by uv for this mode). Each test's
pass or fail is checked against what its construction implies, and the score against a count
by hand. Playwright's browser cannot be installed here: PLAYWRIGHT_BROWSERS_PATH points at an
empty folder, so the math tests are left out, and the score says it is not comparable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_script
from pdfs import Page, make_pdf
from test_compare import run_compare, write_output

SCRIPT = "ovis-ocr2-server.py"
MODEL = "ATH-MaaS/OvisOCR2"
# one flat colour per page: the stub tells the pages apart by it
ALPHA, BETA_1, BETA_2, GAMMA, DELTA = ((200, 60, 60), (60, 200, 60), (60, 60, 200),
                                       (200, 200, 60), (60, 200, 200))
PAGES = {"alpha.pdf": [ALPHA], "sub/beta.pdf": [BETA_1, BETA_2], "gamma.pdf": [GAMMA],
         "delta.pdf": [DELTA]}
ANSWERS = {  # repeat 1; repeat 2 differs on gamma only, and has no row for beta page 2
    ALPHA: "# Alpha report\n\nThe quick brown fox jumps over the lazy dog.\n\n"
           "First section comes before the second section.",
    BETA_1: "| Name | Qty |\n|---|---|\n| apples | 3 |\n| pears | 5 |",
    BETA_2: None,  # refused: an error row, written as an empty page
    GAMMA: "Gamma page, the wrong words in the wrong order: second before first.",
    DELTA: None,
}
GAMMA_2 = "Gamma page: first before second."


def bench_test(file, id, type, pdf, page=1, **fields):
    return file, {"pdf": pdf, "page": page, "id": id, "type": type, **fields}


# (file, test) and whether it passes, by construction. Over two repeats a test passes when it
# passes in both (one of two is no majority).
TESTS = [
    (bench_test("text.jsonl", "t1", "present", "alpha.pdf", text="quick brown fox"), True),
    (bench_test("text.jsonl", "t2", "present", "alpha.pdf", text="slow green turtle"), False),
    (bench_test("text.jsonl", "t3", "absent", "alpha.pdf", text="Confidential"), True),
    # wrong words in repeat 1 only: 1 of 2 repeats pass
    (bench_test("text.jsonl", "t4", "absent", "gamma.pdf", text="wrong words"), False),
    (bench_test("text.jsonl", "t5", "present", "sub/beta.pdf", 2, text="Page two text"), False),
    (bench_test("text.jsonl", "t6", "absent", "sub/beta.pdf", 2, text="anything"), True),  # empty
    (bench_test("text.jsonl", "t7", "present", "delta.pdf", text="Delta heading"), False),
    (bench_test("order.jsonl", "o1", "order", "alpha.pdf", before="First section",
          after="second section"), True),
    (bench_test("order.jsonl", "o2", "order", "gamma.pdf", before="first", after="second"), False),
    (bench_test("table.jsonl", "b1", "table", "sub/beta.pdf", cell="3", left="apples",
          top_heading="Qty"), True),
    (bench_test("table.jsonl", "b2", "table", "sub/beta.pdf", cell="5", up="apples"), False),
    (bench_test("table.jsonl", "b3", "table", "alpha.pdf", cell="fox"), False),  # no table there
    (bench_test("math.jsonl", "m1", "math", "alpha.pdf", math="x^2"), None),  # left out: no browser
]
# the scorer's own test per PDF (page 1): text there, no loop; delta's page is empty
BASELINE = {"alpha.pdf": True, "sub/beta.pdf": True, "gamma.pdf": True, "delta.pdf": False}


def make_benchmark(folder: Path) -> Path:
    for name, colours in PAGES.items():
        path = folder / "pdfs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_pdf([Page(colour=tuple(c / 255 for c in colour))
                                   for colour in colours]))
    for (file, spec), _ in TESTS:
        with open(folder / file, "a") as handle:
            handle.write(json.dumps(spec) + "\n")
    return folder


def answer_map(path: Path, answers: dict) -> Path:
    path.write_text(json.dumps({",".join(map(str, c)): text for c, text in answers.items()}))
    return path


def run_over_pdfs(bench: Path, out: Path, stub) -> Path:
    run = run_script(SCRIPT, str(bench / "pdfs"), str(out), "--server", stub.url, "--model",
                     MODEL, "--request-timeout", "60")
    assert run.returncode == 0, run.stderr
    return out


def drop_row(output: Path, file_name: str, page: int) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    for part in (output / "data").glob("*.parquet"):
        table = pq.read_table(part)
        keep = pc.invert(pc.and_(pc.equal(table["file_name"], file_name),
                                 pc.equal(table["page_number"], page)))
        pq.write_table(table.filter(keep), part)


@pytest.fixture
def no_browser(tmp_path):
    empty = tmp_path / "no-browsers"
    empty.mkdir()
    return {"PLAYWRIGHT_BROWSERS_PATH": str(empty)}


def test_a_run_over_the_benchmark_is_scored_by_the_official_scorer(tmp_path, stub_server,
                                                                   no_browser):
    bench = make_benchmark(tmp_path / "bench")
    first = run_over_pdfs(bench, tmp_path / "run-1", stub_server(
        "--answer-map", str(answer_map(tmp_path / "map-1.json", ANSWERS))))
    second = run_over_pdfs(bench, tmp_path / "run-2", stub_server(
        "--answer-map", str(answer_map(tmp_path / "map-2.json", {**ANSWERS, GAMMA: GAMMA_2}))))
    drop_row(second, "sub/beta.pdf", 2)  # a page missing from a run
    report = tmp_path / "bench.json"
    run = run_compare(first, second, "--olmocr-bench", bench, "--json", report, env=no_browser)
    assert run.returncode == 0, run.stderr
    print(run.stdout)
    result = json.loads(report.read_text())

    # the candidate folder, in the benchmark's layout: a page without text is an empty .md
    candidate = bench / "run-1"
    assert result["candidate"] == str(candidate.resolve())
    assert (candidate / "alpha_pg1_repeat1.md").read_text() == ANSWERS[ALPHA]
    assert (candidate / "gamma_pg1_repeat2.md").read_text() == GAMMA_2
    assert (candidate / "sub" / "beta_pg1_repeat2.md").read_text() == ANSWERS[BETA_1]
    for md in ("sub/beta_pg2_repeat1.md", "sub/beta_pg2_repeat2.md", "delta_pg1_repeat1.md"):
        assert (candidate / md).read_text() == ""
    empty = {(p["pdf"], p["page"], p["repeat"]): p["reason"] for p in result["empty_pages"]}
    assert set(empty) == {("sub/beta.pdf", 2, 1), ("sub/beta.pdf", 2, 2), ("delta.pdf", 1, 1),
                          ("delta.pdf", 1, 2)}
    assert empty[("sub/beta.pdf", 2, 1)].startswith("failed:")
    assert empty[("sub/beta.pdf", 2, 2)] == "missing: no row"

    # no browser: the math test is left out, and the score says it is not comparable
    assert result["comparable"] is False and result["math_tests_left_out"] == 1
    assert "NOT comparable to published figures" in run.stdout
    assert "playwright install --with-deps chromium" in result["browser_install"]
    assert result["browser_install"] in run.stdout
    assert "math" not in result["by_type"] and "math.jsonl" not in result["by_file"]

    # each test passes or fails as built
    failed = {t["id"] for t in result["failed_tests"]}
    for (_, spec), passes in TESTS:
        if passes is not None:
            assert (spec["id"] not in failed) == passes, spec
    for pdf, passes in BASELINE.items():
        assert (f"{pdf}_baseline" not in failed) == passes, pdf
    assert len(failed) == sum(not p for _, p in TESTS if p is not None) + \
        sum(not p for p in BASELINE.values())

    # the score, counted by hand: text 3/7, order 1/2, table 1/3, baseline 3/4; the headline
    # is the mean of the per-file pass rates
    files = {f: (v["passed"], v["tests"]) for f, v in result["by_file"].items()}
    assert files == {"text.jsonl": (3, 7), "order.jsonl": (1, 2), "table.jsonl": (1, 3),
                     "baseline": (3, 4)}
    assert result["score"] == pytest.approx((3 / 7 + 1 / 2 + 1 / 3 + 3 / 4) / 4)
    assert result["ci95"][0] <= result["score"] <= result["ci95"][1]
    # per type: the mean over tests of the share of repeats that passed
    types = {k: (v["score"], v["tests"]) for k, v in result["by_type"].items()}
    assert types == {"present": (pytest.approx(0.25, abs=1e-3), 4),
                     "absent": (pytest.approx(2.5 / 3, abs=1e-3), 3),
                     "order": (pytest.approx(0.75, abs=1e-3), 2),
                     "table": (pytest.approx(1 / 3, abs=1e-3), 3),
                     "baseline": (pytest.approx(0.75, abs=1e-3), 4)}
    assert "overall 50.3%" in run.stdout

    # the settings that made the output, from inference_info
    assert result["settings"]["model"] == MODEL
    assert result["settings"]["script"] == SCRIPT
    assert "temperature" in result["settings"]["settings"]
    assert f"model {MODEL}" in run.stdout and "temperature: 0.0" in run.stdout
    assert result["settings"]["pdf_dpi"] == 400  # an option of the run: from its manifest
    assert "rendered at up to 400 DPI" in run.stdout


# ---- bad inputs: a clear error before any scoring ------------------------------------------------

INFO = {"model": MODEL, "model_revision": "abc", "script": SCRIPT, "column": "markdown",
        "settings": {"temperature": 0.1, "max_tokens": 100}}


def output_of(folder: Path, rows: list[tuple], info: dict = INFO, columns=None) -> Path:
    data = {"file_name": [r[0] for r in rows], "page_number": [r[1] for r in rows],
            "markdown": ["text" for _ in rows],
            "inference_info": [json.dumps([info]) for _ in rows]}
    return write_output(folder, {k: v for k, v in data.items() if k in (columns or data)})


ALL_PAGES = [("alpha.pdf", 1), ("sub/beta.pdf", 1), ("sub/beta.pdf", 2), ("gamma.pdf", 1),
             ("delta.pdf", 1)]


@pytest.mark.parametrize("case, expected", [
    ("no pdfs folder", "has no pdfs/ folder"),
    ("no test files", "has no *.jsonl test files"),
    ("unknown test type", "text.jsonl:8: test type 'bogus' is none of present, absent"),
    ("no file_name", "has no file_name and page_number columns"),
    ("two rows for one page", "has two rows for sub/beta.pdf page 2"),
    ("pdfs absent", "2 of the benchmark's 4 PDFs are not in"),
    ("other settings", "was made with other settings than"),
    ("other pdf dpi", "(pdf_dpi 400 vs 200)"),
    ("a parity option", "--plot does not go with --olmocr-bench"),
])
def test_bad_inputs_are_refused_before_scoring(tmp_path, case, expected):
    bench = make_benchmark(tmp_path / "bench")
    rows, second = list(ALL_PAGES), None
    columns = None
    if case == "no pdfs folder":
        shutil.rmtree(bench / "pdfs")
    elif case == "no test files":
        for file in bench.glob("*.jsonl"):
            file.unlink()
    elif case == "unknown test type":
        with open(bench / "text.jsonl", "a") as handle:
            handle.write(json.dumps({"pdf": "alpha.pdf", "page": 1, "id": "x", "type": "bogus"})
                         + "\n")
    elif case == "no file_name":
        columns = ["markdown", "inference_info"]
    elif case == "two rows for one page":
        rows.append(("sub/beta.pdf", 2))
    elif case == "pdfs absent":
        rows = rows[:3]
    elif case == "other settings":
        second = output_of(tmp_path / "run-2", rows,
                           {**INFO, "settings": {**INFO["settings"], "temperature": 0.0}})
    elif case == "other pdf dpi":  # an option of the run, in its manifest
        second = output_of(tmp_path / "run-2", rows)
        for folder, dpi in ((tmp_path / "run-1", 400), (second, 200)):
            (folder / ".ocr").mkdir(parents=True)
            (folder / ".ocr" / "manifest.json").write_text(
                json.dumps({"identity": {"options": {"pdf_dpi": dpi}}}))
    first = output_of(tmp_path / "run-1", rows, columns=columns)
    extra = ["--plot", tmp_path / "p.png"] if case == "a parity option" else []
    run = run_compare(first, *([second] if second else []), "--olmocr-bench", bench, *extra)
    assert run.returncode == 2, run.stdout + run.stderr
    assert expected in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert not (bench / "run-1").exists()  # nothing written, nothing scored
    if case == "pdfs absent":
        assert "delta.pdf, gamma.pdf" in run.stderr
    if case == "other settings":
        assert "settings.temperature 0.1 vs 0.0" in run.stderr and str(second) in run.stderr


def test_without_uv_the_scorer_is_not_installed_and_nothing_is_written(tmp_path):
    bench = make_benchmark(tmp_path / "bench")
    (tmp_path / "empty").mkdir()
    run = run_compare(output_of(tmp_path / "run-1", ALL_PAGES), "--olmocr-bench", bench,
                      env={"PATH": str(tmp_path / "empty")})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "uv is not on PATH" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (bench / "run-1").exists()
