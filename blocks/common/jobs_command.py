"""The Hugging Face Jobs command that runs this script, printed or in the card."""

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from blocks.common.arguments import _RUN_ARGV, _THIS_MACHINE, was_given
from blocks.common.inputs import REPO_ID, script_name
from blocks.common.model_options import IMAGE_HAS_UV, JOB_PAGES_PER_S
from blocks.common.secrets import flag_items, redact_argv, redact_text
from blocks.model import JOB_IMAGE

def rerun_advice() -> str:
    """How to finish a run that has written rows: the same command, but not --restart."""
    return "rerun the same command" + (" without --restart (with it, the run starts over)"
                                       if was_given("restart") else "")


def jobs_spec() -> dict:
    """Jobs image, flavor, timeout, secrets: the header's [tool.hf-jobs], else its `hf jobs run`."""
    text = ""
    with contextlib.suppress(OSError, NameError):
        text = Path(__file__).read_text(encoding="utf-8")
    header = re.search(r"^# /// script$(.*?)^# ///$", text, re.M | re.S)
    table = header and re.search(r"^# \[tool\.hf-jobs\]$(.*?)(?=^# \[|\Z)", header[1], re.M | re.S)
    spec = {"image": JOB_IMAGE, "secrets": ["HF_TOKEN"]}
    if table:  # TOML strings and string lists, as JSON reads them
        spec.update({key: json.loads(value) for key, value in
                     re.findall(r"^# ([\w-]+) = (.+)$", table[1], re.M)})
    elif command := re.search(r"^\s*hf jobs run (.*)$", (__doc__ or "").replace("\\\n", " "), re.M):
        for name, values, _ in flag_items(shlex.split(command[1].split(" -- ")[0])):
            if name in ("--flavor", "--timeout", "--secrets") and values:
                spec[name[2:]] = values[:1] if name == "--secrets" else values[0]
    return spec


def script_url() -> str | None:
    """The URL of `uv run URL` when this is uv's temp copy (uv still holds it), unless secret."""
    if script_name() == Path(sys.argv[0]).name:
        return None
    words: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = Path(f"/proc/{os.getppid()}/cmdline")
        words = proc.read_bytes().decode(errors="replace").split("\0") if proc.exists() else \
            subprocess.run(["ps", "-o", "command=", "-p", str(os.getppid())], capture_output=True,
                           text=True, timeout=5).stdout.split()
    return next((word for word in words if re.match(r"https?://", word) and redact_text(word) ==
                 word and word.split("?")[0].endswith("/" + script_name())), None)


def script_reference(in_card: bool = False) -> str:
    """The script as a Jobs command names it: its URL, else its path as run (relative if inside)."""
    path = Path(sys.argv[0])
    if (url := script_url()) or in_card:
        return url or script_name()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd()) if path.is_absolute() else path
    return str(path)


def job_arguments(argv: list[str] | None = None) -> list[str]:
    """This run's arguments for a Job: secrets and this machine's options dropped."""
    places, options = [], []
    for name, values, _ in flag_items(redact_argv(_RUN_ARGV if argv is None else argv, None)):
        if name is None:  # INPUT, OUTPUT
            hub = REPO_ID.match(values[0]) and not Path(values[0]).expanduser().exists()
            places.append(values[0] if hub else ("INPUT", "OUTPUT")[len(places) % 2])
        elif values != [""] and name not in _THIS_MACHINE:
            options += [name, *values]
    return places + options


def jobs_command(argv: list[str] | None = None, in_card: bool = False) -> str:
    """This run as one Hugging Face Job (jobs_spec()'s image, flavor...; the token a Job secret)."""
    spec, script = jobs_spec(), script_reference(in_card)
    head = [word for key in ("flavor", "timeout") if spec.get(key) for word in (
        f"--{key}", os.environ.get("JOB_FLAVOR") or spec[key] if key == "flavor" else spec[key])]
    head += [word for secret in spec["secrets"] for word in ("--secrets", secret)]
    if IMAGE_HAS_UV:
        return shlex.join(["hf", "jobs", "uv", "run", "--image", spec["image"], *head, script,
                           *job_arguments(argv)])
    url = script if re.match(r"https?://", script) else f"<raw URL of {script_name()}>"
    inner = f'pip install -q uv && uv run "$SCRIPT_URL" {shlex.join(job_arguments(argv))}'
    return shlex.join(["hf", "jobs", "run", *head, "--env", f"SCRIPT_URL={url}", spec["image"],
                       "--", "bash", "-lc", inner])


def timeout_note(spec: dict) -> str:
    """What the Jobs command's --timeout covers: pages at the rate measured on its flavor."""
    timeout, flavor = spec.get("timeout", "30m"), os.environ.get("JOB_FLAVOR") or spec.get("flavor")
    size = re.fullmatch(r"([\d.]+)([smhd]?)", timeout)
    seconds = float(size[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[size[2]] \
        if size else 1800
    rate = JOB_PAGES_PER_S if flavor == spec.get("flavor") else None
    cover = f"about {int((seconds - 900) * rate // 1000 * 1000):,} pages at the {rate} pages/s " \
        f"measured on {flavor} (15 min of start-up left out)" if rate else \
        f"an unknown number of pages (no rate was measured on {flavor}: time a --max-samples " \
        f"run first)"
    return f"--timeout {timeout} (Jobs stop a job after 30 min unless told) covers {cover}; " \
        f"give a larger input a longer --timeout, or --num-shards N --shard-index i (one Job each)."


def jobs_notes(argv: list[str] | None = None, in_card: bool = False) -> list[str]:
    """What jobs_command's command covers, what to fill in, and the launcher when it is here."""
    words, script = job_arguments(argv), script_reference(in_card)
    notes = [timeout_note(jobs_spec())]
    if "INPUT" in words[:2]:
        notes.append("A Job cannot read INPUT on this machine: push it first (`hf upload "
                     "user/name FOLDER --repo-type dataset`) and give that dataset id for INPUT.")
    if "OUTPUT" in words[:2]:
        notes.append("A Job's disk goes when it ends: give a Hub dataset id for OUTPUT "
                     "(--private keeps it private).")
    by_url = re.match(r"https?://", script)
    if in_card and IMAGE_HAS_UV and not by_url:
        notes.append(f"Run it from the folder that holds {script}, or give its URL in its place.")
    if not IMAGE_HAS_UV and not by_url:
        notes.append(f"The image has no uv, so the Job fetches the script: put the raw URL of "
                     f"{script_name()} in place of <raw URL of {script_name()}>.")
    if not by_url and (Path(sys.argv[0]).resolve().parent / "ocr-jobs.py").is_file():
        launcher = str(Path(script).with_name("ocr-jobs.py"))
        notes.append(f"For many pages, ocr-jobs.py (beside this script) runs N Jobs into one "
                     f"OUTPUT, resubmits a shard left unfinished and prints the cost: `uv run "
                     f"{shlex.join([launcher, script])} INPUT OUTPUT --shards N` and the options "
                     f"above (--dry-run first: the Jobs, time and cost).")
    return notes


def jobs_advice(argv: list[str] | None = None) -> str:
    """The Jobs command for this run and its notes, as a message prints them."""
    return "\n".join([f"  {jobs_command(argv)}", *(f"* {note}" for note in jobs_notes(argv))])
