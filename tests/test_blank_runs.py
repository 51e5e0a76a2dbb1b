"""Blank pages in a run (issue #44): not sent, written with an empty text and the reason in
`<column>_skipped`, counted in `rows_blank` (and as ok rows), said in the card; `--send-blank`
sends them, and a rerun with it sends the rows an earlier run skipped as blank. The pages are
tests/blank_pages.py's: white paper and scanner noise (blank), a lone page number and light
small text (sent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import blank_pages
from conftest import load_output, run_script
from pdfs import Page, make_pdf
from test_write_path import fake_pages_sent, offline_env

SERVER = "ovis-ocr2-server.py"
PAGES = {"a_white.jpg": (blank_pages.white, True), "b_number.jpg": (blank_pages.page_number, False),
         "c_noise.jpg": (blank_pages.scanner_noise, True), "d_text.jpg": (blank_pages.light_small_text, False)}
SIZE = (1240, 1754)  # A4 at 150 dpi: quick to make


def scans(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (make, _) in PAGES.items():
        (folder / name).write_bytes(make(7, size=SIZE))
    return folder


def sent_names(stub) -> int:
    return len(stub.requests())


def run(stub, tmp_path, *extra):
    stats = tmp_path / f"stats-{len(list(tmp_path.glob('stats-*')))}.json"
    done = run_script(SERVER, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                      "--request-timeout", "20", "--stats-json", str(stats), *extra)
    assert done.returncode == 0, done.stderr
    figures = json.loads(stats.read_text())
    said = f" ok ({figures['rows_blank']} blank, not sent)," if figures["rows_blank"] else " ok,"
    assert said in done.stderr.splitlines()[-1]  # the closing line says it
    return figures


def test_blank_pages_are_not_sent_and_are_rows_with_an_empty_text(tmp_path, stub_server):
    scans(tmp_path / "in")
    stub = stub_server()
    stats = run(stub, tmp_path)
    assert sent_names(stub) == 2  # the two pages with ink, and only them
    ds = load_output(tmp_path / "out")
    blank = [PAGES[name][1] for name in ds["file_name"]]
    assert [t == "" for t in ds["markdown"]] == blank
    assert [s is not None and s.startswith("blank page") for s in ds["markdown_skipped"]] == blank
    assert all(e is None for e in ds["markdown_error"])
    assert stats["rows_blank"] == 2 and stats["rows_ok"] == 4 and stats["rows_not_written"] == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "2 blank pages (not sent" in card
    # a rerun with --send-blank sends the two pages skipped as blank, and only them
    stub2 = stub_server()
    stats = run(stub2, tmp_path, "--send-blank")
    assert sent_names(stub2) == 2 and stats["rows_blank"] == 0
    ds = load_output(tmp_path / "out")
    assert all(t and t.startswith("# Page") for t in ds["markdown"])
    assert all(s is None for s in ds["markdown_skipped"])


def test_send_blank_sends_every_page_from_the_start(tmp_path, stub_server):
    scans(tmp_path / "in")
    stub = stub_server()
    stats = run(stub, tmp_path, "--send-blank")
    assert sent_names(stub) == 4 and stats["rows_blank"] == 0


def test_a_blank_pdf_page_is_not_sent(tmp_path, stub_server):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "doc.pdf").write_bytes(make_pdf([
        Page(text="The first page has a line of text."), Page(mark=False), Page(text="12")]))
    stub = stub_server()
    stats = run(stub, tmp_path)
    ds = load_output(tmp_path / "out")
    assert ds["page_number"] == [1, 2, 3] and ds["markdown"][1] == "" and sent_names(stub) == 2
    assert ds["markdown_skipped"][1].startswith("blank page") and stats["rows_blank"] == 1


def test_a_blank_page_is_not_a_degenerate_first_page(tmp_path, stub_server):
    """The first-pages check judges answers: blank pages are never sent, so five blank pages
    before two with text do not stop the run as 'the first pages all came back empty'."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(5):
        (folder / f"a{i}.jpg").write_bytes(blank_pages.white(i, size=SIZE))
    for i in range(2):
        (folder / f"b{i}.jpg").write_bytes(blank_pages.light_small_text(i, size=SIZE))
    stub = stub_server()
    stats = run(stub, tmp_path)
    assert stats["rows_blank"] == 5 and sent_names(stub) == 2


@pytest.mark.parametrize("script", ["ovis-ocr2.py"])
def test_the_offline_script_leaves_blank_pages_out_of_its_batches(tmp_path, script):
    from conftest import run_script as run_offline

    scans(tmp_path / "in")
    stats = tmp_path / "stats.json"
    done = run_offline(script, str(tmp_path / "in"), str(tmp_path / "out"), "--stats-json",
                       str(stats), env=offline_env(tmp_path))
    assert done.returncode == 0, done.stderr
    ds = load_output(tmp_path / "out")
    assert [t == "" for t in ds["markdown"]] == [PAGES[n][1] for n in ds["file_name"]]
    assert json.loads(stats.read_text())["rows_blank"] == 2 and fake_pages_sent(tmp_path) == 2
