"""ocr-compare.py --html at scale: the report's size and a browser's load time for 100 and
1,000 pages shown (issue #44). Not a test: nothing here asserts a figure.

    uv run --no-project --with-requirements tests/requirements.txt python benchmarks/report_size.py

An output of 1,000 rows is made directly (parquet, as a run writes it): scan-like pages
(tests/pages.scan_page at 1240x1754, 150 dpi A4, JPEG, distinct per row) with a Markdown answer of about
2,000 characters holding a table and a formula. For each count shown: the seconds ocr-compare.py
takes to write the report, the file's size (with the default 1,600 px views and with
--html-page-px 0, thumbnails only), and the seconds Debian's chromium takes to load it (load
event, every image decoded), through Playwright."""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pages import scan_page  # noqa: E402

ROWS = 1000
ANSWER = ("# Section {i}\n\n" + "A line of running text of the page, as a model writes it. " * 24
          + "\n\n| year | count |\n| --- | --- |\n| 2024 | {i} |\n\n$$E = mc^2$$\n")


def make_output(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    (folder / "data").mkdir(parents=True)
    scans = [Image.open(io.BytesIO(scan_page(seed, size=(1240, 1754)))) for seed in range(20)]
    images = []
    for i in range(ROWS):
        page = scans[i % len(scans)].copy()
        page.putpixel((i % 1240, i // 1240), (i % 256, 0, 0))  # each row its own bytes
        buffer = io.BytesIO()
        page.save(buffer, "JPEG", quality=85)
        images.append({"bytes": buffer.getvalue(), "path": None})
    table = pa.table({"image": images, "file_name": [f"page_{i:04d}.jpg" for i in range(ROWS)],
                      "markdown": [ANSWER.format(i=i) for i in range(ROWS)]})
    pq.write_table(table, folder / "data" / "part-000000000-000001000.parquet", row_group_size=100)


def load_seconds(path: Path) -> float:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        started = time.perf_counter()
        page.goto(path.as_uri(), timeout=600_000)
        page.wait_for_function("[...document.images].every(i => i.complete)", timeout=600_000)
        seconds = time.perf_counter() - started
        browser.close()
    return seconds


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        make_output(out)
        print(f"output: {ROWS} rows, {sum(p.stat().st_size for p in out.rglob('*.parquet')) / 1e6:.1f} MB")
        print(f"{'pages shown':>11} {'views':>8} {'write s':>8} {'size MB':>8} {'MB/page':>8} {'load s':>7}")
        for shown in (100, 1000):
            for views in ("1600", "0"):
                report = Path(tmp) / f"report-{shown}-{views}.html"
                started = time.perf_counter()
                subprocess.run([sys.executable, str(ROOT / "ocr-compare.py"), str(out), "--html",
                                str(report), "--show", str(shown), "--html-page-px", views],
                               check=True, capture_output=True)
                wrote = time.perf_counter() - started
                size = report.stat().st_size / 1e6
                print(f"{shown:>11} {views + ' px' if views != '0' else 'none':>8} {wrote:>8.1f} "
                      f"{size:>8.1f} {size / shown:>8.3f} {load_seconds(report):>7.1f}", flush=True)


if __name__ == "__main__":
    main()
