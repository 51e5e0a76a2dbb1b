"""What the README and REFERENCE.md promise and no other test covered: a Hub INPUT's --config,
--split, --revision and --hf-token; the layout models' blocks and raw columns after a run; the dataset
card; 429 retries; the restart limit; the same stats keys from every script; the offline
scripts' re-run under the image's Python, and their fallback to uv.
"""

from __future__ import annotations

import json
import os
import re
import signal
import shlex
import sys
import types
from pathlib import Path

import pytest

from conftest import (ALL_SCRIPTS, ROOT, SERVER_SCRIPTS, TESTS, fake_vllm_env, free_port,
                      load_output, load_script, page_image, run_script, write_image_folder,
                      write_parquet_dataset)
from test_dots_mocr import DOTS_LAYOUT
from test_postprocessing import DEEPSEEK_DOCUMENT, HPD_OUTPUT, LIGHTON_GROUNDING

OVIS = "ovis-ocr2-server.py"
REFERENCE = (ROOT / "REFERENCE.md").read_text()  # the README's reference page


@pytest.fixture
def keep_sigterm():
    """main() in-process installs its SIGTERM handler in pytest's process: put it back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_hub_input_is_read_with_its_config_split_revision_and_token(tmp_path, stub_server,
                                                                      monkeypatch, keep_sigterm):
    """No network here: datasets.load_dataset is the seam, as HfApi is for a Hub OUTPUT."""
    import datasets

    stub = stub_server()
    cells = [page_image(i, fmt="JPEG") for i in range(3)]
    parquet = write_parquet_dataset(tmp_path / "hub", cells)
    real_load = datasets.load_dataset
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append({"path": path, "name": name, **kwargs})
        return real_load("parquet", data_files=str(parquet), split="train")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    out = tmp_path / "out"
    argv = ["user/scans", str(out), "--config", "pages-v2", "--split", "validation",
            "--revision", "0123abcd", "--hf-token", "hf_sekrit_456", "--server", stub.url,
            "--request-timeout", "20"]
    assert load_script(OVIS).main(argv) == 0
    monkeypatch.undo()
    assert calls == [{"path": "user/scans", "name": "pages-v2", "split": "validation",
                      "revision": "0123abcd", "token": "hf_sekrit_456"}]
    ds = load_output(out)
    assert ds["row_id"] == [0, 1, 2] and all(e is None for e in ds["markdown_error"])
    card = (out / "README.md").read_text()
    assert "user/scans" in card and "hf_sekrit" not in card + "".join(ds["inference_info"])


LAYOUT_RUNS = {  # script: (its model's raw output, its flags, the block labels it must give)
    "lighton-ocr3-saturate.py": (LIGHTON_GROUNDING, ["--mode", "grounding"],
                                 ["title", "text", "table", "image", "text", "text+",
                                  "page_number"]),  # a continuation is a block of its own
    "deepseek-ocr-server.py": (DEEPSEEK_DOCUMENT, [],
                               ["title", "text", "table", "image", "image", "text"]),
    # DeepSeek-OCR-2 answers in DeepSeek-OCR's format (MODEL-FACTS.md, DeepSeek-OCR-2, "Output")
    "deepseek-ocr2-server.py": (DEEPSEEK_DOCUMENT, [],
                                ["title", "text", "table", "image", "image", "text"]),
    "hpd-parsing-saturate.py": (HPD_OUTPUT, [], ["doc_title", "text", "table", "chart", "seal", "text"]),
    "dots-mocr-server.py": (DOTS_LAYOUT, ["--drop-margins"],
                            ["Page-header", "Title", "Text", "Formula", "Table", "Picture",
                             "Caption", "Picture", "Page-footer"]),
}
# Pages from write_image_folder() are 640x820: sent as they are, boxes in the server's
# resize of that size (dots.mocr: its model answers in those pixels)
SENT_SIZE = (640, 820)


@pytest.mark.parametrize("script", sorted(LAYOUT_RUNS))
def test_blocks_raw_output_and_card_read_back_after_a_layout_run(tmp_path, stub_server, script):
    """The stub answers in the model's own output shape; what comes back from the written
    dataset is the blocks column (label, box, text), the raw output with --keep-raw, clean
    Markdown, and a card with the run's facts."""
    module = load_script(script)
    raw, flags, labels = LAYOUT_RUNS[script]
    (tmp_path / "answer.txt").write_text(raw, encoding="utf-8")
    stub = stub_server("--model", getattr(module, "SERVED_NAME", module.MODEL_ID),
                       "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 3, fmt="JPEG")
    out = tmp_path / "out"
    run = run_script(script, str(tmp_path / "in"), str(out), "--server", stub.url,
                     "--no-sanity-check", "--keep-raw", "--max-tokens", "1000",
                     "--stats-json", str(tmp_path / "stats.json"), *flags)
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    sized = (SENT_SIZE,) if getattr(module, "POSTPROCESS_GETS_SIZE", False) else ()
    text, extras = module.postprocess(raw, types.SimpleNamespace(
        keep_raw=True, mode="grounding", prompt=None, prompt_mode="document",
        drop_margins="--drop-margins" in flags), *sized)
    for row in ds:
        assert row["markdown_raw"] == raw
        assert [block["label"] for block in row["markdown_blocks"]] == labels
        assert row["markdown_blocks"] == extras["blocks"]
        assert row["markdown"] == text and "<|ref|>" not in text and "<BLOCK>" not in text
        # DeepSeek-OCR's one figure span stays as its authors' placeholder (MODEL-FACTS.md,
        # DeepSeek-OCR, "Figures"), and dots.mocr's two Picture cells become two (MODEL-FACTS.md,
        # dots.mocr, "Authors' Markdown"); no other script leaves an image link
        figures = {"deepseek-ocr-server.py": ["![](images/0.jpg)"],
                   "deepseek-ocr2-server.py": ["![](images/0.jpg)"],
                   "dots-mocr-server.py": ["![](images/0.jpg)", "![](images/1.jpg)"]}.get(script, [])
        assert re.findall(r"!\[[^\]]*\]\([^)]*\)", text) == figures
        assert text.count("![") == len(figures)
    if script.startswith("lighton"):
        assert {tuple(r["texts"]) for r in stub.requests()} == {("grounding",)}
    card = (out / "README.md").read_text()
    # no configs block: datasets would serve a cached copy of the folder by its name
    assert card.startswith("---\n") and "configs:" not in card
    assert module.MODEL_ID in card and module.JOB_IMAGE in card
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert f'"rows_ok": {stats["rows_ok"]}' in card and stats["rows_ok"] == 3
    serve_line = next(line for line in card.splitlines() if line.startswith("Serve flags:"))
    assert all(flag in serve_line for flag in module.SERVE_ARGS if flag.startswith("--"))
    reproduce = card.split("Reproduce on Hugging Face Jobs:", 1)[1]
    assert script in reproduce and "--keep-raw" in reproduce
    command = reproduce.split("```")[1]  # a local path would mean nothing inside a Job
    words = shlex.split(command)  # an image without uv: the script's arguments are in its shell line
    words = shlex.split(words[-1].split('"$SCRIPT_URL"', 1)[1]) if words[2] == "run" else \
        words[words.index(script) + 1:]
    assert str(tmp_path) not in command and words[:2] == ["INPUT", "OUTPUT"]
    assert all(flag in reproduce for flag in flags)


def test_429_is_retried_with_backoff(tmp_path, stub_server):
    stub = stub_server("--fail-every", "2", "--fail-status", "429")
    paths = write_image_folder(tmp_path / "in", 6)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--request-timeout", "20", "--max-retries", "6", "--concurrency", "2")
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert all(e is None for e in ds["markdown_error"]) and ds.num_rows == len(paths)
    assert len(stub.requests()) >= 9  # every other request was answered 429, then sent again


def test_a_spawned_server_that_keeps_dying_is_restarted_at_most_max_restarts_times(tmp_path):
    port = free_port()
    env = fake_vllm_env(tmp_path, stub_args="--die-after 3")  # every start dies at request 4
    write_image_folder(tmp_path / "in", 20)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--concurrency", "1",
                     "--max-restarts", "2", "--part-rows", "1", "--no-sanity-check", env=env)
    assert run.returncode != 0, run.stderr
    assert "restart 1/2" in run.stderr and "restart 2/2" in run.stderr
    assert "restart 3/" not in run.stderr and "giving up" in run.stderr
    starts = (tmp_path / "fake-vllm.log").read_text().splitlines()
    assert len(starts) == 3  # the first start and two restarts
    saved = load_output(tmp_path / "out")
    assert 1 <= saved.num_rows < 20 and all(e is None for e in saved["markdown_error"])


def documented_stats_keys() -> tuple[set, set]:
    """The keys REFERENCE.md promises from every script, and those saturate scripts add."""
    section = REFERENCE.split("## Reading the stats and the card", 1)[1].split("\n## ", 1)[0]
    common, saturate = section.split("saturate scripts add", 1)
    saturate = saturate.split("write the window", 1)[0]
    names = lambda text: set(re.findall(r"`([a-z0-9_]+)`", text))  # noqa: E731
    return names(common.split("writes one JSON object", 1)[1]), names(saturate)


def test_every_script_writes_the_same_stats_keys(tmp_path, stub_server):
    common, saturate_extra = documented_stats_keys()
    assert {"rows_total", "pages_per_s", "vllm_version"} <= common and "bound_by" in saturate_extra
    keys = {}
    for script in ALL_SCRIPTS:
        module = load_script(script)
        folder = tmp_path / script.replace(".py", "")
        write_image_folder(folder / "in", 2, fmt="JPEG")
        args = [str(folder / "in"), str(folder / "out"), "--no-sanity-check", "--max-tokens",
                "1000", "--stats-json", str(folder / "stats.json")]
        if script in SERVER_SCRIPTS:
            stub = stub_server("--model", getattr(module, "SERVED_NAME", module.MODEL_ID))
            run = run_script(script, *args, "--server", stub.url)
        else:  # the fake vllm package stands in for the engine
            run = run_script(script, *args, env={"PYTHONPATH": str(TESTS / "fake_vllm_pkg")})
        assert run.returncode == 0, (script, run.stderr[-2000:])
        keys[script] = set(json.loads((folder / "stats.json").read_text()))
    for script, found in keys.items():
        expected = common | (saturate_extra if load_script(script).SCRIPT_SHAPE == "saturate" else set())
        assert found == expected, (script, sorted(found ^ expected))


@pytest.mark.parametrize("script", ["ovis-ocr2-server.py", "ovis-ocr2.py",
                                    "lighton-ocr3-saturate.py"])
def test_a_refused_run_writes_the_same_stats_keys(tmp_path, script):
    """No server and no vllm: the run is refused (exit 2) and its stats still carry every key
    REFERENCE.md promises (rows_recovered was missing: it was set only once rows were planned;
    a saturate script's own keys, bound_by..., only once its window ran)."""
    common, saturate_extra = documented_stats_keys()
    common |= saturate_extra if load_script(script).SCRIPT_SHAPE == "saturate" else set()
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--stats-json",
                     str(tmp_path / "stats.json"), "--server", f"http://127.0.0.1:{free_port()}",
                     env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}) \
        if script in SERVER_SCRIPTS else \
        run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--stats-json",
                   str(tmp_path / "stats.json"), env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert set(stats) == common, sorted(set(stats) ^ common)
    assert stats["exit_code"] == 2 and stats["rows_recovered"] == 0


def test_an_offline_script_without_vllm_asks_uv_for_it(tmp_path):
    """No vllm here and no other Python with one: the script re-runs itself through
    `uv run --with vllm<requirement>`. The fake uv records that and runs the script with the
    fake vllm package, as uv would with the real one."""
    fake_uv = tmp_path / "bin" / "uv"
    fake_uv.parent.mkdir()
    fake_uv.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" > "$FAKE_UV_LOG"\n'
                       'shift 3  # run --with REQUIREMENT\n'
                       f'PYTHONPATH={TESTS / "fake_vllm_pkg"} exec "{sys.executable}" "$@"\n')
    fake_uv.chmod(0o755)
    gpu = tmp_path / "bin" / "nvidia-smi"  # a GPU machine: only there is vllm worth installing
    gpu.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA L4'\n")
    gpu.chmod(0o755)
    script = "lighton-ocr3.py"
    module = load_script(script)
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--no-sanity-check",
                     env={"PATH": f"{fake_uv.parent}{os.pathsep}/usr/bin:/bin",
                          "FAKE_UV_LOG": str(tmp_path / "uv.log"), "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"asking uv for vllm{module.VLLM_REQUIREMENT}" in run.stderr
    logged = (tmp_path / "uv.log").read_text().split()
    assert logged[:3] == ["run", "--with", f"vllm{module.VLLM_REQUIREMENT}"]
    assert logged[3] == str(ROOT / script) and logged[4:6] == [str(tmp_path / "in"), str(tmp_path / "out")]
    assert load_output(tmp_path / "out").num_rows == 2


def test_an_offline_script_reruns_under_the_images_python(tmp_path):
    """In the vLLM image, vllm is installed for the image's Python, not for uv's: the script
    re-runs itself there with its own light dependencies appended to the path. /usr/bin/python3
    (no datasets, no pillow) stands in for the image's Python, the fake vllm package for the
    image's vllm; the script starts under a Python that cannot see that package."""
    image_python = Path("/usr/bin/python3")
    if not image_python.exists():
        pytest.skip("no /usr/bin/python3 to stand in for the image's Python")
    probe = __import__("subprocess").run([str(image_python), "-c", "import sys; print(sys.version_info[:2])"],
                                         capture_output=True, text=True)
    if probe.stdout.strip() != str(tuple(sys.version_info[:2])):
        pytest.skip("/usr/bin/python3 is another Python version than the test environment's")
    script = "ovis-ocr2.py"
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    stats = tmp_path / "stats.json"
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--no-sanity-check",
                     "--stats-json", str(stats),
                     env={"PYTHONPATH": str(TESTS / "fake_vllm_pkg"), "PYTHONNOUSERSITE": "1"},
                     python_args=["-E"])  # -E: this first Python ignores PYTHONPATH
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"using the vllm installed for {image_python}" in run.stderr
    assert json.loads(stats.read_text())["vllm_version"] == "fake-0"
    assert load_output(tmp_path / "out").num_rows == 2


def test_readme_gives_the_render_dpi_of_the_scripts_without_a_size_bound():
    """DeepSeek-OCR renders PDFs at its authors' 144 DPI (MODEL-FACTS.md, DeepSeek-OCR, "PDFs":
    DeepSeek-OCR-vllm/run_dpsk_ocr_pdf.py); the README said 200 for it."""
    rendering = " ".join(REFERENCE.split("* **Rendering.**", 1)[1].split("\n* ", 1)[0].split())
    deepseek, hpd = (load_script(s).PDF_DPI for s in ("deepseek-ocr-server.py",
                                                       "hpd-parsing-saturate.py"))
    assert f"DeepSeek-OCR renders at its authors' {deepseek} DPI" in rendering and deepseek == 144
    assert f"HPD-Parsing, which resizes nothing client-side, at {hpd} DPI" in rendering
