"""Issue 16: the first minutes with a script. Arguments are checked before anything else, a run
that cannot start says so at once with the Jobs command, which runs as printed (checked
through `hf jobs ... --dry-run`), the startup probe names what answers on the port, secrets stay out of
command lines and records, the spawned server dies with the driver, --server keeps its path."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (ALL_SCRIPTS, ROOT, SERVER_SCRIPTS, fake_vllm_env, free_port, load_output,
                      load_script, run_script, wait_port, write_image_folder)

OVIS = "ovis-ocr2-server.py"
OFFLINE_SCRIPTS = [s for s in ALL_SCRIPTS if s not in SERVER_SCRIPTS]
REGISTRY = {e["script"]: e for e in json.loads((ROOT / "models.json").read_text())["scripts"]}
NO_VLLM = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": ""}
TOKEN = "hf_SECRETtokenABCDEF123"
KEY = "sk-SECRETkeyABCDEF123"
HF = Path(sys.executable).parent / "hf"


def without_run(answer: dict) -> dict:
    """The check's answer less the run's identity (a digest: issue #41 item 3's tests)."""
    assert len(answer.pop("run")) == 16
    return answer


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


def no_secret(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text and KEY not in text, text


# ---- 1. arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--part-rows", "0"], "--part-rows must be at least 1, got 0"),
    (["--max-samples", "0"], "--max-samples must be at least 1, got 0"),  # an OUTPUT of nothing
    (["--max-retries", "-1"], "--max-retries must be at least 0, got -1"),
    (["--shard-index", "5", "--num-shards", "2"], "--shard-index must be in [0, 2)"),
    (["--concurrency", "0"], "--concurrency must be at least 1"),
    (["--request-timeout", "0"], "--request-timeout must be above 0"),
    (["--serve-args", "--max-model-len 24q"], "'24q' is not a size"),
    (["--serve-args", "--max-model-len 1.5K"], "no decimals with K"),
    (["--serve-args", "--seed 'unbalanced"], "--serve-args cannot be split"),
    (["--server", "ftp://host/x"], "is not an http(s) URL"),
    (["--output-column", " "], "--output-column must name a column"),
])
def test_a_bad_argument_exits_2_at_once_naming_it(tmp_path, extra, message):
    started = time.monotonic()
    run = run_script(OVIS, "user/scans", "user/scans-ocr", "--server", nowhere(), *extra,
                     env=NO_VLLM, timeout=60)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr
    assert "ocr-jobs.py" not in run.stderr  # refused before the server is even looked for
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("output", ["notes.txt", "notes.txt/ocr"])
@pytest.mark.parametrize("check_only", [True, False])
def test_an_output_that_is_a_file_exits_2_at_once(tmp_path, output, check_only):
    """OUTPUT an existing file (or below one): --check-only said "check passed", and the run
    failed only at its first write, after the server's start, with exit 5 and "free space"."""
    write_image_folder(tmp_path / "in", 2)
    (tmp_path / "notes.txt").write_text("mine\n")
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / output), "--server", nowhere(),
                     *(["--check-only"] if check_only else []), env=NO_VLLM, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"{tmp_path / 'notes.txt'} is a file, and OUTPUT is a folder" in run.stderr
    assert "Traceback" not in run.stderr and "ocr-jobs.py" not in run.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_an_output_path_that_cannot_be_looked_at_exits_2_without_a_traceback(tmp_path):
    """OUTPUT whose path the system refuses (a name over 255 bytes; a parent one cannot enter):
    the check that OUTPUT is no file crashed with a traceback before the run's own error."""
    write_image_folder(tmp_path / "in", 2)
    output = tmp_path / ("x" * 300) / "ocr"
    run = run_script(OVIS, str(tmp_path / "in"), str(output), "--server", nowhere(), env=NO_VLLM,
                     timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "File name too long" in run.stderr, run.stderr


def test_raising_the_context_names_the_flag_that_does_it(tmp_path, stub_server):
    """--max-tokens over the context: the advice named `--max-model-len`, which the server
    scripts do not take; a spawned server's is given in --serve-args, a reused one's by it."""
    spawned = run_script(OVIS, "user/scans", "user/out", "--server", nowhere(), "--max-tokens",
                         "40000", env=fake_vllm_env(tmp_path), timeout=60)
    assert spawned.returncode == 2, spawned.stderr
    assert "raise --max-model-len in --serve-args to at least" in spawned.stderr
    stub = stub_server("--model", "ATH-MaaS/OvisOCR2")
    reused = run_script(OVIS, "user/scans", "user/out", "--server", stub.url, "--max-tokens",
                        "40000", env=NO_VLLM, timeout=60)
    assert reused.returncode == 2, reused.stderr
    assert "raise the server's --max-model-len to at least" in reused.stderr


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_negative_shuffle_seed_exits_2_before_anything_is_written(tmp_path, script):
    """numpy takes no negative seed: it crashed with exit 1 after OUTPUT was claimed (a lock
    folder was left behind), in every script."""
    write_image_folder(tmp_path / "in", 2)
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--server", nowhere(),
                     "--shuffle", "--seed", "-1", env=NO_VLLM, timeout=60) \
        if script in SERVER_SCRIPTS else \
        run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--shuffle", "--seed",
                   "-1", env=NO_VLLM, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "--seed must be at least 0 to --shuffle, got -1" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--llm-kwargs", "[1, 2]"], "--llm-kwargs must be a JSON object"),
    (["--llm-kwargs", "{nope"], "--llm-kwargs must be a JSON object"),
])
def test_an_offline_script_checks_its_own_arguments(extra, message):
    run = run_script("ovis-ocr2.py", "user/scans", "user/out", *extra, env=NO_VLLM, timeout=60)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_no_abbreviation_slips_a_secret_past_redaction(script):
    run = run_script(script, "user/scans", "user/out", "--hf-tok", TOKEN, env=NO_VLLM, timeout=60)
    assert run.returncode == 2 and "unrecognized arguments: --hf-tok" in run.stderr
    no_secret(run.stderr, run.stdout)


def test_sizes_are_read_as_vllm_reads_them():
    module = load_script(OVIS)
    size = module.parse_vllm_size
    assert size("24k") == 24_000 and size("24K") == 24_576 and size("25.6k") == 25_600
    assert size("1m") == 1_000_000 and size("1M") == 1 << 20 and size("2G") == 2 << 30
    assert size("32768") == 32768 and size(" 8192 ") == 8192
    assert size("auto") is None and size("AUTO") is None and size("-1") is None
    for bad in ("1.5K", "24q", "", "k", "-5", "1e4"):
        with pytest.raises(ValueError):
            size(bad)


@pytest.mark.parametrize("max_len, fits", [("1k", False), ("24K", False), ("32K", True),
                                           ("32768", True), ("auto", True)])
def test_the_budget_of_a_server_to_spawn_is_checked_before_anything(max_len, fits):
    run = run_script(OVIS, "user/scans", "user/out", "--server", nowhere(),
                     "--serve-args", f"--max-model-len {max_len} --seed 1", env=NO_VLLM, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    if fits:  # on to the next check: no vllm here
        assert "no `vllm` command here" in run.stderr
    else:
        assert "every request would be refused" in run.stderr
        assert not re.search(r"at most -\d", run.stderr)
        assert "raise --max-model-len in --serve-args to at least 24740" in run.stderr


@pytest.mark.parametrize("script", OFFLINE_SCRIPTS)
def test_an_offline_budget_over_the_context_says_by_how_much(script):
    """The offline shape's budget check is the server's: it says by how much, and what to raise
    to which size (it said "Lower --max-tokens or raise max_model_len", without numbers)."""
    module = load_script(script)
    run = run_script(script, "user/scans", "user/out", "--max-tokens", "1000000", env=NO_VLLM,
                     timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"over max_model_len {module.MAX_MODEL_LEN}: every request would be refused" \
        in run.stderr, run.stderr
    assert "raise max_model_len in --llm-kwargs to at least " in run.stderr


@pytest.mark.parametrize("given, said", [
    ([], "over max_model_len 32768: every request would be refused. Lower --max-tokens to at most"),
    (["--llm-kwargs", '{"max_model_len": 20000}'],
     "raise max_model_len in --llm-kwargs to at least 24740")])
def test_an_offline_budget_over_the_engines_context_is_refused_with_its_figures(given, said):
    """The same check as a server's, with the context the engine gets (the script's own when
    --llm-kwargs sets none), before vllm is looked for."""
    tokens = ["--max-tokens", "40000"] if not given else []
    run = run_script("ovis-ocr2.py", "user/scans", "user/out", *tokens, *given, env=NO_VLLM,
                     timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert said in run.stderr and "no vllm can be imported" not in run.stderr


def test_a_server_context_below_the_largest_page_never_suggests_a_negative_budget(
        tmp_path, stub_server):
    stub = stub_server("--max-model-len", "8000")
    run = run_script(OVIS, "user/scans", "user/out", "--server", stub.url, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "max_model_len 8000" in run.stderr and not re.search(r"at most -\d", run.stderr)
    assert "The largest page alone needs 8356 prompt tokens" in run.stderr


@pytest.mark.parametrize("script", [OVIS, "ovis-ocr2.py"])
def test_without_vllm_a_hub_input_fails_fast_without_touching_the_hub(script):
    """No vllm, no GPU, no network: the message comes before the Hub is asked for anything.
    The Hub here is a socket that listens and never answers: a request to it would be seen
    (and would hang until the timeout), whatever the machine's load; no clock is read."""
    import socket

    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen(16)
        hub.setblocking(False)
        run = run_script(script, "user/scans", "./scans-ocr", *(["--server", nowhere()] if
                         script in SERVER_SCRIPTS else []), timeout=120,
                         env={**NO_VLLM, "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}"})
        with pytest.raises(BlockingIOError):  # nobody knocked
            hub.accept()
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "ConnectionError" not in run.stderr
    assert f" {script} user/scans OUTPUT" in run.stderr  # the Jobs command, OUTPUT to fill in


# ---- 2. the Jobs command, which runs as printed (tests/test_jobs_command.py: a script alone) --

def printed_command(text: str) -> list[str]:
    (line,) = [l.strip() for l in text.splitlines() if l.strip().startswith("hf jobs ")]
    return shlex.split(line)  # what a shell makes of the pasted line


def check_job(words: list[str], script: str) -> list[str]:
    """The checks every printed command must pass, `hf jobs ... --dry-run` reading it (the
    script's image, flavor, timeout, the token as a Job secret); returns the script's arguments.
    A local INPUT or OUTPUT is printed as the word INPUT or OUTPUT, and a note says what to do."""
    return check_hf_job(dry_run(words), script)


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_the_fail_fast_command_runs_as_printed(tmp_path, script):
    module = load_script(script)
    if script in OFFLINE_SCRIPTS and module.gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    write_image_folder(tmp_path / "scans", 1)
    extra = ["--server", nowhere(), "--api-key", KEY,
             "--serve-args", f"--hf-token {TOKEN} --max-num-seqs 8"] \
        if script in SERVER_SCRIPTS else ["--llm-kwargs", json.dumps({"hf_token": TOKEN, "seed": 1})]
    run = run_script(script, str(tmp_path / "scans"), str(tmp_path / "out"), "--hf-token", TOKEN,
                     "--work-dir", str(tmp_path / "w"), "--max-samples", "3", *extra,
                     env={**NO_VLLM, "ACCELERATOR": "gpu"}, timeout=60)
    assert run.returncode == 2, run.stderr
    no_secret(run.stderr)
    args = check_job(printed_command(run.stderr), script)
    assert args[:2] == ["INPUT", "OUTPUT"]
    assert args[2:4] == ["--max-samples", "3"]
    if script in SERVER_SCRIPTS:
        assert args[4:] == ["--serve-args", "--max-num-seqs 8"]
    else:
        assert args[4:] == ["--llm-kwargs", '{"seed": 1}']
    assert "* A Job cannot read INPUT on this machine: push it first (`hf upload" in run.stderr
    assert "give a Hub dataset id for OUTPUT" in run.stderr
    assert "ocr-jobs.py (beside this script)" in run.stderr and "--dry-run" in run.stderr
    if not module.IMAGE_HAS_UV:
        assert module.JOB_IMAGE in run.stderr.split("or locally:")[1]
        assert "install vLLM" not in run.stderr and "pip install vllm" not in run.stderr


@pytest.mark.parametrize("script", OFFLINE_SCRIPTS)
def test_a_json_key_that_starts_like_a_token_is_printed_as_given(script):
    """vLLM's `hf_overrides` (an LLM argument) starts as a Hub token does: the printed command
    keeps it (it printed `"***": ...`, which the Job's LLM() refuses)."""
    if load_script(script).gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    kwargs = json.dumps({"hf_overrides": {"architectures": ["Ovis2_5"]}, "seed": 1})
    run = run_script(script, "user/scans", "user/scans-ocr", "--llm-kwargs", kwargs,
                     env={**NO_VLLM, "ACCELERATOR": "gpu"}, timeout=60)
    assert run.returncode == 2, run.stderr
    args = check_job(printed_command(run.stderr), script)
    assert args == ["user/scans", "user/scans-ocr", "--llm-kwargs", kwargs]


def test_a_jobs_flavor_is_kept_and_a_hub_input_and_output_too():
    run = run_script(OVIS, "user/scans", "user/scans-ocr", "--server", nowhere(), "--split", "test",
                     env={**NO_VLLM, "JOB_FLAVOR": "a100-large", "ACCELERATOR": "gpu"}, timeout=60)
    assert run.returncode == 2, run.stderr
    config = dry_run(printed_command(run.stderr))
    assert config["flavor"].split()[0] == "a100-large"
    assert config["args"] == "user/scans user/scans-ocr --split test"
    assert "hf upload" not in run.stderr
    assert "covers an unknown number of pages (no rate was measured on a100-large" in run.stderr


def test_the_printed_command_has_the_arguments_given_in_their_order(tmp_path):
    """As argparse read them: `--option=value` and `--option value` alike, a default given again,
    a --no- flag, and an INPUT that starts like an option (given after `--`)."""
    if load_script("ovis-ocr2.py").gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    write_image_folder(tmp_path / "-scans", 1)
    run = run_script("ovis-ocr2.py", "--seed=7", "--split", "train", "--no-repetition-detection",
                     "--shuffle", "--", "-scans", str(tmp_path / "out"),
                     env={**NO_VLLM, "ACCELERATOR": "gpu"}, cwd=tmp_path, timeout=60)
    assert run.returncode == 2, run.stderr
    words = printed_command(run.stderr)
    assert words[words.index(str(ROOT / "ovis-ocr2.py")) + 1:] == [
        "INPUT", "OUTPUT", "--seed", "7", "--split", "train", "--no-repetition-detection",
        "--shuffle"]


def test_the_cards_reproduce_command_runs_as_printed(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--hf-token", TOKEN, "--serve-args", f"--api-key {KEY} --max-num-seqs 8",
                     env={"ACCELERATOR": "gpu"})
    assert run.returncode == 0, run.stderr
    card = (tmp_path / "out" / "README.md").read_text()
    block = card.split("Reproduce on Hugging Face Jobs:", 1)[1].split("```")[1]
    args = check_job(printed_command(block), OVIS)
    assert args == ["INPUT", "OUTPUT", "--serve-args", "--max-num-seqs 8"]
    assert "* A Job cannot read INPUT on this machine" in card and "* --timeout 4h" in card
    assert f"* Run it from the folder that holds {OVIS}, or give its URL" in card  # no local path
    no_secret(card, run.stderr, "".join(load_output(tmp_path / "out")["inference_info"]))
    info = json.loads(load_output(tmp_path / "out")["inference_info"][0])[0]
    assert "--api-key" in info["serve_args"] and "***" in info["serve_args"]


# ---- 3. the startup probe ------------------------------------------------------------------

@pytest.mark.parametrize("stub_args, driver_args, code, message", [
    (["--api-key", "right-key"], ["--api-key", "wrong-key"], 4, "refuses the API key (HTTP 401"),
    (["--api-key", "right-key"], [], 4, "it wants one: pass --api-key"),
    (["--foreign"], [], 2, "answers, but not as an OpenAI-compatible vLLM server"),
    (["--garbage"], [], 2, "answers, but not as an HTTP server"),
    ([], ["tls"], 2, "cannot connect to https://"),
])
def test_the_probe_names_what_answers_at_once(tmp_path, stub_server, stub_args, driver_args,
                                              code, message):
    stub = stub_server(*stub_args)
    url = stub.url.replace("http://", "https://") if driver_args == ["tls"] else stub.url
    write_image_folder(tmp_path / "in", 2)
    started = time.monotonic()
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", url,
                     *[a for a in driver_args if a != "tls"], timeout=60)
    assert run.returncode == code, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr
    assert "waiting" not in run.stderr
    assert time.monotonic() - started < 15
    assert not (tmp_path / "out").exists()  # nothing read, nothing created
    if not stub_args[:1] == ["--garbage"]:
        assert stub.requests() == []


@pytest.mark.parametrize("server, extra", [("http://notaurl.invalid:8000", []),
                                           ("http://notaurl.invalid:8000", ["--no-spawn"]),
                                           ("notaurl.invalid", [])])
def test_a_server_host_that_does_not_resolve_exits_2_at_once(tmp_path, monkeypatch, capsys,
                                                             server, extra):
    """It was waited for as a server that is starting, 30 minutes by default; a DNS failure
    that may pass (EAI_AGAIN) is still waited for."""
    import socket
    answer = {"error": socket.EAI_NONAME}
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host in ("notaurl.invalid", b"notaurl.invalid"):  # anyio passes it encoded
            raise socket.gaierror(answer["error"], "Name or service not known (injected)")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    write_image_folder(tmp_path / "in", 2)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", server, *extra,
            "--server-timeout", "3"]
    try:  # the process's exit code, whether main() returns it or raises it
        code = load_script(OVIS).main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot connect to http://notaurl.invalid" in err
    assert "(injected)" in err  # the answer given here, not this machine's DNS
    assert "waiting" not in err and not (tmp_path / "out").exists()
    answer["error"] = socket.EAI_AGAIN
    assert load_script(OVIS).main(argv) == 5
    err = capsys.readouterr().err
    assert "does not answer yet" in err and "will be waiting for that URL" in err
    assert "was not ready after 3 s" in err


def test_a_server_not_started_by_the_run_is_named_so_and_left_running(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url)
    assert run.returncode == 0, run.stderr
    assert f"already running at {stub.url}" in run.stderr
    assert "not started by this run; it will be left running" in run.stderr
    assert stub.process.poll() is None
    wait_port(stub.port, timeout=2)


# ---- 4. secrets ----------------------------------------------------------------------------

def test_redaction_covers_secret_flags_nested_flags_and_token_values():
    module = load_script(OVIS)
    argv = ["in", "out", "--hf-token", "plain", f"--api-key={KEY}", "--serve-args",
            f"--hf-token abc --api-key=def --seed {TOKEN} --max-num-seqs 8", "--llm-kwargs",
            json.dumps({"api_key": "abc", "n": 1}), "--max-tokens", "10", f"--model={TOKEN}"]
    out = module.redact_argv(argv)
    assert out[:5] == ["in", "out", "--hf-token", "***", "--api-key=***"]
    assert shlex.split(out[6]) == ["--hf-token", "***", "--api-key=***", "--seed", "***",
                                   "--max-num-seqs", "8"]
    assert json.loads(out[8]) == {"api_key": "***", "n": 1}
    assert out[9:] == ["--max-tokens", "10", "--model=***"]
    assert "plain" not in " ".join(out) and "def" not in out[6]


def test_the_spawned_server_gets_its_secrets_through_the_environment(tmp_path):
    port = free_port()
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ENV_LOG": str(tmp_path / "env.log")}
    write_image_folder(tmp_path / "in", 3)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--hf-token", TOKEN,
                     "--serve-args", f"--api-key {KEY} --max-num-seqs 8", env=env)
    assert run.returncode == 0, run.stderr  # the stub wants VLLM_API_KEY, the driver sent it
    (command,) = (tmp_path / "fake-vllm.log").read_text().splitlines()
    assert "--max-num-seqs 8" in command and "--api-key" not in command
    no_secret(command, run.stderr, (tmp_path / "out" / "README.md").read_text(),
              "".join(load_output(tmp_path / "out")["inference_info"]))
    assert (tmp_path / "env.log").read_text().split() == [f"HF_TOKEN={TOKEN}", f"VLLM_API_KEY={KEY}"]


S3 = "S3secretVALUE9f8e7d"  # secrets of no token-like shape: only their names tell
PASSWORD = "pw-nested-SECRET-42"
OTHER = ("hf_OTHERtokenABCDEF456", "sk-OTHERkeyABCDEF456", "S3otherVALUE1a2b3c", "pw-other-9")


def no_secret_recorded(folder: Path, *texts: str, secrets=(TOKEN, KEY, S3, PASSWORD)) -> None:
    """None of the secrets in OUTPUT (manifest, parts, card: every file, the rows'
    inference_info decoded) nor in the texts given (logs, --stats-json)."""
    info = "".join(load_output(folder)["inference_info"])
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in files) and "README.md" in {p.name for p in files}
    for secret in secrets:
        for path in files:
            assert secret.encode() not in path.read_bytes(), (secret, path)
        for text in (info, *texts):
            assert secret not in text, (secret, text)


def test_secrets_at_every_depth_of_serve_args_reach_the_server_and_no_record(tmp_path):
    """--hf-token, --api-key and JSON keys at any depth (model_loader_extra_config's S3 key,
    a dotted flag) were written to the manifest committed with OUTPUT, and nested ones to every
    row's inference_info and the card; a new token made the rerun "another run"."""
    port, stats = free_port(), tmp_path / "stats.json"
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ENV_LOG": str(tmp_path / "env.log"),
           "FAKE_VLLM_ARGV": str(tmp_path / "argv")}
    write_image_folder(tmp_path / "in", 3)

    def serve_args(token, key, s3, password):
        loader = json.dumps({"s3_secret_access_key": s3, "options": [{"password": password}]})
        return loader, shlex.join(["--hf-token", token, f"--api-key={key}", "--max-num-seqs", "8",
                                   "--model-loader-extra-config", loader,
                                   f"--model-loader-extra-config.aws_secret_access_key={s3}"])

    loader, serve = serve_args(TOKEN, KEY, S3, PASSWORD)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     f"http://127.0.0.1:{port}", "--serve-args", serve, "--max-samples", "2",
                     "--stats-json", str(stats), env=env)
    assert run.returncode == 0, run.stderr
    given = (tmp_path / "argv").read_bytes().decode().split("\0")
    assert loader in given and f"--model-loader-extra-config.aws_secret_access_key={S3}" in given
    assert (tmp_path / "env.log").read_text().split() == [f"HF_TOKEN={TOKEN}",
                                                          f"VLLM_API_KEY={KEY}"]
    no_secret_recorded(tmp_path / "out", run.stdout, run.stderr, stats.read_text())
    info = json.loads(load_output(tmp_path / "out")["inference_info"][0])[0]["serve_args"]
    assert json.loads(info[info.index("--model-loader-extra-config") + 1]) == {
        "s3_secret_access_key": "***", "options": [{"password": "***"}]}

    loader, serve = serve_args(*OTHER)  # other secrets: the same run, its third row done
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     f"http://127.0.0.1:{port}", "--serve-args", serve, env=env)
    assert run.returncode == 0, run.stderr
    assert len(load_output(tmp_path / "out")) == 3
    no_secret_recorded(tmp_path / "out", run.stdout, run.stderr, secrets=OTHER)


@pytest.mark.parametrize("json_text", [f'{{"hf_token": "{S3}"}}', f'{{"hf_token":"{S3}"}}',
                                       f'={{"s3_secret_access_key":"{S3}","region":"eu"}}'])
def test_json_in_serve_args_the_shell_unquoted_is_refused_unshown(tmp_path, stub_server,
                                                                  json_text):
    """--serve-args '--hf-overrides {"hf_token": "..."}' in one pair of quotes: the split drops
    the inner quotes (vLLM would refuse it), and `{hf_token:` `S3...}` reached the card, the
    manifest and every row of a run against a server already up. Refused before anything; so is
    --serve-args '--flag={"s3_secret_access_key":"..."}' (found by the same split)."""
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     stub_server().url, "--no-spawn",
                     "--serve-args", f"--hf-overrides{' ' * (json_text[0] != '=')}{json_text} "
                     f"--max-num-seqs 8", env=NO_VLLM)
    assert run.returncode == 2, run.stderr
    assert "the value of --hf-overrides is not JSON (the shell took its quotes)" in run.stderr
    assert S3 not in run.stderr + run.stdout
    assert not (tmp_path / "out").exists() and "Traceback" not in run.stderr
    fixed = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                       stub_server().url, "--check-only", "--serve-args",
                       f'--hf-overrides "{json_text.lstrip("=").replace(chr(34), chr(92) + chr(34))}"',
                       env=NO_VLLM)  # quoted twice, as the refusal says
    assert fixed.returncode == 0, fixed.stderr


def test_secrets_at_every_depth_of_llm_kwargs_reach_the_engine_and_no_record(tmp_path):
    env = {"PYTHONPATH": str(ROOT / "tests" / "fake_vllm_pkg"),
           "FAKE_VLLM_CALLS": str(tmp_path / "calls.jsonl")}
    write_image_folder(tmp_path / "in", 3)

    def llm_kwargs(token, s3, password):
        return json.dumps({"hf_token": token, "seed": 1, "model_loader_extra_config": {
            "s3_secret_access_key": s3, "options": [{"password": password}]}})

    stats = tmp_path / "stats.json"
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"), "--llm-kwargs",
                     llm_kwargs(TOKEN, S3, PASSWORD), "--max-samples", "2", "--stats-json",
                     str(stats), env=env)
    assert run.returncode == 0, run.stderr
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    (engine,) = [c["kwargs"] for c in calls if c["call"] == "LLM"]
    assert engine["hf_token"] == TOKEN and engine["model_loader_extra_config"] == {
        "s3_secret_access_key": S3, "options": [{"password": PASSWORD}]}
    no_secret_recorded(tmp_path / "out", run.stdout, run.stderr, stats.read_text())
    info = json.loads(load_output(tmp_path / "out")["inference_info"][0])[0]["llm_kwargs"]
    assert info["model_loader_extra_config"] == {"s3_secret_access_key": "***",
                                                 "options": [{"password": "***"}]}
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"), "--llm-kwargs",
                     llm_kwargs(OTHER[0], OTHER[2], OTHER[3]), env=env)
    assert run.returncode == 0, run.stderr  # other secrets: the same run
    assert len(load_output(tmp_path / "out")) == 3
    no_secret_recorded(tmp_path / "out", run.stdout, run.stderr, secrets=OTHER)


def test_an_older_manifest_holding_a_secret_is_refused_unprinted_and_restart_drops_it(
        tmp_path, stub_server):
    """An OUTPUT an older version wrote, with a token in its identity: the rerun is refused in
    one line (the older-outputs rule) without printing the token; --restart writes a manifest
    without it."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    base = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url]
    assert run_script(OVIS, *base, "--max-samples", "2").returncode == 0
    manifest = tmp_path / "out" / ".ocr" / "manifest.json"
    earlier = json.loads(manifest.read_text())
    earlier.pop("format")
    earlier["identity"]["engine"]["hf-token"] = TOKEN
    manifest.write_text(json.dumps(earlier))
    run = run_script(OVIS, *base)
    assert run.returncode == 2 and "older version" in run.stderr, run.stderr
    assert TOKEN not in run.stderr + run.stdout
    run = run_script(OVIS, *base, "--restart")
    assert run.returncode == 0, run.stderr
    assert len(load_output(tmp_path / "out")) == 3 and TOKEN not in manifest.read_text()


def test_the_server_logs_tail_printed_on_a_failed_start_masks_named_secrets(tmp_path):
    """A server that fails to start: the last lines of its log, which name its arguments, are
    printed with the secrets named in them masked."""
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ECHO_AND_EXIT": "1"}
    write_image_folder(tmp_path / "in", 2)
    loader = json.dumps({"bucket": "scans", "s3_secret_access_key": S3})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     f"http://127.0.0.1:{free_port()}", "--serve-args",
                     shlex.join(["--model-loader-extra-config", loader]), env=env, timeout=120)
    assert run.returncode != 0 and "non-default args" in run.stderr, run.stderr
    assert '{"bucket": "scans", "s3_secret_access_key": "***"}' in run.stderr
    assert S3 not in run.stderr + run.stdout


def test_a_server_log_that_cannot_be_written_never_blocks_the_server():
    """The driver relays vLLM's output (through its watchdog) to its log, masking secrets; a log
    on a full disk (/dev/full: every write fails) killed the relay, the pipe filled and vLLM
    blocked on its own logging. Here a 'server' prints 20 MB, then exits 7: the watchdog ends
    with its code, and the relay at its end."""
    script = load_script(OVIS)
    talker = "import sys\nfor _ in range(200_000): print('x' * 100)\nsys.exit(7)"
    watchdog = subprocess.Popen([sys.executable, "-c", script.SERVER_WATCHDOG, sys.executable,
                                 "-c", talker], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    relay = threading.Thread(target=script.relay_log, args=(
        watchdog.stdout, open("/dev/full", "ab", buffering=0), {"s3cr3t"}))
    relay.start()
    assert watchdog.wait(timeout=60) == 7
    relay.join(timeout=60)
    assert not relay.is_alive()


def test_a_secret_the_server_prints_from_its_serve_args_never_reaches_its_log(tmp_path):
    """vLLM logs its non-default args. The server's log masked only the secrets found by value
    (under a secret's name, token-like): a URL's password and a presigned URL's signature given
    in --serve-args reached OUTPUT/.ocr/logs as given (the printed lines were masked)."""
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ECHO_AND_EXIT": "1"}
    write_image_folder(tmp_path / "in", 2)
    url = "https://reader:pw-SECRET-9@files.example/t.jinja?X-Amz-Signature=SIG0123456789abc"
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     f"http://127.0.0.1:{free_port()}", "--serve-args",
                     shlex.join(["--chat-template", url]), env=env, timeout=120)
    assert run.returncode != 0 and "non-default args" in run.stderr, run.stderr
    (log_file,) = (tmp_path / "out" / ".ocr" / "logs").iterdir()
    assert "--chat-template https://***@files.example/" in log_file.read_text()
    for text in (run.stderr + run.stdout, log_file.read_text()):
        assert "pw-SECRET-9" not in text and "SIG0123456789abc" not in text, text


def test_the_server_log_in_output_and_its_tail_mask_nested_secrets_with_spaces(tmp_path):
    """vLLM logs its non-default args, a secret nested in --hf-overrides among them: the log it
    writes into OUTPUT/.ocr/logs had the secret as given, and the printed tail the words of a
    quoted value after its first (only "pw" masked)."""
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ECHO_AND_EXIT": "1"}
    write_image_folder(tmp_path / "in", 2)
    overrides = json.dumps({"auth": {"password": "pw nested SECRET 42", "client_secret": S3}})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     f"http://127.0.0.1:{free_port()}", "--serve-args",
                     shlex.join(["--hf-overrides", overrides]), env=env, timeout=120)
    assert run.returncode != 0 and '"password":"***"' in run.stderr.replace(" ", ""), run.stderr
    (log_file,) = (tmp_path / "out" / ".ocr" / "logs").iterdir()
    assert "non-default args" in log_file.read_text() and "--hf-overrides" in log_file.read_text()
    for text in (run.stderr + run.stdout, log_file.read_text()):
        assert "nested SECRET 42" not in text and S3 not in text, text


def test_a_server_url_with_a_password_is_refused_pointing_to_the_api_key(tmp_path, stub_server):
    """httpx sent the URL's user and password as Basic auth in place of the API key (a 401
    blamed on the key), and the logs printed the password."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     stub.url.replace("http://", f"http://user:{PASSWORD}@"), timeout=60)
    assert run.returncode == 2, run.stderr
    assert "holds a user or password" in run.stderr and "--api-key" in run.stderr
    assert PASSWORD not in run.stderr + run.stdout and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists() and stub.requests() == []


@pytest.mark.parametrize("where", ["INPUT", "OUTPUT"])
def test_a_secret_in_an_input_or_output_url_is_masked_in_the_error(tmp_path, where):
    url = f"https://user:{PASSWORD}@example.com/scans.parquet?page=2&token={S3}&sig={KEY}"
    write_image_folder(tmp_path / "in", 1)
    where_args = [url, str(tmp_path / "out")] if where == "INPUT" else [str(tmp_path / "in"), url]
    run = run_script(OVIS, *where_args, "--server", nowhere(), "--no-spawn", "--server-timeout",
                     "1", env={**NO_VLLM, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"{where} 'https://***@example.com/scans.parquet?page=2&token=***&sig=***'" \
        in run.stderr
    for secret in (PASSWORD, S3, KEY):
        assert secret not in run.stderr + run.stdout


def test_a_secret_first_in_a_url_query_is_masked_in_the_error(tmp_path):
    """The query's first parameter, right after the URL's scheme and path, is masked too."""
    url = f"https://example.com/scans.parquet?token={S3}"
    run = run_script(OVIS, url, str(tmp_path / "out"), "--server", nowhere(), "--no-spawn",
                     env={**NO_VLLM, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "https://example.com/scans.parquet?token=***" in run.stderr
    assert S3 not in run.stderr + run.stdout


def test_a_model_repo_whose_name_looks_like_a_token_is_no_secret(tmp_path):
    """`--model acme/sk-ocr-finetune-v2` was masked as a token: the launcher refused the run
    ("--model holds a secret") and the record named the model acme/***."""
    write_image_folder(tmp_path / "in", 1)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--check-only",
                     "--model", "acme/sk-ocr-finetune-v2", "--server", nowhere(), "--no-spawn",
                     env={**NO_VLLM, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert run.returncode == 0, run.stderr
    assert without_run(json.loads(run.stdout.splitlines()[-1])) == {"rows": 1}


@pytest.mark.parametrize("serve_args", [["--serve-args", "--enforce-eager"],
                                        ["--serve-args", "--max-model-len=32768"],
                                        ["--serve-args=--enforce-eager"]])
def test_serve_args_of_one_flag_need_no_equals_sign(tmp_path, serve_args):
    """`--serve-args "--enforce-eager"` (one flag, no space) was refused by argparse ("expected
    one argument", and the whole usage); it is the value, as with a space or `=`."""
    write_image_folder(tmp_path / "in", 1)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *serve_args,
                     "--check-only", "--server", nowhere(), "--no-spawn",
                     env={**NO_VLLM, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert run.returncode == 0, run.stderr
    assert without_run(json.loads(run.stdout.splitlines()[-1])) == {"rows": 1}
    offline = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"),
                         *serve_args, "--check-only", env=NO_VLLM, timeout=60)
    assert offline.returncode == 2  # no --serve-args offline: said as the user wrote it
    assert f"unrecognized arguments: {' '.join(serve_args)}" in offline.stderr, offline.stderr


# ---- 5. the spawned server dies with the driver --------------------------------------------

def stub_processes(port: int) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        words = proc.info["cmdline"] or []
        if any(w.endswith("stub_server.py") for w in words) and str(port) in words:
            found.append(proc)
    return found


def test_a_driver_killed_with_sigkill_takes_its_server_and_the_servers_children_along(tmp_path):
    port = free_port()
    env = {**os.environ, **fake_vllm_env(tmp_path, stub_args="--latency 0.5")}
    write_image_folder(tmp_path / "in", 40)
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(tmp_path / "out"),
         "--server", f"http://127.0.0.1:{port}", "--concurrency", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, timeout=60)
        assert stub_processes(port)  # the fake `vllm` (bash) runs the stub as its child
        driver.kill()
        driver.wait(timeout=10)
        deadline = time.monotonic() + 15
        while stub_processes(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not stub_processes(port), "the server outlived its driver"
        with pytest.raises(TimeoutError):
            wait_port(port, timeout=0.5)
    finally:
        for proc in stub_processes(port):
            proc.kill()


# ---- 6. --server with a path ---------------------------------------------------------------

@pytest.mark.parametrize("url, base", [
    ("http://host:9000", "http://host:9000"),
    ("http://host:9000/", "http://host:9000"),
    ("http://host:9000/v1", "http://host:9000"),
    ("https://proxy.example/team/ocr", "https://proxy.example/team/ocr"),
    ("https://proxy.example/team/ocr/v1/", "https://proxy.example/team/ocr"),
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
])
def test_server_urls_keep_their_path_prefix(url, base):
    assert load_script(OVIS).server_url_parts(url)[0] == base


@pytest.mark.parametrize("suffix", ["/proxy", "/proxy/v1"])
def test_a_server_behind_a_path_prefix_is_used(tmp_path, stub_server, suffix):
    stub = stub_server("--path-prefix", "/proxy")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server",
                     stub.url + suffix)
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out").num_rows == 2 and len(stub.requests()) == 2


def dry_run(words: list[str]) -> dict:
    """`hf jobs ... --dry-run` of a printed command: the Job configuration it would submit."""
    assert words[:2] == ["hf", "jobs"]
    at = 4 if words[2] == "uv" else 3
    run = subprocess.run([str(HF), *words[1:at], "--dry-run", *words[at:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Job not submitted" in run.stdout
    config, key = {}, None
    for line in run.stdout.splitlines():
        match = re.match(r"^  (\S+)?\s+(.*)$", line)
        if match:
            key = match.group(1) or key
            config.setdefault(key, []).append(match.group(2))
    return {k: "\n".join(v) for k, v in config.items()}


def check_hf_job(config: dict, script: str) -> list[str]:
    """The checks the registry's `hf jobs run` command must pass; returns the script's arguments."""
    entry, module = REGISTRY[script], load_script(script)
    assert config["image"] == entry["image"]
    assert config["flavor"].split()[0] == entry["flavor"]
    assert config["timeout"].split()[0] == entry["timeout"]
    assert config["secrets"].startswith("HF_TOKEN=")
    if module.IMAGE_HAS_UV:
        assert Path(config["script"]).name == script  # as run: relative to the folder run from
        args = shlex.split(config["args"])
    else:
        assert config["env"] == f"SCRIPT_URL=<raw URL of {script}>"
        inner = shlex.split(config["command"])
        assert inner[:2] == ["bash", "-lc"]
        assert inner[2].startswith('pip install -q uv && uv run "$SCRIPT_URL" ')
        args = shlex.split(inner[2].split('"$SCRIPT_URL" ', 1)[1])
    for word in args:
        assert word not in ("--server", "--hf-token", "--api-key", "--work-dir", "--no-spawn")
        assert str(ROOT) not in word and "/tmp" not in word
    no_secret(*config.values())
    return args


def test_the_registrys_hpd_command_runs_as_printed():
    """HPD-Parsing's image has no uv: models.json's `hf jobs run` command, checked through
    `hf jobs run --dry-run`."""
    entry = REGISTRY["hpd-parsing-saturate.py"]
    words = shlex.split(entry["run_command"].replace("INPUT OUTPUT", "user/in user/out"))
    args = check_hf_job(dry_run(words), "hpd-parsing-saturate.py")
    assert args == ["user/in", "user/out"]


# ---- 7. --check-only (issue 31): the run's checks, nothing written -------------------------

def checked(run: subprocess.CompletedProcess) -> dict:
    """The check's answer, as ocr-jobs.py reads it: the last stdout line, JSON."""
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def every_file(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")}


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_check_only_counts_the_rows_and_leaves_a_new_output_absent(tmp_path, script):
    """No vllm and no server here: the check neither needs nor looks for one."""
    write_image_folder(tmp_path / "in", 5)
    out, stats = tmp_path / "out", tmp_path / "stats.json"
    server = ["--server", nowhere()] if script in SERVER_SCRIPTS else []
    run = run_script(script, str(tmp_path / "in"), str(out), *server, "--check-only",
                     "--stats-json", str(stats), env=NO_VLLM, timeout=120)
    answer = checked(run)
    assert answer == {"rows": 5, "run": answer["run"]} and len(answer["run"]) == 16
    assert "check passed: 5 rows" in run.stderr and "ocr-jobs.py" not in run.stderr
    assert not out.exists() and not stats.exists()
    run = run_script(script, str(tmp_path / "in"), str(out), *server, "--check-only",
                     "--max-samples", "3", env=NO_VLLM, timeout=120)
    assert checked(run)["rows"] == 3 and not out.exists()


def test_check_only_says_the_runs_identity_however_its_flags_are_spelled(tmp_path):
    """Issue #41 item 3: ocr-jobs.py labels a run's Jobs with the digest the check prints, what
    OUTPUT's manifest compares: the same for flags spelled or ordered otherwise, or an option
    that may change within a run (--server), and another for another value."""
    write_image_folder(tmp_path / "in", 3)

    def digest(*flags: str) -> str:
        run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--check-only",
                         *flags, env=NO_VLLM, timeout=120)
        return checked(run)["run"]

    same = digest("--max-tokens", "900", "--no-sanity-check", "--server", nowhere())
    assert digest("--no-sanity-check", "--max-tokens=900", "--server", nowhere()) == same
    assert digest("--max-tokens", "901", "--no-sanity-check", "--server", nowhere()) != same


def test_check_only_counts_pdf_pages(tmp_path):
    from pdfs import Page, make_pdf

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(make_pdf([Page(), Page(), Page()]))
    (tmp_path / "in" / "b.pdf").write_bytes(make_pdf([Page(), Page()]))
    out = tmp_path / "out"

    def rows(*extra: str) -> int:
        return checked(run_script(OVIS, str(tmp_path / "in"), str(out), "--server", nowhere(),
                                  "--check-only", *extra, env=NO_VLLM, timeout=120))["rows"]

    assert rows() == 5  # every page a row
    assert rows("--max-samples", "1") == 3  # the first document's pages
    assert rows("--pages", "1-2") == 4
    assert rows("--per-document") == 2
    assert not out.exists()


def test_check_only_gives_the_rerun_refusal_and_touches_nothing(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    out = tmp_path / "out"
    first = run_script(OVIS, str(tmp_path / "in"), str(out), "--server", stub.url)
    assert first.returncode == 0, first.stderr
    before = every_file(out)
    other = run_script(OVIS, str(tmp_path / "in"), str(out), "--server", nowhere(),
                       "--check-only", "--max-tokens", "900", env=NO_VLLM, timeout=120)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "holds another run" in other.stderr and "--max-tokens: was" in other.stderr
    same = run_script(OVIS, str(tmp_path / "in"), str(out), "--server", nowhere(),
                      "--check-only", env=NO_VLLM, timeout=120)
    assert without_run(checked(same)) == {"rows": 3}
    assert every_file(out) == before and len(stub.requests()) == 3


def test_check_only_gives_the_refusal_of_a_shard_that_is_being_written(tmp_path, stub_server):
    """The run would stop at once (another process holds the shard's lock): so does the check,
    which passed before. Nothing is written, and the lock's note is left as it is."""
    import fcntl

    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    out = tmp_path / "out"
    assert run_script(OVIS, str(tmp_path / "in"), str(out), "--server", stub.url).returncode == 0
    lock = out / ".ocr" / "lock-shard-0-of-1"
    with open(lock, "a+") as held:  # a run writing this shard right now
        held.write("pid 1 on elsewhere")
        held.flush()
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = every_file(out)
        run = run_script(OVIS, str(tmp_path / "in"), str(out), "--server", nowhere(),
                         "--check-only", env=NO_VLLM, timeout=120)
        assert run.returncode == 2, run.stderr
        assert "is writing this shard" in run.stderr and "Traceback" not in run.stderr
        assert every_file(out) == before
    assert without_run(checked(run_script(OVIS, str(tmp_path / "in"), str(out), "--server",
                                          nowhere(), "--check-only", env=NO_VLLM,
                                          timeout=120))) == {"rows": 3}
    assert every_file(out) == before


def test_check_only_of_a_hub_output_creates_and_commits_nothing(tmp_path, capsys):
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    from conftest import FakeHub

    class Hub(FakeHub):  # as the Hub answers for a repo not created yet
        def list_repo_files(self, repo_id, **kwargs):
            if not (self.root / repo_id).exists():
                url = f"https://huggingface.co/api/datasets/{repo_id}"
                raise RepositoryNotFoundError(f"404 Client Error: {repo_id} not found",
                                              response=httpx.Response(
                                                  404, request=httpx.Request("GET", url)))
            return super().list_repo_files(repo_id, **kwargs)

    write_image_folder(tmp_path / "in", 4)
    module, hub = load_script(OVIS), Hub(tmp_path / "hub")
    work = tmp_path / "work"

    def check(*extra: str) -> int:
        return module.main([str(tmp_path / "in"), "user/ocr-out", "--server", nowhere(),
                            "--work-dir", str(work), "--check-only", *extra], hub_api=hub)

    assert check() == 0
    assert not any(call[0] == "create_repo" for call in hub.calls) and hub.commits == []
    assert not work.exists() and not (tmp_path / "hub" / "user/ocr-out").exists()
    # a repo that holds another run: the refusal a Job would give, still nothing written
    repo = tmp_path / "hub" / "user/ocr-out"
    (repo / ".ocr").mkdir(parents=True)
    (repo / ".ocr" / "manifest.json").write_text(json.dumps({"format": 0}))
    with pytest.raises(SystemExit) as refused:
        check()
    assert refused.value.code == 2 and hub.commits == [] and not work.exists()
    assert "written by an older version of this script" in capsys.readouterr().err
