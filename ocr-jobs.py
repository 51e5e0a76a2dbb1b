# /// script
# requires-python = ">=3.11"  # tomllib
# dependencies = [
#     "huggingface_hub>=2.4.0",
# ]
# ///
"""Run a script of the collection over N Hugging Face Jobs, into one output.

No GPU, no vllm: it checks the run, submits one Job per shard, watches them, submits again the
shards whose Job ended before every row was done, and says what the run cost.

    uv run ocr-jobs.py lighton-ocr3-saturate.py user/scans user/scans-ocr --shards 16
    uv run ocr-jobs.py ovis-ocr2-server.py user/scans user/scans-ocr --shards 8 --max-tokens 4096
    uv run ocr-jobs.py lighton-ocr3-saturate.py user/scans user/scans-ocr --shards 16 --dry-run
    uv run ocr-jobs.py lighton-ocr3-saturate.py user/scans user/scans-ocr --cancel

Every option the launcher does not know is the script's, passed to every shard as given.

Before any Job: the script checks the run itself (`SCRIPT INPUT OUTPUT ... --check-only`, run
once here: the arguments, the input's revision and row count, the OUTPUT's manifest; it
prints, as its last stdout line, JSON `{"rows": N}` (the rows of the whole run, every shard's,
after --max-samples, PDF pages counted; `run`, the digest of what OUTPUT's manifest compares
(the run's identity); `input_revision` too if it resolved one, and `secret_options`, the
options holding a secret, which a Job's command would show); an INPUT of no rows is nothing to
do (exit 0, no Job); refused
are a local INPUT or OUTPUT, a script argument naming a local file or a local folder as
--model (a Job cannot read them), `--restart`, `--num-shards`/`--shard-index` (the launcher
sets them), `--shards` below 1 or above the rows, no token, and an account the Jobs API
refuses.

Submission: one Job per shard (`HfApi.run_uv_job`, `attempts=1`), with the image, flavor,
timeout and secrets of the script's `[tool.hf-jobs]` header (`--image`, `--flavor`,
`--timeout` override them); HPD-Parsing, whose image has no uv, through `HfApi.run_job` with
the install command its docstring gives, the script shipped into OUTPUT's `.ocr/launcher/` and
fetched by commit. Every shard reads the input at the revision resolved here. The token travels
as a Job secret, never in the arguments. Each Job is labelled with the run's identity (the
script's digest: the same run however its flags are spelled, `--max-tokens=900` or flags in
another order), the run id, OUTPUT, INPUT, its shard, the script and a label of its own
submission, and named `ocr-<script>-<i>-of-<n>`. A submission the Hub answers unclearly (a 5xx,
a timeout, a connection dropped) is looked for by that label before it is sent again: a Job
the Hub created is kept, never doubled.

Watching: one `list_jobs` of OUTPUT's Jobs and one listing of OUTPUT's files per poll (every
30 s: at most 6 API calls a minute while the Jobs run, however many shards; and one call per
Job that ends, for its shard's notes). A Job with the run's labels that
this launcher did not submit (another launcher's, before it stopped) is adopted, never
submitted beside (two live Jobs for one shard: the newer is cancelled). A shard is done when
every row has text, a skip reason or a final (page-caused) error: its rows in the parts on the
Hub (`data/part-<start>-<stop>.parquet`) and, once its Job has ended, none of kind `server` in
its notes (`.ocr/notes/shard-i-of-n.json`, which the script writes with its parts and reads on
a rerun to know what to redo), judged by the script's own `rows_to_redo`, run from its
text. A shard whose Job ended with rows left is submitted again, at
most --max-attempts Jobs of this launcher (the script redoes only those rows); a Job that stays
SCHEDULING for 10 minutes is reported.

Ctrl-C leaves the Jobs running and prints their ids (one whose submission it cut short too):
the same command again, with the flags in any spelling, adopts them and submits only what is
missing; `SCRIPT INPUT OUTPUT --cancel` (no --shards, no script flags) cancels the running Jobs
of the script's run on OUTPUT (`--run IDENTITY` picks one when several runs have Jobs there;
Jobs of a launcher older than the run identity are found too), and a launcher watching it stops
rather than submitting them again. A second launcher on the same OUTPUT, from this
machine or another, exits 2, naming the first's run id: the launcher watching OUTPUT holds a
claim in its `.ocr/launcher/` on the Hub (and stops if another launcher took it over).

Exit status: 0 every shard is done (or INPUT has no rows); 1 shards with rows left after
--max-attempts (each shard's rows named; the same command goes on with them), or the watch
stopped on the Hub's errors (the Jobs keep running), or --cancel stopped the run; 2 a usage
error or a refused run, or another launcher took OUTPUT over; the script's own status when its
check refuses the run; 130 interrupted, 143 stopped by SIGTERM (the Jobs keep running; the
claim on OUTPUT goes, a Ctrl-C while it is committed included).
"""

import argparse
import ast
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# Not a model script: tests/conftest.py, tools/sync_helpers.py and the registry tests skip it.
SCRIPT_KIND = "tool"

PROG = "ocr-jobs.py"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
PART_NAME = re.compile(r"^data/part-(\d{9})-(\d{9})\.parquet$")  # the scripts' OutputStore's
POLL_S = 30.0  # two calls a poll: 4 a minute, and 2 left for notes, logs and resubmissions
CALLS_PER_MINUTE = 6  # while the Jobs run; and one call per Job that ends (its shard's notes)
NOTES_PER_POLL = 10  # notes read in one poll at most (a rerun of a finished run reads them all)
SCHEDULING_REPORT_S = 600.0
UNANSWERED_POLLS = 10  # polls in a row the Hub does not answer before the watch gives up
STARTUP_S = 15 * 60  # what the scripts allow for a Job's start (image pull, model download)
CHECK_COMMAND = ["uv", "run", "--quiet"]  # how the script's own check is run here
ENDED = {"COMPLETED", "ERROR", "CANCELED", "DELETED"}
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143
LAUNCHER_OPTIONS_NOT_PASSED = ("--restart", "--num-shards", "--shard-index")
LEASE = ".ocr/launcher/watching.json"  # which launcher watches OUTPUT (LauncherLease)
LEASE_S = 15 * 60  # a claim not renewed for this long is a launcher that died
RELEASE_WAIT_S = 30.0  # how long a stopping launcher waits for its claim to be deleted
LABEL = "ocr-jobs"  # label keys: ocr-jobs (run id), ocr-identity (the script's digest of the
# run), ocr-output, ocr-input, ocr-shard, ocr-script, ocr-submission (one per submission); the
# launcher before ocr-identity labelled a run by its words typed, ocr-run (legacy_fingerprint)
IDENTITY, LEGACY = "ocr-identity", "ocr-run"


class UsageError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the arguments


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(["Options it does not know are the script's.", *(
                                    part for part in __doc__.split("\n\n")  # examples, exits
                                    if part.startswith(("    uv run", "Exit status")))]),
                                allow_abbrev=False)
    p.add_argument("script", help="a model script of the collection (a path)")
    p.add_argument("input", help="INPUT: a Hub dataset id")
    p.add_argument("output", help="OUTPUT: a Hub dataset id")
    p.add_argument("--shards", type=int, help="how many Jobs (shards); not with --cancel")
    p.add_argument("--max-attempts", type=int, default=3,
                   help="Jobs per shard at most, the first included (default 3)")
    p.add_argument("--flavor", help="the Jobs hardware (default: the script's header)")
    p.add_argument("--timeout", help="each Job's timeout, e.g. 6h (default: the script's)")
    p.add_argument("--image", help="the Docker image (default: the script's)")
    p.add_argument("--namespace", help="the user or organisation the Jobs run under")
    p.add_argument("--hf-token", help="the Hub token (default: HF_TOKEN or the saved login)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the submissions and the estimated time and cost; submit nothing")
    p.add_argument("--cancel", action="store_true",
                   help="cancel the running Jobs of SCRIPT on OUTPUT (no --shards, no flags)")
    p.add_argument("--run", help="with --cancel: the run to cancel (its identity or run id, "
                                 "as printed) when several runs have Jobs on OUTPUT")
    p.add_argument("--stats-json", help="write the run's figures (shards, rows, cost) here")
    p.add_argument("--poll-seconds", type=float, default=POLL_S, help=argparse.SUPPRESS)
    args, script_args = p.parse_known_args(argv)
    return args, script_args


def option_value(script_args: list[str], name: str) -> str | None:
    for i, word in enumerate(script_args):
        if word == name and i + 1 < len(script_args):
            return script_args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def without_option(script_args: list[str], name: str) -> list[str]:
    out, skip = [], False
    for word in script_args:
        if skip:
            skip = False
        elif word == name:
            skip = True
        elif not word.startswith(name + "="):
            out.append(word)
    return out


def refuse_arguments(args, script_args: list[str]) -> None:
    """What a Job cannot do, or what the launcher decides: refused before anything is sent."""
    if not Path(args.script).is_file():
        raise UsageError(f"SCRIPT {args.script} is not a file: pass the path of a model script "
                         f"of the collection, e.g. lighton-ocr3-saturate.py")
    if Path(args.input).expanduser().exists() or not REPO_ID.match(args.input):
        raise UsageError(
            f"INPUT {args.input!r} is not a Hub dataset id: a Job cannot read this machine's "
            f"files. Push a folder first (hf upload user/name {args.input} --repo-type dataset) "
            f"and pass user/name")
    if Path(args.output).expanduser().exists() or not REPO_ID.match(args.output):
        raise UsageError(
            f"OUTPUT {args.output!r} is not a Hub dataset id: a Job cannot write to this "
            f"machine. Pass a new Hub dataset id (user/name) as OUTPUT, and afterwards "
            f"`hf download user/name --repo-type dataset --local-dir {args.output}`")
    if args.cancel:  # the run is found by its Jobs' labels: the script's flags are not needed
        return
    if args.run:
        raise UsageError("--run names the run to cancel: it goes with --cancel")
    if args.shards is None:
        raise UsageError("--shards N is required: how many Jobs to run (with --cancel, not)")
    for name in LAUNCHER_OPTIONS_NOT_PASSED:
        if any(w == name or w.startswith(name + "=") for w in script_args):
            why = "a restart deletes what OUTPUT holds: run the script itself with --restart " \
                  "first" if name == "--restart" else "the launcher sets it: pass --shards N"
            raise UsageError(f"{name} is not passed to the Jobs ({why})")
    for i, word in enumerate(script_args):
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if value and Path(value).expanduser().is_file():
            raise UsageError(f"the script argument {word!r} names a local file, which a Job "
                             f"cannot read (the Jobs API would upload it under a new path): "
                             f"push it to the Hub or pass its content instead")
        if (word.startswith("--model=") or script_args[i - 1:i] == ["--model"]) and \
                Path(value).expanduser().is_dir():  # a fine-tune on this machine
            raise UsageError(f"--model {value} names a local folder, which a Job cannot read: "
                             f"push it to the Hub (hf upload user/name {value}) and pass "
                             f"--model user/name")
        if value == "/data" or value.startswith("/data/"):
            raise UsageError(f"{word!r}: /data is where the Jobs API mounts the script; use "
                             f"another path")
    if args.shards < 1:
        raise UsageError(f"--shards must be at least 1, got {args.shards}")
    if args.max_attempts < 1:
        raise UsageError(f"--max-attempts must be at least 1, got {args.max_attempts}")


# ---------------------------------------------------------------------------- the script's Job


@dataclass
class JobSpec:
    image: str
    flavor: str
    timeout: str
    secrets: list[str]
    has_uv: bool
    pages_per_s: float | None  # measured on the script's own flavor


def script_header(text: str) -> dict:
    """The PEP 723 block's TOML (its [tool.hf-jobs] table is what `hf jobs uv run` reads)."""
    import tomllib

    match = re.search(r"^# /// script\s*$(.*?)^# ///\s*$", text, re.M | re.S)
    if not match:
        return {}
    body = "\n".join(line[2:] if line.startswith("# ") else line[1:]
                     for line in match.group(1).splitlines())
    return tomllib.loads(body)


def registry_entry(script: Path) -> dict:
    """The script's models.json entry (beside the script, or beside this launcher)."""
    for folder in (script.resolve().parent, Path(__file__).resolve().parent):
        path = folder / "models.json"
        if path.exists():
            for entry in json.loads(path.read_text()).get("scripts", []):
                if entry.get("script") == script.name:
                    return entry
    return {}


def job_spec(script: Path, args) -> JobSpec:
    text = script.read_text()
    jobs = script_header(text).get("tool", {}).get("hf-jobs", {})
    entry = registry_entry(script)
    rate = re.search(r"^JOB_PAGES_PER_S = ([0-9.]+)", text, re.M)
    has_uv = re.search(r"^IMAGE_HAS_UV = False", text, re.M) is None
    image = args.image or jobs.get("image")
    if image is None and entry.get("image"):
        image = re.split(r"\s", entry["image"])[0]  # the registry notes a moving tag after it
        run_command = entry.get("run_command") or ""
        full = re.search(r"\s(\S+/" + re.escape(image.split("/")[-1]) + r")\s", run_command)
        image = full.group(1) if full else image
    flavor = args.flavor or jobs.get("flavor") or entry.get("flavor")
    timeout = args.timeout or jobs.get("timeout") or entry.get("timeout")
    if not (image and flavor and timeout):
        raise UsageError(f"{script.name} names no Jobs image, flavor or timeout (no "
                         f"[tool.hf-jobs] header, no models.json entry): pass --image, "
                         f"--flavor and --timeout")
    rate_value = float(rate.group(1)) if rate and not args.flavor else None
    return JobSpec(image, flavor, timeout, list(jobs.get("secrets") or ["HF_TOKEN"]), has_uv,
                   rate_value)


def duration_s(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([smhd]?)\s*", str(text))
    if not match:
        raise UsageError(f"--timeout {text!r}: write a duration such as 90m, 4h or 1d")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def slug(value: str, limit: int = 63) -> str:
    """A label value the Jobs API takes: letters, digits, '-', '_', '.'; long ones hashed."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    if len(clean) <= limit:
        return clean
    return clean[:limit - 9] + "-" + hashlib.sha1(value.encode()).hexdigest()[:8]


# ---------------------------------------------------------------------------- the API


class Api:
    """The HfApi calls the launcher makes, counted (the watch's budget), with the Hub's
    Retry-After honoured on a 429."""

    def __init__(self, hf, token: str | None, namespace: str | None):
        self.hf, self.token, self.namespace = hf, token, namespace
        self.calls: list[float] = []

    def call(self, method: str, *args, once: bool = False, **kwargs):
        """The call, asked again after a 429 or a 5xx (not `once`: a submission is not)."""
        for attempt in range(5):
            self.calls.append(time.monotonic())
            try:
                return getattr(self.hf, method)(*args, **kwargs)
            except Exception as exc:
                status, wait = http_status(exc), retry_after(exc)
                if status != 429 and not (status is not None and status >= 500) or attempt == 4 \
                        or once and status != 429:  # a 429 refused: no Job was created
                    raise
                wait = wait if wait is not None else 2.0 * 2 ** attempt
                log(f"the Hub answered {status} to {method}: waiting {wait:.0f} s")
                time.sleep(min(wait, 300.0))

    def jobs(self, method: str, **kwargs):
        if self.namespace:
            kwargs["namespace"] = self.namespace
        return self.call(method, **kwargs)


def http_status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def retry_after(exc: Exception) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def hub_token(args) -> str | None:
    if args.hf_token:
        return args.hf_token
    from huggingface_hub import get_token

    return get_token()


def check_account(api: Api, output: str) -> list:
    """Who runs the Jobs: a token the Hub refuses, or an account without Jobs, stops here. The
    Jobs API is asked for OUTPUT's Jobs (find_run reads them); every later call names the
    namespace (huggingface_hub asks whoami before each Jobs call that does not)."""
    try:
        user = api.call("whoami")
    except Exception as exc:
        raise UsageError(f"the Hub refuses the token ({type(exc).__name__}: {str(exc)[:200]}): "
                         f"log in again (hf auth login) or pass --hf-token") from None
    api.namespace = api.namespace or user.get("name")
    try:  # the Jobs API itself: an account without Jobs (no credit, no plan) answers 402/403
        return output_jobs(api, output)
    except Exception as exc:
        status = http_status(exc)
        if status in (401, 402, 403):
            raise UsageError(f"the Jobs API refuses this account ({status}: "
                             f"{str(exc).splitlines()[0][:200]}): Jobs need a payment method or "
                             f"a plan with Jobs (huggingface.co/settings/billing)") from None
        raise


# ---------------------------------------------------------------------------- the check


def run_check(script: Path, args, script_args: list[str], token: str | None) -> dict:
    """The script's own check of the run (`--check-only`), once, here: what the first Job
    would refuse is refused before any Job. Its last stdout line may be JSON with `rows`."""
    command = [*CHECK_COMMAND, str(script), args.input, args.output, *script_args,
               "--num-shards", str(args.shards), "--shard-index", "0", "--check-only"]  # as a
    # shard: OUTPUT's manifest records the shards, and an unsharded run would be refused there
    env = dict(os.environ)
    if token:
        env["HF_TOKEN"] = token  # through the environment, never the command line
    log(f"checking the run: {script.name} ... --check-only")
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    except FileNotFoundError:
        raise UsageError(f"cannot run {command[0]!r} to check the run: install uv "
                         f"(https://docs.astral.sh/uv/)") from None
    if done.returncode == 2 and re.search(r"unrecognized arguments:.* --check-only", done.stderr):
        raise UsageError(f"{script.name} does not know --check-only (a copy older than this "
                         f"launcher): use the collection's current {script.name}")
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UsageError(f"{script.name} refuses the run (exit {done.returncode}), no Job was "
                         f"submitted:\n{tail}", done.returncode)
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return {}


def resolve_revision(api: Api, args, script_args: list[str]) -> str:
    revision = option_value(script_args, "--revision")
    try:
        return api.call("dataset_info", args.input, revision=revision).sha
    except Exception as exc:
        raise UsageError(f"cannot resolve {args.input}"
                         f"{'@' + revision if revision else ''} on the Hub ({type(exc).__name__}:"
                         f" {str(exc).splitlines()[0][:200]})") from None


# ---------------------------------------------------------------------------- the run's Jobs


def legacy_fingerprint(args, script: Path, script_args: list[str]) -> str:
    """How the launcher before ocr-identity named a run (its ocr-run label): the words typed.
    Still read, so that the Jobs such a launcher left are found, cancelled and adopted."""
    words = [script.name, args.input, args.output, str(args.shards),
             *without_option(script_args, "--revision")]
    return hashlib.sha1("\0".join(words).encode()).hexdigest()[:12]


@dataclass
class RunKey:
    """Which Jobs are this run's: the script's digest of what the run is (its --check-only
    "run", what OUTPUT's manifest compares), or a legacy Job's words typed."""
    identity: str
    legacy: str | None = None

    def owns(self, job) -> bool:
        mine = job_label(job, IDENTITY)
        if mine is not None:
            return mine == self.identity
        return job_label(job, LEGACY) == self.legacy and self.legacy is not None


def run_of(job) -> str:
    """The run a Job belongs to, as a claim or --run names it: its identity, or legacy words."""
    return job_label(job, IDENTITY) or job_label(job, LEGACY) or job_label(job, LABEL) or "?"


@dataclass
class Shard:
    index: int
    lo: int
    hi: int
    jobs: list = field(default_factory=list)  # JobInfo, oldest first
    missing: list = field(default_factory=list)  # (start, stop) of its rows in no part
    server_rows: list | None = None  # error rows the server caused (a rerun redoes them), from
    # the notes of its latest ended Job; None: not read yet
    spent: int = 0  # its Jobs this launcher counts against --max-attempts
    state: str = "PENDING"
    reported_scheduling: bool = False
    log_tail_shown: set = field(default_factory=set)
    notes_read_for: str | None = None

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def written(self) -> int:
        return self.rows - sum(b - a for a, b in self.missing)

    @property
    def done_rows(self) -> int:
        """Rows with text, a skip reason or a final (page-caused) error."""
        return self.written - len(self.server_rows or [])

    @property
    def latest(self):
        """Its oldest live Job (two at once: the newer is cancelled), else its newest."""
        live = [j for j in self.jobs if stage(j) not in ENDED]
        return (live[:1] or self.jobs[-1:] or [None])[0]

    def rows_left(self) -> str:
        """What a rerun of the shard does, in words: rows in no part, server-error rows."""
        words = [f"rows {spans(self.missing)} not written"] if self.missing else []
        if self.server_rows:
            runs = spans([(r, r + 1) for r in sorted(self.server_rows)])
            words.append(f"rows {runs} failed on the server's side (error_kind server)")
        return "; ".join(words) or "none"

    def left_counts(self) -> str:
        words = [f"{self.rows - self.written} rows not written"] if self.missing else []
        if self.server_rows:
            words.append(f"{len(self.server_rows)} rows failed on the server's side "
                         f"(error_kind server)")
        return " and ".join(words) or "no rows left"


def shard_bounds(rows: int, shards: int, index: int) -> tuple[int, int]:
    """The scripts' split (open_input): contiguous ranges, the remainder spread."""
    return rows * index // shards, rows * (index + 1) // shards


def stage(job) -> str:
    status = getattr(job, "status", None)
    value = getattr(status, "stage", None) or "SCHEDULING"
    return getattr(value, "value", value)


def job_label(job, key: str) -> str | None:
    return (getattr(job, "labels", None) or {}).get(key)


def created(job) -> float:
    when = getattr(job, "created_at", None)
    return when.timestamp() if when else 0.0


def running_seconds(job, now: float) -> float:
    started = getattr(job, "started_at", None)
    if started is None:
        return 0.0
    finished = getattr(job, "finished_at", None)
    end = finished.timestamp() if finished else now
    return max(0.0, end - started.timestamp())


def output_jobs(api: Api, output: str) -> list:
    return list(api.jobs("list_jobs", labels={"ocr-output": slug(output)}))


def find_run(jobs: list, args, key: RunKey) -> str | None:
    """The run id of this run's Jobs on record among OUTPUT's Jobs (to adopt); refuses when
    another run's Jobs are writing OUTPUT."""
    others = sorted({job_label(j, LABEL) for j in jobs if stage(j) not in ENDED
                     and not key.owns(j)} - {None})
    if others:
        raise UsageError(f"another launch (run {others[0]}) has Jobs writing {args.output}: let "
                         f"it finish, or cancel it (ocr-jobs.py SCRIPT INPUT OUTPUT --cancel), "
                         f"or write to another OUTPUT")
    ours = sorted((j for j in jobs if key.owns(j)), key=created)
    return job_label(ours[-1], LABEL) if ours else None


def adopt(shards: list, jobs: list, key: RunKey, counted: bool) -> list:
    """This run's Jobs not yet in their shard's list, added (oldest first); counted: a live
    one counts as an attempt (one found while watching: another launcher submitted it)."""
    known = {j.id for s in shards for j in s.jobs}
    found = []
    for job in sorted((j for j in jobs if key.owns(j) and j.id not in known), key=created):
        index = job_label(job, "ocr-shard")
        if index is not None and index.isdigit() and int(index) < len(shards):
            shard = shards[int(index)]
            shard.jobs = sorted([*shard.jobs, job], key=created)
            shard.spent += counted and stage(job) not in ENDED
            found.append(job)
    return found


class ClaimLost(Exception):
    """OUTPUT's claim is another's now: --cancel's, or a launcher's that took OUTPUT over."""

    def __init__(self, claim: dict):
        super().__init__(f"run {claim.get('run')}")
        self.claim = claim


class LauncherLease:
    """One launcher watches an OUTPUT, from whatever machine: a claim in OUTPUT's .ocr/ on the
    Hub (run id, host, pid, until when), written with the head it read as parent (two launchers
    at once: one commit is refused, and that launcher reads the other's claim), renewed while it
    watches, deleted when it stops, Ctrl-C included. A launcher killed without a word holds
    OUTPUT until its claim expires, or at once on its own machine, where its pid is gone.
    Before it renews its claim or submits a Job again, a launcher reads the claim: another's
    (--cancel's, or a launcher's that took OUTPUT over) stops it (ClaimLost)."""

    def __init__(self, api: Api, output: str, run_id: str, fingerprint: str):
        import socket
        import uuid

        self.api, self.output, self.run_id = api, output, run_id
        self.claim = {"run": run_id, "fingerprint": fingerprint, "host": socket.gethostname(),
                      "pid": os.getpid(), "id": uuid.uuid4().hex, "since": time.time()}
        self.renewed, self.held, self.tried = 0.0, False, False

    def take(self, private: bool) -> None:
        """Claim OUTPUT (creating it, as the script would: its --private kept), or refuse."""
        try:
            self.api.call("create_repo", self.output, repo_type="dataset", exist_ok=True,
                          private=private or None)
            for attempt in range(5):
                head = self.api.call("repo_info", self.output, repo_type="dataset").sha
                holder = self.holder()
                if holder is not None:
                    until = time.strftime("%H:%M UTC", time.gmtime(holder["until"]))
                    raise UsageError(
                        f"another launcher is watching {self.output} (run {holder['run']}, pid "
                        f"{holder['pid']} on {holder['host']}): wait for it, or stop it (Ctrl-C "
                        f"leaves its Jobs running) and rerun this command to adopt them; a "
                        f"launcher that died without a word holds {self.output} until {until}")
                try:
                    return self.write(parent=head)
                except Exception as exc:
                    if http_status(exc) != 412 or attempt == 4:  # 412: the head moved
                        raise
        except UsageError:
            raise
        except Exception as exc:
            status = http_status(exc)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if status in (401, 403, 404):
                raise UsageError(f"cannot write {self.output} ({why}): pass an OUTPUT in your "
                                 f"namespace or an organisation you can write to") from None
            raise UsageError(f"could not claim {self.output} on the Hub ({why}): nothing was "
                             f"submitted; rerun the same command", EXIT_FAILED) from None

    def read(self) -> dict | None:
        """The claim on the Hub, None when there is none (one call: no claim is a 404)."""
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            try:
                path = self.api.call("hf_hub_download", self.output, LEASE, repo_type="dataset",
                                     local_dir=folder)
            except Exception as exc:
                name = type(exc).__name__  # LocalEntryNotFoundError: the Hub did not answer
                if isinstance(exc, FileNotFoundError) or http_status(exc) == 404 or \
                        name.endswith("NotFoundError") and not name.startswith("Local"):
                    return None
                raise
            try:
                return json.loads(Path(path).read_text())
            except ValueError:
                return None

    def holder(self) -> dict | None:
        """The claim of another launcher that is still watching, if any (not --cancel's)."""
        try:
            claim = self.read()
        except Exception:
            return None
        if claim is None or claim.get("id") == self.claim["id"] or claim.get("cancelled") or \
                claim.get("until", 0) < time.time():
            return None
        if claim.get("host") == self.claim["host"]:
            try:
                os.kill(int(claim["pid"]), 0)
            except ProcessLookupError:
                return None  # killed on this machine: its claim goes with it
            except (OSError, ValueError, KeyError):
                pass
        return claim

    def hold(self) -> None:
        """Still this launcher's claim, or ClaimLost; a claim deleted by hand is written again."""
        claim = self.read()
        if claim is not None and claim.get("id") != self.claim["id"]:
            self.held = False
            raise ClaimLost(claim)
        if claim is None:
            self.write()

    def may_submit(self) -> bool:
        """hold(), before a Job is submitted again; a Hub that does not answer: not this poll."""
        try:
            self.hold()
            return True
        except ClaimLost:
            raise
        except Exception as exc:
            log(f"could not read this launcher's claim on {self.output} ({type(exc).__name__}): "
                f"no Job is submitted again before the next poll")
            return False

    def write(self, parent: str | None = None) -> None:
        from huggingface_hub import CommitOperationAdd

        claim = {**self.claim, "until": time.time() + LEASE_S}
        self.tried = True  # a Ctrl-C while it commits: release() looks whether it landed
        self.api.call("create_commit", self.output, repo_type="dataset", parent_commit=parent,
                      operations=[CommitOperationAdd(path_in_repo=LEASE, path_or_fileobj=(
                          json.dumps(claim, indent=1) + "\n").encode())],
                      commit_message=f"ocr-jobs.py: run {self.run_id} is watched from "
                                     f"{claim['host']}")
        self.renewed, self.held = time.monotonic(), True

    def renew(self) -> None:
        if time.monotonic() - self.renewed > LEASE_S / 3:
            try:
                self.hold()
                self.write()
            except ClaimLost:
                raise
            except Exception as exc:  # the next poll tries again; the claim lasts LEASE_S
                log(f"could not renew this launcher's claim on {self.output} "
                    f"({type(exc).__name__}); trying again at the next poll")

    def release(self) -> None:
        """Delete the claim if it is still this launcher's, waiting at most RELEASE_WAIT_S: a
        Ctrl-C must not hang on a slow Hub (then the claim is left to expire)."""
        import threading

        from huggingface_hub import CommitOperationDelete

        failure: list = []

        def delete() -> None:
            try:
                if not (self.held or self.tried) or \
                        (self.read() or {}).get("id") != self.claim["id"]:
                    return
                self.api.call("create_commit", self.output, repo_type="dataset",
                              operations=[CommitOperationDelete(path_in_repo=LEASE)],
                              commit_message=f"ocr-jobs.py: run {self.run_id} is no longer watched")
            except Exception as exc:
                first = str(exc).splitlines()[0][:120] if str(exc) else ""
                failure.append(f"{type(exc).__name__}: {first}")

        worker = threading.Thread(target=delete, daemon=True)
        worker.start()
        try:
            worker.join(RELEASE_WAIT_S)
        except KeyboardInterrupt:
            failure.append("interrupted")
        if worker.is_alive() and not failure:
            failure.append(f"no answer in {RELEASE_WAIT_S:.0f} s")
        if failure:
            log(f"could not remove this launcher's claim on {self.output} ({failure[0]}); it "
                f"expires by itself in {LEASE_S // 60:.0f} min, or at once for a launcher on "
                f"this machine")

    def cancelled(self, run_ids: set) -> None:
        """--cancel: the claim of a launcher watching this run (same identity, or one of its
        run ids) becomes --cancel's, so that launcher stops instead of submitting the cancelled
        shards again."""
        try:
            claim = self.read()
            if claim is not None and not claim.get("cancelled") and (
                    claim.get("fingerprint") == self.claim["fingerprint"] or
                    claim.get("run") in run_ids):
                self.claim.update(run=claim.get("run"), cancelled=True)
                self.write()
        except Exception as exc:
            log(f"could not tell a launcher watching {self.output} that its run is cancelled "
                f"({type(exc).__name__}): stop it (Ctrl-C) or it submits the shards again")


def submission(spec: JobSpec, script: Path, args, script_args: list[str], revision: str,
               shard: int, run_id: str, identity: str) -> dict:
    """What one shard's Job is: run_uv_job's (or run_job's) arguments, no secret value; its
    ocr-submission label names this submission alone (found again after an unclear answer)."""
    import uuid

    shard_args = [args.input, args.output, *without_option(script_args, "--revision"),
                  "--revision", revision, "--num-shards", str(args.shards),
                  "--shard-index", str(shard)]
    labels = {LABEL: run_id, IDENTITY: identity, "ocr-output": slug(args.output),
              "ocr-input": slug(args.input), "ocr-shard": str(shard),
              "ocr-script": slug(script.stem), "ocr-submission": uuid.uuid4().hex[:16]}
    name = f"ocr-{slug(script.stem, 40)}-{shard}-of-{args.shards}"
    return {"image": spec.image, "flavor": spec.flavor, "timeout": spec.timeout,
            "labels": labels, "name": name, "script_args": shard_args,
            "secrets": sorted(set(spec.secrets) | {"HF_TOKEN"})}


def ship_script(api: Api, script: Path, output: str) -> str:
    """An image without uv fetches the script by URL: it goes into OUTPUT's .ocr/ (which the
    scripts allow there), and the URL names the commit, so every shard runs the same bytes."""
    from huggingface_hub import CommitOperationAdd, constants

    info = api.call("create_commit", output, repo_type="dataset",  # (the lease created OUTPUT)
                    operations=[CommitOperationAdd(path_in_repo=f".ocr/launcher/{script.name}",
                                                   path_or_fileobj=str(script))],
                    commit_message=f"ocr-jobs.py: the script the Jobs run ({script.name})")
    commit = getattr(info, "oid", None) or "main"
    return f"{constants.ENDPOINT}/datasets/{output}/resolve/{commit}/.ocr/launcher/{script.name}"


def install_command(script_args: list[str]) -> list[str]:
    """HPD-Parsing's Jobs command, as its docstring gives it: uv first, then the script, fetched
    with the token (OUTPUT may be private)."""
    fetch = ("import os, urllib.request as r; q = r.Request(os.environ['SCRIPT_URL'], headers="
             "{'Authorization': 'Bearer ' + os.environ['HF_TOKEN']}); "
             "open('/tmp/ocr-script.py', 'wb').write(r.urlopen(q).read())")
    inner = (f"pip install -q uv && python3 -c {shlex.quote(fetch)} && "
             f"uv run /tmp/ocr-script.py {shlex.join(script_args)}")
    return ["bash", "-lc", inner]


def unclear(exc: Exception) -> bool:
    """An answer that does not say whether the Hub created the Job: a 5xx, a timeout, a
    connection dropped (after the request may have been sent)."""
    status = http_status(exc)
    if status is not None:
        return status >= 500
    kinds = {kind.__name__ for kind in type(exc).__mro__}  # httpx's, or huggingface_hub's httpx2
    return bool(kinds & {"TransportError", "TimeoutException", "TimeoutError", "ConnectionError"})


def submitted_already(api: Api, sub: dict):
    """The Job of this submission, if the Hub created it (its ocr-submission label)."""
    wanted = {"ocr-submission": sub["labels"]["ocr-submission"],
              "ocr-output": sub["labels"]["ocr-output"]}
    found = sorted(api.jobs("list_jobs", labels=wanted), key=created)
    return found[-1] if found else None


def submit(api: Api, spec: JobSpec, script: Path, sub: dict, token: str, script_url: str | None):
    """One Job, once: after an unclear answer, the run's Jobs are looked at for this
    submission's before it is sent again (a second Job would run and bill the same rows)."""
    secrets = {name: token if name == "HF_TOKEN" else os.environ.get(name)
               for name in sub["secrets"]}
    missing = [name for name, value in secrets.items() if value is None]
    if missing:
        raise UsageError(f"the script's header asks for the secret(s) {', '.join(missing)}: set "
                         f"them in this shell's environment")
    common = dict(image=sub["image"], flavor=sub["flavor"], timeout=sub["timeout"], attempts=1,
                  name=sub["name"], labels=sub["labels"], secrets=secrets)
    if spec.has_uv:
        method, kwargs = "run_uv_job", dict(script=str(script), script_args=sub["script_args"])
    else:
        method, kwargs = "run_job", dict(command=install_command(sub["script_args"]),
                                         env={"SCRIPT_URL": script_url})
    for attempt in range(5):
        try:
            return api.jobs(method, once=True, **kwargs, **common)
        except Exception as exc:
            if not unclear(exc) or attempt == 4:
                raise
            what = f"{http_status(exc) or type(exc).__name__}"
            time.sleep(2.0 * 2 ** attempt)  # the Hub's record of a Job it created, in time
            job = submitted_already(api, sub)
            if job is not None:
                log(f"the Hub answered {what} to the submission of {sub['name']}, and created "
                    f"it: Job {job.id}, not submitted again")
                return job
            log(f"the Hub answered {what} to the submission of {sub['name']}, and has no Job "
                f"of it: submitting it again")


# ---------------------------------------------------------------------------- watching


def missing_rows(files: list[str], lo: int, hi: int) -> list[tuple[int, int]]:
    """Ranges of [lo, hi) that no part on the Hub holds (part names are their row ranges)."""
    held = []
    for name in files:
        match = PART_NAME.match(name)
        if match:
            a, b = max(int(match.group(1)), lo), min(int(match.group(2)), hi)
            if a < b:
                held.append((a, b))
    gaps, end = [], lo
    for a, b in sorted(held):
        if a > end:
            gaps.append((end, a))
        end = max(end, b)
    return gaps + [(end, hi)] * (end < hi)


def spans(ranges: list[tuple[int, int]]) -> str:
    """Row ranges as a reader writes them: 3, 5-8 (the last row included), runs joined."""
    joined: list[list[int]] = []
    for a, b in sorted(ranges):
        if joined and a <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], b)
        else:
            joined.append([a, b])
    words = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in joined]
    return ", ".join(words[:8]) + (f", ... ({len(words)} ranges)" if len(words) > 8 else "")


def script_function(text: str, name: str):
    """A function of the script, run here from its text: the script's own rule, not a copy (its
    top-level literal constants are given to it; nothing of the script is imported)."""
    tree = ast.parse(text)
    namespace: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            with contextlib.suppress(ValueError, TypeError, SyntaxError):
                value = ast.literal_eval(node.value)
                targets = node.targets[0]
                names = targets.elts if isinstance(targets, ast.Tuple) else [targets]
                values = value if isinstance(targets, ast.Tuple) else [value]
                namespace.update((n.id, v) for n, v in zip(names, values) if isinstance(n, ast.Name))
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if not found:
        raise UsageError(f"the script defines no {name}(): use the collection's current script")
    exec(compile(ast.Module(body=found, type_ignores=[]), "<script>", "exec"), namespace)
    return namespace[name]


def server_error_rows(notes: dict, files: list[str], lo: int, hi: int, rows_to_redo) -> list[int]:
    """The error rows a rerun of the script redoes, by the script's own rows_to_redo() on the
    notes of OUTPUT's parts, with its defaults (not --retry-errors: a page's errors are final)."""
    parts = {f[len("data/"):] for f in files if PART_NAME.match(f)}
    return sorted(row for name, note in notes.items() if name in parts
                  for row in rows_to_redo(note, lo, hi))


def read_notes(api: Api, output: str, shard: Shard, shards: int) -> dict | None:
    """The shard's notes (part name -> its error rows and their kind), which the script
    commits with its parts; {} when there are none (parts written by hand, as the script reads
    them), None when the Hub did not answer (asked again at the next poll)."""
    import tempfile

    name = f".ocr/notes/shard-{shard.index}-of-{shards}.json"
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = api.call("hf_hub_download", output, name, repo_type="dataset",
                            local_dir=folder)
        except Exception as exc:
            kind = type(exc).__name__
            if http_status(exc) == 404 or kind.endswith("NotFoundError") and \
                    not kind.startswith("Local"):
                return {}
            return None
        try:
            return {k: v for k, v in json.loads(Path(path).read_text()).items()
                    if PART_NAME.match("data/" + k)}
        except (ValueError, AttributeError):
            return {}


def card_rows(api: Api, output: str) -> int | None:
    """The rows OUTPUT's card counts (the last shard to finish writes it, from every part)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        try:
            path = api.call("hf_hub_download", output, "README.md", repo_type="dataset",
                            local_dir=folder)
        except Exception:
            return None
        found = re.search(r"holds ([\d,]+) rows", Path(path).read_text())
    return int(found.group(1).replace(",", "")) if found else None


def fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def table(shards: list[Shard], now: float) -> str:
    lines = [f"{'shard':>5}  {'state':<10} {'rows done':>15}  attempts  elapsed  job"]
    for s in shards:
        job = s.latest
        elapsed = fmt_s(running_seconds(job, now)) if job else "-"
        lines.append(f"{s.index:>5}  {s.state:<10} {s.done_rows:>7}/{s.rows:<7}  "
                     f"{len(s.jobs):>8}  {elapsed:>7}  {job.id if job else '-'}")
    rows, done = sum(s.rows for s in shards), sum(min(s.done_rows, s.rows) for s in shards)
    width = 30
    filled = int(width * done / rows) if rows else width
    lines.append(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{rows} rows "
                 f"({100 * done / rows if rows else 100:.1f}%)")
    return "\n".join(lines)


def output_files(api: Api, output: str) -> list[str]:
    """OUTPUT's files; none while no shard has created the repo yet (a Job's start can take
    15 minutes: the image, the model)."""
    try:
        return api.call("list_repo_files", output, repo_type="dataset")
    except Exception as exc:
        if type(exc).__name__ == "RepositoryNotFoundError":
            return []
        raise


def log_tail(api: Api, job) -> str:
    try:
        lines = list(api.jobs("fetch_job_logs", job_id=job.id, tail=20))
    except Exception as exc:
        return f"(its logs could not be read: {type(exc).__name__})"
    return "\n".join("    " + line.rstrip() for line in lines[-20:])


def poll(api: Api, ctx: dict, shards: list[Shard]) -> list[str]:
    """One poll: OUTPUT's Jobs (this run's adopted: one another launcher submitted is watched,
    never submitted twice) and OUTPUT's files; each shard's state from them."""
    listed = output_jobs(api, ctx["args"].output)
    files = output_files(api, ctx["args"].output)
    for job in adopt(shards, listed, ctx["key"], counted=True):
        log(f"shard {job_label(job, 'ocr-shard')}: Job {job.id} ({stage(job)}) carries this "
            f"run's labels (another launcher submitted it): watched as this run's")
    by_id = {j.id: j for j in listed}
    now = time.time()
    for s in shards:
        s.jobs = [by_id.get(j.id, j) for j in s.jobs]
        cancel_doubles(api, s)
        s.missing = missing_rows(files, s.lo, s.hi)
        job = s.latest
        s.state = "PENDING" if job is None else stage(job)
        if s.state == "SCHEDULING" and not s.reported_scheduling and \
                now - created(job) > SCHEDULING_REPORT_S:
            s.reported_scheduling = True
            log(f"shard {s.index}: Job {job.id} has been SCHEDULING for "
                f"{fmt_s(now - created(job))} (no {ctx['spec'].flavor} free?); it is left "
                f"queued: --cancel and a smaller --shards, or another --flavor, if it stays")
    return files


def cancel_doubles(api: Api, s: Shard) -> None:
    """Two live Jobs for one shard (a submission the Hub recorded late, two launchers at the
    same instant) would bill its rows twice: the newer ones are cancelled, the oldest kept."""
    live = [j for j in s.jobs if stage(j) not in ENDED]
    for job in live[1:]:
        try:
            api.jobs("cancel_job", job_id=job.id)
            log(f"shard {s.index}: Job {job.id} runs beside Job {live[0].id} for the same "
                f"rows: cancelled (the older one goes on)")
        except Exception as exc:  # the next poll tries again
            log(f"shard {s.index}: could not cancel Job {job.id}, which runs beside Job "
                f"{live[0].id} ({type(exc).__name__}): trying again at the next poll")


def judge(api: Api, ctx: dict, s: Shard, files: list[str], shards: int) -> bool:
    """A shard whose latest Job ended: DONE when every row has text, a skip reason or a final
    (page-caused) error, the script's own rule on the notes it wrote; True when it is not
    (rows in no part, or server-error rows a rerun redoes)."""
    job = s.latest
    if s.missing:
        s.server_rows = None
        return True
    if s.notes_read_for != job.id:  # the notes are read once per ended Job
        if ctx["notes_left"] <= 0:
            s.state = "CHECKING"
            return False
        ctx["notes_left"] -= 1
        notes = read_notes(api, ctx["args"].output, s, shards)
        if notes is None:  # the Hub did not answer: asked again at the next poll
            s.state = "CHECKING"
            return False
        s.server_rows = server_error_rows(notes, files, s.lo, s.hi, ctx["rows_to_redo"])
        s.notes_read_for = job.id
    s.state = "LEFT" if s.server_rows else "DONE"
    return bool(s.server_rows)


def resubmit(api: Api, ctx: dict, s: Shard) -> None:
    """The shard's latest Job ended with rows left: its log's tail, then a Job again (within
    --max-attempts, counted by this launcher), or FAILED."""
    job, attempts = s.latest, ctx["args"].max_attempts
    if job.id not in s.log_tail_shown and stage(job) != "COMPLETED":
        s.log_tail_shown.add(job.id)
        message = getattr(getattr(job, "status", None), "message", None)
        log(f"shard {s.index}: Job {job.id} ended {stage(job)}"
            f"{' (' + message + ')' if message else ''} with {s.left_counts()}; its log "
            f"ends:\n{log_tail(api, job)}")
    if s.spent >= attempts:
        s.state = "FAILED"
        return
    log(f"shard {s.index}: Job {job.id} ended {stage(job)} with {s.left_counts()}: submitting "
        f"it again (attempt {s.spent + 1} of {attempts}); the script redoes only those rows")
    s.jobs.append(ctx["submit"](s.index))  # the work itself: outside the watch's budget
    s.spent += 1
    s.server_rows, s.state = None, "SCHEDULING"


def watch(api: Api, ctx: dict, shards: list[Shard], poll_s: float) -> None:
    """Until every shard is done or its attempts are spent. Each poll: one list_jobs of
    OUTPUT's Jobs, one listing of OUTPUT's files; once a shard's Job has ended with its rows in
    parts, its notes (the error rows a rerun would redo), NOTES_PER_POLL at most; a failed
    Job's log tail and its resubmission (one each per ended Job) at once."""
    last_table, unanswered = "", 0
    while True:
        try:
            files = poll(api, ctx, shards)
        except Exception as exc:  # a network blip: the Jobs run on, the next poll asks again
            unanswered += 1
            if unanswered > UNANSWERED_POLLS or http_status(exc) in (401, 403):
                raise
            log(f"the Hub did not answer this poll ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160] if str(exc) else ''}): the Jobs run on; "
                f"asking again in {poll_s:.0f} s")
            time.sleep(poll_s)
            continue
        unanswered = 0
        claim_held, ctx["notes_left"] = None, NOTES_PER_POLL
        for s in (s for s in shards if s.latest is not None and s.state in ENDED):
            if not judge(api, ctx, s, files, len(shards)):
                continue
            if claim_held is None and s.spent < ctx["args"].max_attempts:
                claim_held = ctx["lease"].may_submit()  # a cancelled run's Jobs end too
            if claim_held is not False:
                resubmit(api, ctx, s)
        ctx["lease"].renew()
        shown = table(shards, time.time())
        if shown != last_table:
            log(shown)
            last_table = shown
        if all(s.state in ("DONE", "FAILED") for s in shards):
            return
        time.sleep(poll_s)


# ---------------------------------------------------------------------------- cost


def price_per_minute(api: Api, flavor: str) -> float | None:
    """The flavor's price, None when unknown; a flavor the Jobs API does not offer (a typo,
    which every Job would fail on) is refused."""
    try:
        hardware = list(api.call("list_jobs_hardware"))
    except Exception:
        return None
    for hw in hardware:
        if hw.name == flavor:
            per = {"minute": 1, "hour": 1 / 60, "second": 60}.get(hw.unit_label, None)
            return hw.unit_cost_usd * per if per else None
    if hardware:
        raise UsageError(f"flavor {flavor!r} is not one the Jobs API offers: pass --flavor with "
                         f"one of {', '.join(sorted(hw.name for hw in hardware))}")
    return None


def shards_advice(rows: int, pages_per_s: float, timeout: float) -> str:
    """The fewest shards that each finish within the timeout, their start-up included (every
    Job pays it, however few rows it has); none when the start-up alone fills the timeout."""
    working = timeout - STARTUP_S
    if working <= 0:
        return f" (the start-up alone takes {STARTUP_S // 60} min)"
    need = math.ceil(rows / (pages_per_s * working))
    while need > 1 and STARTUP_S + math.ceil(rows / (need - 1)) / pages_per_s <= timeout:
        need -= 1  # ceil's rounding: never more than it takes
    while STARTUP_S + math.ceil(rows / need) / pages_per_s > timeout:
        need += 1
    return f", or --shards {need} or more (each Job's {STARTUP_S // 60} min start-up included)"


def estimate(spec: JobSpec, rows: int | None, shards: int, price: float | None) -> list[str]:
    lines = []
    if rows is None:
        return ["rows unknown (the script's check did not count them): no estimate"]
    per_shard = math.ceil(rows / shards)
    if spec.pages_per_s is None:
        return [f"{rows} rows, about {per_shard} per shard; no measured pages/s for this script "
                f"on {spec.flavor}: time a --max-samples run first"]
    seconds = STARTUP_S + per_shard / spec.pages_per_s
    lines.append(f"estimate: {rows} rows, {per_shard} per shard at {spec.pages_per_s} pages/s "
                 f"on {spec.flavor} (measured): about {fmt_s(seconds)} per Job, start-up "
                 f"({STARTUP_S // 60} min) included")
    if price is not None:
        cost = shards * seconds / 60 * price
        lines.append(f"estimated cost: ${cost:.2f} (${price:.4f}/min x {shards} Jobs), "
                     f"${1000 * cost / max(rows, 1):.3f} per 1,000 pages")
    timeout = duration_s(spec.timeout)
    if seconds > timeout:
        lines.append(f"WARNING: a shard needs about {fmt_s(seconds)}, beyond its timeout "
                     f"{spec.timeout}: pass --timeout {math.ceil(seconds / 3600)}h"
                     + shards_advice(rows, spec.pages_per_s, timeout))
    return lines


# ---------------------------------------------------------------------------- main


def summary(ctx: dict, shards: list[Shard], price: float | None, api: Api,
            started: float) -> dict:
    now = time.time()
    seconds = sum(running_seconds(j, now) for s in shards for j in s.jobs)
    rows = sum(s.rows for s in shards)
    cost = seconds / 60 * price if price is not None else None
    watched = max(time.monotonic() - started, 1e-9)
    return {
        "run_id": ctx["run_id"], "run_identity": ctx["key"].identity,
        "script": ctx["script"].name, "input": ctx["args"].input,
        "input_revision": ctx["revision"], "output": ctx["args"].output,
        "flavor": ctx["spec"].flavor, "shards": len(shards), "rows_total": rows,
        "rows_done": sum(min(s.done_rows, s.rows) for s in shards),
        "shards_failed": [s.index for s in shards if s.state == "FAILED"],
        "jobs": [{"shard": s.index, "state": s.state, "rows": s.rows, "rows_done": s.done_rows,
                  "server_error_rows": s.server_rows, "rows_left": s.rows_left(),
                  "attempts": len(s.jobs), "job_ids": [j.id for j in s.jobs],
                  "running_s": round(sum(running_seconds(j, now) for j in s.jobs), 1)}
                 for s in shards],
        "job_seconds": round(seconds, 1), "price_usd_per_minute": price,
        "cost_usd": None if cost is None else round(cost, 4),
        "cost_per_1000_pages_usd": None if cost is None or not rows else
        round(1000 * cost / rows, 4),
        "api_calls": len(api.calls), "elapsed_s": round(watched, 1),
    }


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`), stopped as Ctrl-C is: the Jobs left running, the claim
    deleted (Python's default would skip the deletion: OUTPUT held until the claim expires)."""


def stopped(exc: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def on_sigterm(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None, hf_api=None) -> int:
    import signal

    args, script_args = parse_args(sys.argv[1:] if argv is None else argv)
    if argv is None:  # run as a command (the tests call main() in-process too)
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return launch(args, script_args, hf_api)
    except UsageError as exc:
        log(f"{PROG}: {exc}")
        return exc.code
    except KeyboardInterrupt as exc:  # before the Jobs (the check, the claim) or after the watch
        after = getattr(args, "submitting", False)
        log(f"\n{PROG}: interrupted: " + ("the Jobs named above keep running; rerun the same "
                                          "command to watch them" if after else
                                          "no Job was submitted"))
        return stopped(exc)


def launch(args, script_args: list[str], hf_api) -> int:
    script = Path(args.script)
    refuse_arguments(args, script_args)
    token = hub_token(args)
    if hf_api is None:
        from huggingface_hub import HfApi
        hf_api = HfApi(token=token)
    api = Api(hf_api, token, args.namespace)
    if args.cancel:
        return cancel(api, args, script)
    spec = job_spec(script, args)
    duration_s(spec.timeout)
    if not token and not args.dry_run:
        raise UsageError("no Hub token: log in (hf auth login), set HF_TOKEN or pass --hf-token; "
                         "the Jobs get it as a secret")
    on_output = [] if args.dry_run else check_account(api, args.output)
    checked = run_check(script, args, script_args, token)
    secret = list(dict.fromkeys(checked.get("secret_options") or []))  # the script's judgement
    if secret:
        raise UsageError(
            f"{', '.join(secret)} {'holds a secret' if len(secret) == 1 else 'hold secrets'}, "
            f"which a Job's command would show to whoever can see your Jobs: leave "
            f"{'it' if len(secret) == 1 else 'them'} out (a Job gets your Hub token as the secret "
            f"HF_TOKEN, and starts its own vLLM server)")
    rows = checked.get("rows")
    if rows == 0:  # the script's check said so too: an empty input is done, as a local run's
        log(f"INPUT {args.input} has no rows: nothing to do, no Job submitted")
        return 0
    if rows is not None and args.shards > rows:
        raise UsageError(f"--shards {args.shards} is more than the {rows} rows: pass --shards "
                         f"{rows} or fewer")
    if rows is None or not checked.get("run"):
        raise UsageError(f"{script.name}'s check did not count the rows or say the run's "
                         f"identity (its --check-only prints them): use the collection's current "
                         f"{script.name}")
    key = RunKey(checked["run"], legacy_fingerprint(args, script, script_args))
    revision = checked.get("input_revision") or resolve_revision(api, args, script_args)
    price = price_per_minute(api, spec.flavor)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + key.identity[:6]
    ctx = {"args": args, "script": script, "spec": spec, "run_id": run_id, "key": key,
           "revision": revision, "token": token, "script_args": script_args,
           "rows_to_redo": script_function(script.read_text(), "rows_to_redo")}
    if args.dry_run:
        return dry_run(ctx, rows, price)
    find_run(on_output, args, key)  # another run's Jobs: refused before the claim
    shards = [Shard(i, *shard_bounds(rows, args.shards, i)) for i in range(args.shards)]
    ctx["lease"] = LauncherLease(api, args.output, run_id, key.identity)
    started = time.monotonic()
    code = run_jobs(api, ctx, shards)
    return code if code is not None else finish(api, ctx, shards, price, started)


def dry_run(ctx: dict, rows: int, price: float | None) -> int:
    args, spec, script = ctx["args"], ctx["spec"], ctx["script"]
    print(f"run identity {ctx['key'].identity} (the script's digest of the run: its Jobs' "
          f"{IDENTITY} label)")
    for i in range(args.shards):
        sub = submission(spec, script, args, ctx["script_args"], ctx["revision"], i,
                         ctx["run_id"], ctx["key"].identity)
        how = "run_uv_job" if spec.has_uv else "run_job (install uv, fetch the script)"
        print(f"shard {i}: {how} image={sub['image']} flavor={sub['flavor']} "
              f"timeout={sub['timeout']} name={sub['name']}\n"
              f"  labels={json.dumps(sub['labels'])}\n"
              f"  secrets={','.join(sub['secrets'])} (values not shown)\n"
              f"  {script.name} {shlex.join(sub['script_args'])}")
    for line in estimate(spec, rows, args.shards, price):
        print(line)
    print("dry run: nothing was submitted")
    return 0


def take_over(api: Api, ctx: dict, shards: list[Shard]) -> None:
    """The claim on OUTPUT, then OUTPUT's Jobs listed again (what another launcher submitted
    while this one checked the run is this run's now), adopted; a Job for each shard without."""
    args, lease, key = ctx["args"], ctx["lease"], ctx["key"]
    lease.take("--private" in ctx["script_args"])
    on_output = output_jobs(api, args.output)
    run_id = find_run(on_output, args, key) or ctx["run_id"]
    ctx["run_id"] = lease.run_id = lease.claim["run"] = run_id
    if adopt(shards, on_output, key, counted=True):
        log(f"adopting run {run_id}: {sum(len(s.jobs) for s in shards)} Jobs on record; "
            f"submitting only the shards without one")
    script_url = None if ctx["spec"].has_uv else ship_script(api, ctx["script"], args.output)

    def submit_shard(i: int):
        sub = submission(ctx["spec"], ctx["script"], args, ctx["script_args"], ctx["revision"],
                         i, ctx["run_id"], key.identity)
        ctx["in_flight"] = sub
        job = submit(api, ctx["spec"], ctx["script"], sub, ctx["token"], script_url)
        ctx["in_flight"] = None
        log(f"shard {i}: Job {job.id} submitted ({sub['name']})")
        return job

    ctx["submit"] = submit_shard
    for s in shards:
        if not s.jobs:
            s.jobs.append(submit_shard(s.index))
            s.spent += 1


def run_jobs(api: Api, ctx: dict, shards: list[Shard]) -> int | None:
    """Claim, submit and watch; an exit code when it stops before the end (None: the end)."""
    args = ctx["args"]
    args.submitting = True  # from here, Ctrl-C names the Jobs it leaves running
    try:
        take_over(api, ctx, shards)
        watch(api, ctx, shards, args.poll_seconds)
    except UsageError:
        raise
    except ClaimLost as lost:
        claim = lost.claim
        if claim.get("cancelled"):
            log(f"run {claim.get('run')} was cancelled (--cancel, on {claim.get('host')}): this "
                f"launcher stops; no Job is submitted again")
            return EXIT_FAILED
        log(f"another launcher watches {args.output} now (run {claim.get('run')}, pid "
            f"{claim.get('pid')} on {claim.get('host')}): this one stops, and leaves its Jobs "
            f"to it")
        return EXIT_USAGE
    except (KeyboardInterrupt, Exception) as exc:
        running = running_jobs(api, ctx, shards)
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else \
            f"the watch stopped ({type(exc).__name__}: {str(exc)[:200]})"
        if running:
            log(f"\n{why}: the Jobs keep running ({', '.join(j.id for j in running)}). Rerun "
                f"the same command to watch them again (run {ctx['run_id']}), or add --cancel "
                f"to stop them.")
        else:
            log(f"\n{why}: no Job of this run is running; rerun the same command to go on")
        return stopped(exc) if isinstance(exc, KeyboardInterrupt) else EXIT_FAILED
    finally:
        ctx["lease"].release()
    return None


def bounded(work, seconds: float):
    """work()'s result, or None when it raises or takes longer (a stopping launcher waits no
    longer for a slow Hub; a second Ctrl-C ends the wait)."""
    import threading

    result: list = []
    worker = threading.Thread(target=lambda: result.append(work()), daemon=True)
    worker.start()
    try:
        worker.join(seconds)
    except KeyboardInterrupt:
        return None
    return result[0] if result else None


def running_jobs(api: Api, ctx: dict, shards: list[Shard]) -> list:
    """The run's live Jobs, listed once more (a Job whose submission Ctrl-C cut short is one
    of them), else as last seen; shard by shard."""
    listed = bounded(lambda: output_jobs(api, ctx["args"].output), RELEASE_WAIT_S)
    if listed is not None:
        adopt(shards, listed, ctx["key"], counted=False)
    jobs = {j.id: j for s in shards for j in s.jobs}
    jobs.update({j.id: j for j in listed or [] if j.id in jobs})
    live = [j for j in jobs.values() if stage(j) not in ENDED]
    return sorted(live, key=lambda j: (int(job_label(j, "ocr-shard") or 0), created(j)))


def finish(api: Api, ctx: dict, shards: list[Shard], price: float | None,
           started: float) -> int:
    """The run's figures, what it cost, and 0 only when every shard is done."""
    args, run_id = ctx["args"], ctx["run_id"]
    stats = summary(ctx, shards, price, api, started)
    cost = f"${stats['cost_usd']:.2f} (${stats['cost_per_1000_pages_usd']:.3f} per 1,000 " \
           f"pages)" if stats["cost_usd"] is not None else "unknown (no price for the flavor)"
    log(f"run {run_id}: {stats['rows_done']}/{stats['rows_total']} rows done on {args.output}, "
        f"{sum(len(s.jobs) for s in shards)} Jobs, {fmt_s(stats['job_seconds'])} of Job time, "
        f"cost {cost}; {stats['api_calls']} API calls")
    failed = [s for s in shards if s.state == "FAILED"]
    if not failed:
        counted = card_rows(api, args.output)
        stats["card_rows"] = counted
        if counted != stats["rows_total"]:
            log(f"the card of {args.output} counts {counted} rows, not "
                f"{stats['rows_total']} (two shards finished at once?): only its count is "
                f"stale; the rows are all there (load_dataset reads every part)")
    if args.stats_json:
        Path(args.stats_json).write_text(json.dumps(stats, indent=2) + "\n")
    if failed:
        log(f"shards {', '.join(str(s.index) for s in failed)} still miss rows after "
            f"{args.max_attempts} attempts each (their logs are above):\n" + "\n".join(
                f"  shard {s.index}: {s.rows_left()}" for s in failed) +
            "\nfix the cause, then rerun this same command: it goes on with these rows only "
            "(the scripts resume where they stopped)")
        return EXIT_FAILED
    return 0


def cancel(api: Api, args, script: Path) -> int:
    """SCRIPT's running Jobs on OUTPUT, cancelled, the run found by its labels (the flags it
    was launched with are not needed); --run picks one run when several have Jobs there."""
    live = [j for j in output_jobs(api, args.output) if stage(j) not in ENDED
            and job_label(j, "ocr-script") == slug(script.stem)
            and job_label(j, "ocr-input") in (None, slug(args.input))]
    runs: dict[str, list] = {}
    for job in live:
        runs.setdefault(run_of(job), []).append(job)
    if args.run:
        runs = {k: v for k, v in runs.items() if k.startswith(args.run) or any(
            (job_label(j, LABEL) or "").startswith(args.run) for j in v)}
    if len(runs) > 1:
        listed = "\n".join(f"  --run {name}  (run {job_label(jobs[0], LABEL)}: {len(jobs)} Jobs)"
                           for name, jobs in sorted(runs.items()))
        raise UsageError(f"{len(runs)} runs of {script.name} have Jobs running on {args.output}: "
                         f"pass --cancel with one of\n{listed}")
    jobs = next(iter(runs.values()), [])
    if jobs:  # first: a launcher watching the run would submit the cancelled shards again
        LauncherLease(api, args.output, job_label(jobs[0], LABEL), run_of(jobs[0])).cancelled(
            {job_label(j, LABEL) for j in jobs})
    for job in jobs:
        api.jobs("cancel_job", job_id=job.id)
        log(f"cancelled Job {job.id} (shard {job_label(job, 'ocr-shard')})")
    log(f"{len(jobs)} Jobs cancelled" + (f" (run {job_label(jobs[0], LABEL)})" if jobs else
                                         f": no Job of {script.name} was running on "
                                         f"{args.output}" + (f" for --run {args.run}"
                                                             if args.run else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
