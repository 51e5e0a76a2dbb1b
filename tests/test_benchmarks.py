"""The benchmark command's own plumbing (the figures themselves come from running it)."""

from __future__ import annotations

import importlib.util
import io
import statistics
import subprocess
import sys
import types

from conftest import ROOT


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_help_lists_every_section_and_unknown_ones_are_refused():
    shown = run_bench("--help")
    assert shown.returncode == 0, shown.stderr
    for section in ("driver-cost", "memory", "startup", "stub-1000", "scale-out", "ceiling", "shapes",
                    "compare"):
        assert section in shown.stdout
    refused = run_bench("ceiling", "no-such-section")
    assert refused.returncode == 2
    assert "unknown section(s) no-such-section" in refused.stderr


def load_bench():
    """benchmarks/run.py as a module (it imports its neighbours from benchmarks/)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return run


def load_page_length():
    """benchmarks/page_length.py without an engine: vLLM's base class replaced by `object`."""
    fake = types.ModuleType("vllm.v1.sample.logits_processor")
    fake.AdapterLogitsProcessor = object
    saved = {name: sys.modules.get(name) for name in
             ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor")}
    for name in saved:
        sys.modules[name] = fake if name.endswith("logits_processor") else types.ModuleType(name)
    try:
        spec = importlib.util.spec_from_file_location("page_length", ROOT / "benchmarks" / "page_length.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def test_page_lengths_are_stable_and_long_tailed():
    page_length = load_page_length().page_length
    lengths = sorted(page_length(tokens) for tokens in range(100, 3100))
    assert [page_length(k) for k in (252, 999)] == [page_length(k) for k in (252, 999)]
    assert 16 <= lengths[0] and lengths[-1] <= 768
    median, p90 = statistics.median(lengths), lengths[int(0.9 * len(lengths))]
    assert 85 <= median <= 110, median  # lognormal, median 96
    assert p90 > 2.3 * median, (median, p90)  # the long tail that makes offline batches wait
    assert len(set(lengths)) > 200


def test_benchmark_pages_differ_in_image_tokens():
    """Each page must have its own number of 32 px units, or the page-length processor would
    give pages of one size one length and the workload would not be long-tailed."""
    from PIL import Image
    import datasets

    bench = load_bench()

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        source = bench.distinct_pages(Path(tmp), 96)
        cells = datasets.load_dataset("parquet", data_files=str(source), split="train").cast_column(
            "image", datasets.Image(decode=False))["image"]
        sizes = [Image.open(io.BytesIO(cell["bytes"])).size for cell in cells]
    assert len(sizes) == 96
    assert all(w % 32 == 0 and h % 32 == 0 for w, h in sizes)
    assert len({(w // 32) * (h // 32) for w, h in sizes}) == 96


def test_the_ceilings_clients_stay_off_the_engines_compute_cores(tmp_path):
    """The cores come from the worker's own log line; both clients run on the others, and the
    benchmark process gets its cores back afterwards."""
    import os

    bench = load_bench()

    log = tmp_path / "serve.log"
    log.write_text("(EngineCore pid=1) INFO [ompmultiprocessing.py:185] \tlocal_rank=0, "
                   "core ids=[0]\n")
    engine = types.SimpleNamespace(server=types.SimpleNamespace(log=log))
    assert bench.SharedEngine.compute_cores(engine) == {0}
    before = os.sched_getaffinity(0)
    with bench.ClientCores({0}) as cores:
        inside = os.sched_getaffinity(0)
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True).stdout.strip()
    assert os.sched_getaffinity(0) == before
    if len(before) > 1 and 0 in before:
        assert inside == cores == before - {0}
        assert child == str(sorted(before - {0}))  # a driver started from here inherits it
    else:
        assert inside == before  # nothing to keep clear of: left as it was


def test_compare_corpus_edits_every_third_page_and_keeps_the_truth(tmp_path):
    import pyarrow.parquet as pq
    bench = load_bench()
    a, b = bench.compare_corpus(tmp_path, 30, 500)
    ta = pq.read_table(next((a / "data").glob("*.parquet"))).to_pydict()
    tb = pq.read_table(next((b / "data").glob("*.parquet"))).to_pydict()
    assert ta["file_name"] == tb["file_name"] and len(ta["markdown"]) == 30
    assert [x != y for x, y in zip(ta["markdown"], tb["markdown"])] == [k % 3 == 0 for k in range(30)]
    assert all(len(t) == 500 and "#" not in t for t in ta["text"])
    assert all(m.startswith("# ") and "**" in m for m in ta["markdown"])


def test_the_pdf_sections_render_helper_runs_on_a_pdf(tmp_path):
    """The pdf section's in-process render measure calls into the script's PDF renderer: run
    it as the section does (its own process) on a 2-page PDF."""
    from pdfs import Page, make_pdf

    pdf = tmp_path / "two.pdf"
    pdf.write_bytes(make_pdf([Page(text="A line of text."), Page()]))
    bench = load_bench()
    run = subprocess.run([sys.executable, "-c", bench.UP_FRONT, str(ROOT / "benchmarks"),
                          "lighton-ocr3-saturate.py", str(pdf)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    pages, seconds, rate = run.stdout.split()
    assert int(pages) == 2 and float(seconds) > 0 and float(rate) > 0


def test_the_driver_cost_sections_in_process_measure_runs(tmp_path):
    """driver-cost turns pages into request bodies with the script's own prepare_page and
    request_body: one page of each kind, once."""
    from conftest import load_script

    bench = load_bench()
    mix = bench.page_mix(tmp_path / "mix", 4)
    kinds = bench.per_page_cpu_by_kind(load_script("ovis-ocr2-server.py"), mix, reps=1)
    assert set(kinds) == {"JPEG within bound", "grayscale PNG", "A4 JPEG above bound"}
    assert all(ours > 0 and reference > 0 for ours, reference in kinds.values())
