"""Issue 41, item 5: the Jobs command a script prints runs as printed. A script copied alone to
an empty folder, or run by URL, without vllm prints the `hf jobs uv run --image ... SCRIPT INPUT
OUTPUT` command (HPD-Parsing: its docstring's `hf jobs run` form, its image having no uv),
complete as its header and docstring give it, with the user's options and no secret; it speaks
of ocr-jobs.py only when the launcher is beside it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from conftest import ALL_SCRIPTS, ROOT, SERVER_SCRIPTS, free_port, load_script

REGISTRY = {e["script"]: e for e in json.loads((ROOT / "models.json").read_text())["scripts"]}
TOKEN = "hf_SECRETtokenABCDEF123"
HF = Path(sys.executable).parent / "hf"
NO_VLLM = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "", "ACCELERATOR": "gpu"}


def user_flags(script: str) -> list[str]:
    """Options a user gives, as the Job must get them (after --hf-token, which it must not)."""
    shape = ["--serve-args", "--max-num-seqs 8"] if script in SERVER_SCRIPTS else \
        ["--llm-kwargs", '{"seed": 1}']
    return ["--max-samples", "3", "--split", "test", *shape]


def run_without_vllm(script_path: str, cwd: Path, script: str, python_prefix=()) -> str:
    """The script run as `python SCRIPT_PATH user/scans user/scans-ocr --hf-token ... [flags]`
    from cwd, with no vllm anywhere (nor a server) and this machine's options (--server,
    --work-dir...): its stderr; it must exit 2 at once."""
    server = ["--server", f"http://127.0.0.1:{free_port()}"] if script in SERVER_SCRIPTS else []
    # this machine's options, which a Job's command leaves out (option(..., this_machine=True))
    server += ["--work-dir", str(cwd / "staging"), "--stats-json", str(cwd / "stats.json"),
               "--restart"]
    run = subprocess.run([*python_prefix, sys.executable, script_path, "user/scans",
                          "user/scans-ocr", "--hf-token", TOKEN, *user_flags(script), *server],
                         cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, **NO_VLLM})
    assert run.returncode == 2, run.stderr
    assert TOKEN not in run.stderr and "Traceback" not in run.stderr
    return run.stderr


def printed_command(text: str) -> list[str]:
    """The Jobs command printed, as a shell splits the pasted line."""
    (line,) = [line.strip() for line in text.splitlines() if line.strip().startswith("hf jobs ")]
    return shlex.split(line)


def header_jobs(script: str) -> dict:
    """The script's [tool.hf-jobs] table (what `hf jobs uv run` reads); {} when it has none."""
    block = re.search(r"^# /// script\n(.*?)^# ///$", (ROOT / script).read_text(), re.S | re.M)
    meta = tomllib.loads("".join(line[2:] if line.startswith("# ") else line[1:]
                                 for line in block.group(1).splitlines(keepends=True)))
    return meta.get("tool", {}).get("hf-jobs", {})


def options_of(words: list[str], names=("--image", "--flavor", "--timeout", "--secrets", "--env")
               ) -> tuple[dict, list[str]]:
    """`hf jobs` options (name -> values, in order) and the words after them."""
    options: dict = {}
    while words and words[0] in names:
        options.setdefault(words[0], []).append(words[1])
        words = words[2:]
    return options, words


def hf_dry_run(words: list[str], cwd: Path, offline: bool = True) -> str:
    """`hf jobs ... --dry-run` of the printed command, from the folder it was printed in."""
    at = 4 if words[2] == "uv" else 3
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}
    env.pop("HF_HUB_OFFLINE", None)
    run = subprocess.run([str(HF), *words[1:at], "--dry-run", *words[at:]], cwd=cwd,
                         capture_output=True, text=True, timeout=120,
                         env={**env, **({"HF_HUB_OFFLINE": "1"} if offline else {})})
    assert run.returncode == 0 and "Job not submitted" in run.stdout, run.stdout + run.stderr
    return run.stdout


def check_uv_command(words: list[str], script: str, where: str, cwd: Path,
                     ask_hf: bool = False) -> None:
    """What `hf jobs uv run` expects: the header's image, flavor, timeout and secrets, then the
    script (a file there from cwd, or a URL), INPUT, OUTPUT and the user's options; ask_hf:
    `hf jobs uv run --dry-run` reads it so too (it fetches a URL's script)."""
    assert words[:4] == ["hf", "jobs", "uv", "run"], words
    options, rest = options_of(words[4:])
    jobs, entry = header_jobs(script), REGISTRY[script]
    assert options == {"--image": [entry["image"]], "--flavor": [jobs["flavor"]],
                       "--timeout": [jobs["timeout"]], "--secrets": jobs["secrets"]}, options
    assert rest[0] == where and rest[1:] == ["user/scans", "user/scans-ocr", *user_flags(script)]
    if not ask_hf:
        return
    said = hf_dry_run(words, cwd, offline=not where.startswith("http"))
    assert re.search(rf"^  script\s+{re.escape(where)}$", said, re.M), said
    assert re.search(rf"^  image\s+{re.escape(entry['image'])}$", said, re.M), said
    assert re.search(rf"^  timeout\s+{jobs['timeout']}$", said, re.M), said


def check_hpd_command(words: list[str], script: str, url: str | None) -> None:
    """HPD-Parsing's form, as its docstring gives it: uv installed first, the script by URL."""
    assert words[:3] == ["hf", "jobs", "run"], words
    options, rest = options_of(words[3:])
    entry = REGISTRY[script]
    assert options == {"--flavor": [entry["flavor"]], "--timeout": [entry["timeout"]],
                       "--secrets": ["HF_TOKEN"],
                       "--env": [f"SCRIPT_URL={url or f'<raw URL of {script}>'}"]}, options
    assert rest[:4] == [entry["image"], "--", "bash", "-lc"] and len(rest) == 5, rest
    head = 'pip install -q uv && uv run "$SCRIPT_URL" '
    assert rest[4].startswith(head)
    assert shlex.split(rest[4][len(head):]) == ["user/scans", "user/scans-ocr", *user_flags(script)]
    doc = load_script(script).__doc__.replace("\\\n", " ")
    assert f"hf jobs run --flavor {entry['flavor']} --timeout {entry['timeout']} " \
           f"--secrets HF_TOKEN" in re.sub(r"\s+", " ", doc)


def check_notes(text: str, script: str) -> None:
    """The timeout says what it covers, in the docstring's own figure where one was measured."""
    module, timeout = load_script(script), REGISTRY[script]["timeout"]
    note = next(line for line in text.splitlines() if line.startswith(f"* --timeout {timeout}"))
    if module.JOB_PAGES_PER_S:
        pages = re.search(r"covers about ([\d,]+) pages", note).group(1)
        assert f"--timeout {timeout} covers about {pages} pages" in module.__doc__
    else:
        assert "no rate was measured" in note


def copied_alone(tmp_path: Path, script: str, *beside: str) -> Path:
    folder = tmp_path / "alone"
    folder.mkdir()
    for name in (script, *beside):
        shutil.copy(ROOT / name, folder / name)
    return folder


def check_local_command(said: str, script: str, where: str, cwd: Path) -> None:
    """The printed command of a script run from a file: SCRIPT is `where`, a file from cwd."""
    words = printed_command(said)
    if load_script(script).IMAGE_HAS_UV:
        assert (cwd / where).is_file()
        check_uv_command(words, script, where, cwd)
    else:  # the image has no uv: the Job fetches the script by a URL the user fills in
        check_hpd_command(words, script, None)
        assert f"put the raw URL of {script} in place of <raw URL of {script}>" in said
    check_notes(said, script)


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_alone_prints_a_jobs_command_that_runs_from_there(tmp_path, script):
    """Copied alone to an empty folder and run from it (by its full path): the command names
    the script by its path from there, and no launcher, since none is there."""
    if script not in SERVER_SCRIPTS and load_script(script).gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    folder = copied_alone(tmp_path, script)
    said = run_without_vllm(str(folder / script), folder, script)
    check_local_command(said, script, script, folder)
    assert "ocr-jobs.py" not in said


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_the_launcher_is_named_when_it_is_beside_the_script(tmp_path, script):
    """Run from another folder by a relative path, with ocr-jobs.py beside it: both the command
    and the launcher's name paths that exist from where it was run."""
    if script not in SERVER_SCRIPTS and load_script(script).gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    copied_alone(tmp_path, script, "ocr-jobs.py")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    said = run_without_vllm(f"../alone/{script}", cwd, script)
    check_local_command(said, script, f"../alone/{script}", cwd)
    launch = shlex.split(re.search(r"`(uv run [^`]*ocr-jobs\.py[^`]*)`", said).group(1))
    assert launch[:4] == ["uv", "run", "../alone/ocr-jobs.py", f"../alone/{script}"]
    assert (cwd / launch[2]).is_file() and launch[4:8] == ["INPUT", "OUTPUT", "--shards", "N"]


def served(folder: Path):
    """A static HTTP server of folder (the script's URL), stopped by the caller."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_run_by_url_prints_its_url(tmp_path, script):
    """`uv run URL` runs a temp copy (<stem> and 6 random characters, in the temp folder) as a
    child of uv, whose command line holds the URL: the command names the URL, fetchable, and
    no launcher (nothing is beside a URL)."""
    if script not in SERVER_SCRIPTS and load_script(script).gpu_visible():
        pytest.skip("a GPU is visible: the offline script would run")
    server = served(copied_alone(tmp_path, script, "ocr-jobs.py"))
    url = f"http://127.0.0.1:{server.server_address[1]}/{script}"
    copy = Path(tempfile.gettempdir()) / f"{script[:-3]}Xq3Zk{len(script) % 10}.py"
    try:
        copy.write_bytes((ROOT / script).read_bytes())
        uv = [sys.executable, "-c", "import subprocess, sys; "
              "sys.exit(subprocess.run(sys.argv[2:]).returncode)", url]  # uv's place
        said = run_without_vllm(str(copy), tmp_path, script, python_prefix=uv)
        words = printed_command(said)
        if load_script(script).IMAGE_HAS_UV:
            check_uv_command(words, script, url, tmp_path, ask_hf=True)
        else:
            check_hpd_command(words, script, url)
            assert "raw URL" not in said
        assert "ocr-jobs.py" not in said and str(copy) not in said
    finally:
        copy.unlink(missing_ok=True)
        server.shutdown()
