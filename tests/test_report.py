"""ocr-compare.py --html: a run made by a model script against the stub, then its report opened
in a real browser (Debian's chromium, driven by Playwright with executable_path: Playwright's
own browser download does not reach this machine). What is checked is what a user sees: the
page images load, a table in an answer renders as a table, a formula stays as written, and a
<script> in an answer (untrusted text) does not run. A screenshot of the first screen is written
under the test's temporary folder and its path printed.

Without chromium the browser test skips with the install command; in CI (CI=true) it fails."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from conftest import run_script
from pages import with_ink
from pdfs import Page, make_pdf
from test_compare import run_compare

SCRIPT = "ovis-ocr2-server.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
INSTALL = "apt-get install -y chromium"
# a page's answer, picked by its colour (tests/stub_server.py --answer-map)
TABLE_PAGE, SCRIPT_PAGE, FORMULA_PAGE = (220, 60, 60), (60, 200, 60), (60, 60, 220)
ANSWERS = {
    TABLE_PAGE: "# Results\n\n| year | count |\n| --- | --- |\n| 2024 | 7 |\n| 2025 | 9 |\n",
    SCRIPT_PAGE: ("Before <script>document.title = 'pwned'; document.body.dataset.ran = '1'"
                  "</script> after <img src=x onerror=\"document.body.dataset.ran='2'\">"
                  "<table><tr><td onclick=\"x()\">cell</td></tr></table>"),
    FORMULA_PAGE: "The energy is $E = mc^2$ and\n\n$$\\int_0^1 x\\,dx = \\frac{1}{2}$$\n",
}


def make_run(tmp_path: Path, stub_server, answers: dict = ANSWERS, name: str = "out") -> Path:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    for i, colour in enumerate(answers):
        with_ink(Image.new("RGB", (600, 800), colour)).save(folder / f"page_{i}.png")
    mapping = tmp_path / f"answers-{name}.json"
    mapping.write_text(json.dumps({",".join(map(str, c)): t for c, t in answers.items()}))
    stub = stub_server("--answer-map", str(mapping))
    run = run_script(SCRIPT, str(folder), str(tmp_path / name), "--server", stub.url,
                     "--request-timeout", "20")
    assert run.returncode == 0, run.stderr
    return tmp_path / name


def report(tmp_path: Path, *args) -> tuple[Path, str]:
    path = tmp_path / f"report-{len(list(tmp_path.glob('report-*.html')))}.html"
    run = run_compare("--show", "50", *args, "--html", path)
    assert run.returncode == 0, run.stderr
    return path, path.read_text()


def test_a_look_at_one_run_shows_each_page_beside_its_sanitised_text(tmp_path, stub_server):
    out = make_run(tmp_path, stub_server)
    path, page = report(tmp_path, out)
    assert page.count("<article") == 3  # every page, in input order
    assert page.index("page_0.png") < page.index("page_1.png") < page.index("page_2.png")
    assert page.count('class="thumb"') == 3 and page.count('class="full"') == 3
    assert "<table>" in page and "<td>2024</td>" in page  # the Markdown table, rendered
    assert "E = mc^2" in page and "\\frac{1}{2}" in page  # formulas as written
    rendered = page.split('class="rendered"')[2].split("</div>")[0]  # the script page's answer
    assert "<script" not in rendered and "onerror" not in rendered and "onclick" not in rendered
    assert "&lt;script&gt;" in page  # the source view shows it, escaped
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_thumbnails_are_bounded_and_a_page_is_embedded_once(tmp_path, stub_server, compare_module):
    """A 3000 px scan shown twice (two byte-identical rows): one thumbnail of at most 512 px, the
    second showing points at the first; the file grows with the pages shown, not the rows."""
    import base64
    import io

    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.png", "b.png"):
        with_ink(Image.new("RGB", (2000, 3000), (220, 60, 60))).save(folder / name)
    mapping = tmp_path / "answers.json"
    mapping.write_text(json.dumps({"220,60,60": "text"}))
    stub = stub_server("--answer-map", str(mapping))
    assert run_script(SCRIPT, str(folder), str(tmp_path / "out"), "--server", stub.url).returncode == 0
    _, page = report(tmp_path, tmp_path / "out")
    thumbs = [part.split('"')[0] for part in page.split('class="thumb" alt="page 1" src="data:image/jpeg;base64,')[1:]]
    assert len(thumbs) == 1 and page.count("data:image/jpeg") == 2  # one thumbnail + one full view
    assert max(Image.open(io.BytesIO(base64.b64decode(thumbs[0]))).size) <= 512
    assert "the same page as" in page
    _, one = report(tmp_path, tmp_path / "out", "--show", "1")
    assert len(one) < len(page)


@pytest.fixture(scope="module")
def compare_module():
    from conftest import load_script
    return load_script("ocr-compare.py")


def test_the_marked_diff_of_long_answers_is_bounded_and_loses_no_text(compare_module):
    """The word diff's table grows as the product of the two lengths (two answers of 300,000
    words took 11 GB): past DIFF_WORDS words a side, only the start is compared, said so, and
    the rest of B follows unmarked."""
    limit = compare_module.DIFF_WORDS
    a = " ".join(f"w{i}" for i in range(limit))
    b = a.replace("w7 ", "changed ", 1) + " tail words"
    marked = compare_module.marked_diff(a, b)
    assert "<del>w7</del>" in marked and "<ins>changed</ins>" in marked
    assert "only the first" in marked and marked.endswith("tail words")
    assert "<del>" not in marked[marked.index("only the first"):]
    short = compare_module.marked_diff("one two", "one three")
    assert "only the first" not in short and "<del>two</del>" in short and "<ins>three</ins>" in short


def test_parity_marks_the_differences_worst_first(tmp_path, stub_server):
    a = make_run(tmp_path, stub_server, name="a")
    changed = dict(ANSWERS)
    changed[FORMULA_PAGE] = "The energy is $E = mc^3$ and nothing else\n"
    b = make_run(tmp_path, stub_server, changed, name="b")
    _, page = report(tmp_path, a, b)
    first = page.split("<article")[1]
    assert "page_2.png" in first and "similarity" in first  # the one different page, first
    assert "<del>" in first and "<ins>" in first
    assert "byte-identical" in page.split("<article")[2]


def test_accuracy_against_a_reference_column_shows_cer_worst_first(tmp_path, stub_server):
    import pyarrow.parquet as pq
    out = make_run(tmp_path, stub_server)
    part = sorted((out / "data").glob("*.parquet"))[0]
    table = pq.read_table(part)
    refs = [ANSWERS[TABLE_PAGE], "Before after cell", "completely different reference text here"]
    pq.write_table(table.append_column("gt", __import__("pyarrow").array(refs)), part)
    _, page = report(tmp_path, out, "--reference-column", "gt")
    first = page.split("<article")[1]
    assert "page_2.png" in first and "CER" in first and "reference" in first
    title = page.split("<title>")[1].split("</title>")[0]
    assert title.endswith(" against " + title.split(" against ")[0] + " [gt]"), title  # not "A against A"


def test_pdf_pages_are_rendered_from_the_input(tmp_path, stub_server):
    pdf = tmp_path / "in" / "doc.pdf"
    pdf.parent.mkdir()
    pdf.write_bytes(make_pdf([Page(text="first page"), Page(text="second page")]))
    stub = stub_server()
    assert run_script(SCRIPT, str(pdf.parent), str(tmp_path / "out"), "--server",
                      stub.url).returncode == 0
    no_input = run_compare(tmp_path / "out", "--html", tmp_path / "r.html")
    assert no_input.returncode == 2 and "--input" in no_input.stderr
    assert "Traceback" not in no_input.stderr
    _, page = report(tmp_path, tmp_path / "out", "--input", pdf.parent)
    assert page.count('class="thumb"') == 2


def test_an_input_that_is_not_the_runs_is_a_one_line_error(tmp_path, stub_server):
    """--input naming another PDF (fewer pages than the run has) or a file that is no PDF."""
    pdf = tmp_path / "in" / "doc.pdf"
    pdf.parent.mkdir()
    pdf.write_bytes(make_pdf([Page(text="first page"), Page(text="second page")]))
    assert run_script(SCRIPT, str(pdf.parent), str(tmp_path / "out"), "--server",
                      stub_server().url).returncode == 0
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "doc.pdf").write_bytes(make_pdf([Page(text="only page")]))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "doc.pdf").write_text("not a PDF")
    for wrong in ("short", "broken"):
        run = run_compare(tmp_path / "out", "--input", tmp_path / wrong, "--html", tmp_path / "r.html")
        assert run.returncode == 2 and "--input" in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr and "doc.pdf" in run.stderr


def test_html_options_are_checked_before_anything_runs(tmp_path):
    run = run_compare(tmp_path / "missing", "--input", tmp_path)
    assert run.returncode == 2 and "--input goes with --html" in run.stderr
    run = run_compare(tmp_path, "--html", tmp_path / "r.html", "--html-page-px", "-1")
    assert run.returncode == 2 and "--html-page-px must be >= 0" in run.stderr


def test_the_report_in_a_real_browser(tmp_path, stub_server):
    if CHROMIUM is None:
        message = f"chromium is not installed: {INSTALL}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    out = make_run(tmp_path, stub_server)
    path, _ = report(tmp_path, out)
    shot = tmp_path / "report-first-screen.png"
    requests = []
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("request", lambda request: requests.append(request.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            loaded = page.eval_on_selector_all(
                "img.thumb", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
            assert loaded == [True, True, True]
            assert page.locator(".rendered table td", has_text="2024").count() == 1
            assert page.title() != "pwned" and page.evaluate("document.body.dataset.ran") is None
            page.screenshot(path=str(shot))
            full = page.locator("img.full").first
            assert not full.is_visible()
            page.locator("img.thumb").first.click()  # the full view opens, with no script
            assert full.is_visible() and full.evaluate("i => i.naturalWidth") == 600
            full.click()  # and closes
            assert not full.is_visible()
        finally:
            browser.close()
    assert not [url for url in requests if not url.startswith(("file:", "data:"))]
    assert shot.stat().st_size > 10_000
    print(f"screenshot of the report's first screen: {shot}")
