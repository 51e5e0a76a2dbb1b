"""ocr-jobs.py as a user runs it, over HTTP, with nothing monkeypatched: the launcher is a
process (`python ocr-jobs.py ...`, HF_ENDPOINT and HF_TOKEN set), the Hub is tests/
fake_hub_server.py (a local HTTP fake of the Hub's endpoints and of the Jobs API), each shard's
Job a real process of the model script against the stub server, its input a dataset repo of the
fake (a parquet pushed into it), the output read back with `datasets.load_dataset(OUTPUT)` by
another process, as a user reads it.

The faults of a real day: 429 with Retry-After, a shard that fails once, one stuck in
SCHEDULING, one whose Job succeeds with rows missing (test_a_run_...); two launchers on one
output, on one machine and on two, then Ctrl-C and adopt (test_a_second_launcher_...); a refused
account (test_a_refused_account_...). The requests a poll while watching 50 shards are counted
at the Hub (test_watching_50_...)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, expected_text, load_script, write_image_folder
from fake_hub_server import FakeHubServer

pytestmark = pytest.mark.timeout(150)
SCRIPT = "ovis-ocr2-server.py"
INPUT, OUTPUT = "user/scans", "user/scans-ocr"
TOKEN = "hf_secretsecretsecret"
UV_DIRS = {}  # the user's uv cache and Pythons, kept on every "machine" (a fresh HOME)


def uv_dirs() -> dict:
    if not UV_DIRS:
        for name, command in (("UV_CACHE_DIR", ["uv", "cache", "dir"]),
                              ("UV_PYTHON_INSTALL_DIR", ["uv", "python", "dir"])):
            UV_DIRS[name] = subprocess.run(command, capture_output=True, text=True,
                                           check=True).stdout.strip()
    return UV_DIRS


class Hub:
    """The fake Hub of one test, with its input dataset pushed, and the machines users run the
    launcher on (a HOME each)."""

    def __init__(self, tmp_path: Path, rows: int):
        self.tmp = tmp_path
        self.server = FakeHubServer(tmp_path / "hub", scripts=ROOT, token=TOKEN).start()
        self.server.rows = rows
        self.paths = write_image_folder(tmp_path / "pages", rows)
        self.push_input()

    def push_input(self) -> None:
        import datasets

        cells = [{"bytes": p.read_bytes(), "path": None} for p in self.paths]
        ds = datasets.Dataset.from_dict(
            {"image": cells, "row_id": list(range(len(cells)))},
            features=datasets.Features({"image": datasets.Image(),
                                        "row_id": datasets.Value("int64")}))
        path = self.tmp / "input.parquet"
        ds.to_parquet(str(path))
        self.server.push_files("dataset", INPUT, {
            "data/train-00000-of-00001.parquet": path.read_bytes()})

    def env(self, machine: str = "laptop") -> dict:
        home = self.tmp / machine
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HF_", "HUGGING", "XDG_"))}
        env.update(uv_dirs())
        env.update({"HOME": str(home), "HF_ENDPOINT": self.server.url, "HF_TOKEN": TOKEN,
                    "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_EXPERIMENTAL_WARNING": "1",
                    "PYTHONUNBUFFERED": "1"})
        return env

    def launcher(self, stub, *extra, shards: int = 3, machine: str = "laptop",
                 script: str = SCRIPT) -> subprocess.Popen:
        command = [sys.executable, str(ROOT / "ocr-jobs.py"), str(ROOT / script), INPUT, OUTPUT,
                   "--shards", str(shards), "--poll-seconds", "0.3", *extra]
        if stub is not None:
            command += ["--server", stub.url, "--part-rows", "2"]
        env = {**self.env(machine), "PYTHONFAULTHANDLER": "1"}  # its threads, if it hangs
        return subprocess.Popen(command, env=env, cwd=self.tmp / machine,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, stub, *extra, timeout: float = 120, **kwargs) -> tuple[int, str, str]:
        process = self.launcher(stub, *extra, **kwargs)
        out, err = process.communicate(timeout=timeout)
        (self.tmp / f"launcher-{time.monotonic():.0f}.err").write_text(err)
        return process.returncode, out, err

    def load_output(self) -> dict:
        """`datasets.load_dataset(OUTPUT)` in a process of its own, as a user calls it."""
        code = ("import datasets, json; ds = datasets.load_dataset(%r, split='train'); "
                "print(json.dumps({'row_id': list(ds['row_id']), "
                "'markdown': list(ds['markdown'])}))"
                % OUTPUT)
        done = subprocess.run([sys.executable, "-c", code], env=self.env("reader"),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def assert_output_complete(self) -> None:
        ds = self.load_output()
        assert ds["row_id"] == list(range(len(self.paths)))  # every row once, in order
        assert ds["markdown"] == [expected_text(p.read_bytes()) for p in self.paths]

    def shard_jobs(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in self.server.jobs:
            shard = job.labels.get("ocr-shard")
            counts[shard] = counts.get(shard, 0) + 1
        return counts


@pytest.fixture
def hub(tmp_path):
    made = []

    def make(rows: int = 9) -> Hub:
        made.append(Hub(tmp_path, rows))
        return made[-1]

    yield make
    for one in made:
        one.server.stop()


def submitted(fake: Hub, launcher: subprocess.Popen, jobs: int) -> None:
    """Until the Hub has recorded that many submissions, while the launcher runs (it checks
    the run with the script's --check-only first: a minute and more on a loaded machine)."""
    wait_for(lambda: len(fake.server.calls("run_job")) >= jobs or launcher.poll() is not None,
             timeout=300)
    if launcher.poll() is not None:
        pytest.fail(f"the launcher exited ({launcher.returncode}) before submitting {jobs} "
                    f"Jobs:\n{launcher.communicate()[1][-3000:]}")


def interrupted(launcher: subprocess.Popen) -> tuple[str, str]:
    """A launcher's output once it has stopped after Ctrl-C (or SIGTERM). A stopping launcher
    waits for the Hub twice, RELEASE_WAIT_S at most each (its Jobs listed, its claim deleted):
    the bound is above that, and past it the launcher's signal masks and threads are shown
    (/proc, and faulthandler on SIGABRT)."""
    bound = 2 * load_script("ocr-jobs.py").RELEASE_WAIT_S + 30
    try:
        return launcher.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{launcher.pid}/status").read_text().splitlines()
        masks = " ".join(line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
        launcher.send_signal(signal.SIGABRT)
        _, err = launcher.communicate(timeout=30)
        pytest.fail(f"the launcher did not stop within {bound:.0f} s of the signal ({masks}):\n"
                    f"{err[-6000:]}")


def test_a_process_a_test_starts_takes_ctrl_c_as_from_a_terminal():
    """The suite started in the background (CI) inherits SIGINT ignored; a launcher then ignored
    every Ctrl-C the tests pressed (tests/conftest.py takes SIGINT back)."""
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal("
                            "signal.SIGINT) is signal.default_int_handler)"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "True", child.stdout + child.stderr


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_run_over_three_jobs_finishes_failed_stuck_and_incomplete_shards(hub, stub_server,
                                                                          tmp_path):
    """The whole path over HTTP, and the faults of a real day: the Hub answers 429 with
    Retry-After to the first two listings of Jobs (huggingface_hub waits and asks again) and to
    the first submission (the launcher waits as the Hub says, and submits again); shard 0's first
    Job dies (CUDA out of memory), shard 1's waits for a GPU 11 minutes, shard 2's says
    COMPLETED and its last part never reached the Hub."""
    fake, stub = hub(9), stub_server()
    fake.server.throttle.update({"list_jobs": 2, "run_job": 1})
    fake.server.job_faults.update({(0, 1): "fail", (1, 1): "stuck", (2, 1): "incomplete"})
    stats = tmp_path / "stats.json"
    code, out, err = fake.run(stub, "--stats-json", str(stats))
    assert code == 0, err
    fake.assert_output_complete()
    assert fake.shard_jobs() == {"0": 2, "1": 1, "2": 2}
    assert err.count("HTTP Error 429 thrown while requesting GET") == 2  # huggingface_hub's wait
    assert "answered 429 to run_uv_job: waiting 1 s" in err  # the Hub's Retry-After, honoured
    assert "CUDA out of memory" in err  # the failed Job's log tail, from the Jobs API's logs
    assert "has been SCHEDULING for 11m" in err and "left queued" in err
    assert not fake.server.calls("cancel_job")  # reported, not cancelled
    incomplete = fake.server.jobs[2].id
    assert f"shard 2: Job {incomplete} ended COMPLETED with 1 rows not written: submitting it " \
           f"again (attempt 2 of 3)" in err
    assert err.count("its log ends") == 1  # a Job that says it succeeded has no log to show
    shard_log = fake.server.jobs[1].log.read_text()  # the Hub the rows went to is HF_ENDPOINT's
    assert f"-> {fake.server.url}/datasets/{OUTPUT} (exit 0)" in shard_log, shard_log
    spec = fake.server.jobs[0].spec
    assert spec["dockerImage"] == "vllm/vllm-openai:v0.26.0" and spec["flavor"] == "l4x1"
    assert spec["timeoutSeconds"] == 4 * 3600 and spec["attempts"] == 1
    assert spec["secrets"] == {"HF_TOKEN": TOKEN} and TOKEN not in json.dumps(spec["command"])
    assert spec["command"][:3] == ["uv", "run", f"/data/{SCRIPT}"]  # the upload, mounted
    args = spec["command"][3:]
    assert args[:2] == [INPUT, OUTPUT]  # every shard reads the input at the revision resolved
    assert args[args.index("--revision") + 1] == fake.server.repo("dataset", INPUT).sha
    assert spec["labels"]["name"] == "ocr-ovis-ocr2-server-0-of-3"
    assert {job.labels["ocr-shard"] for job in fake.server.jobs} == {"0", "1", "2"}
    assert len({job.labels["ocr-jobs"] for job in fake.server.jobs}) == 1  # one run id
    assert "9/9 rows" in err
    figures = json.loads(stats.read_text())
    assert figures["rows_done"] == figures["rows_total"] == 9 and figures["card_rows"] == 9
    assert figures["cost_usd"] is not None and figures["shards_failed"] == []


def test_a_second_launcher_exits_2_and_ctrl_c_leaves_the_jobs_to_adopt(hub, stub_server):
    """While a launcher watches (its Jobs waiting for GPUs longer than ten polls): a second
    launcher on its OUTPUT exits 2 naming its run, on the same machine and on another (another
    HOME, no lock in common: the claim is on the Hub, in OUTPUT's .ocr/), and so does another
    run (other arguments) by its Jobs. Ctrl-C leaves the Jobs running and names them; the same
    command, from the other machine, adopts them and submits nothing."""
    fake, stub = hub(4), stub_server()
    fake.server.scheduling_s = 1e9  # the Jobs wait for a GPU until the test lets them run
    first = fake.launcher(stub, shards=2)
    wait_for(lambda: len(fake.server.jobs) == 2)
    run_id = fake.server.jobs[0].labels["ocr-jobs"]
    submitted = fake.server.calls("run_job")[-1][0]
    # more than ten polls while no Job has started: the watch goes on (it gave up, taking the
    # OUTPUT that no shard had created yet for a Hub that did not answer)
    wait_for(lambda: len(fake.server.calls("list_jobs", since=submitted)) > 12)
    others = [fake.launcher(stub, shards=2, machine="laptop"),
              fake.launcher(stub, shards=2, machine="another-machine"),
              fake.launcher(stub, "--max-tokens", "900", shards=2, machine="another-machine")]
    errs = [other.communicate(timeout=120)[1] for other in others]
    assert [other.returncode for other in others] == [2, 2, 2], errs
    for err in errs[:2]:
        assert f"another launcher is watching {OUTPUT} (run {run_id}" in err, err
    assert f"another launch (run {run_id}) has Jobs writing" in errs[2], errs[2]
    assert len(fake.server.jobs) == 2
    first.send_signal(2)  # SIGINT: Ctrl-C
    out, err = interrupted(first)
    assert first.returncode == 130, err
    ids = [job.id for job in fake.server.jobs]
    assert f"interrupted: the Jobs keep running ({', '.join(ids)})" in err
    assert not fake.server.calls("cancel_job")
    fake.server.scheduling_s = 0.3
    code, out, err = fake.run(stub, shards=2, machine="another-machine")
    assert code == 0, err  # the first's claim on OUTPUT went with it: adopted at once
    assert f"adopting run {run_id}" in err and len(fake.server.jobs) == 2  # nothing resubmitted
    fake.assert_output_complete()


@pytest.mark.parametrize("jobs_status, whoami_status, expected", [
    (402, None, "the Jobs API refuses this account (402"),
    (403, None, "the Jobs API refuses this account (403"),
    (None, 401, "the Hub refuses the token"),
])
def test_a_refused_account_is_stopped_before_any_job(hub, stub_server, jobs_status,
                                                     whoami_status, expected):
    fake = hub(4)
    fake.server.refuse, fake.server.refuse_whoami = jobs_status, whoami_status
    code, out, err = fake.run(stub_server(), shards=2)
    assert code == 2 and expected in err, err
    assert "Traceback" not in err
    assert fake.server.jobs == [] and fake.server.repo("dataset", OUTPUT) is None


@pytest.mark.timeout(400)  # 50 submissions on a loaded machine: what it counts has no clock
def test_watching_50_shards_sends_two_requests_a_poll(hub, stub_server):
    """Counted at the Hub: every request the launcher sends while it watches 50 shards (their
    Jobs waiting for GPUs), from its last submission to Ctrl-C. Each poll is one listing of the
    run's Jobs and one of OUTPUT's files: at the default poll (30 s), 4 requests a minute."""
    fake = hub(50)
    fake.server.scheduling_s = 1e9
    launcher = fake.launcher(stub_server(), shards=50)
    # the fake records a request when it has answered: the 50th submission is over when 50
    # are recorded (a Job is listed before its submission's answer is written)
    wait_for(lambda: len(fake.server.calls("run_job")) == 50, timeout=300)
    submitted = fake.server.calls("run_job")[-1][0]
    wait_for(lambda: len(fake.server.calls("list_jobs", since=submitted)) >= 10, timeout=300)
    stop = time.monotonic()
    launcher.send_signal(2)
    out, err = interrupted(launcher)
    assert launcher.returncode == 130, err
    watching = [r for r in fake.server.calls(since=submitted + 1e-6) if r[0] < stop]
    polls = sum(r[2] == "list_jobs" for r in watching)
    routes = sorted({r[2] for r in watching})
    assert routes == ["list_jobs", "tree"] and len(watching) <= 2 * polls + 1, routes
    per_submission = len([r for r in fake.server.requests if r[0] <= submitted and r[2] in (
        "create_bucket", "xet_token", "bucket_batch", "run_job", "whoami")]) / 50
    print(f"\nwatching 50 shards over HTTP: {len(watching)} requests in {polls} polls "
          f"({len(watching) / polls:.2f} a poll: {2 * len(watching) / polls:.1f} a minute at the "
          f"default 30 s poll); {per_submission:.2f} requests a submission", file=sys.__stderr__)


def test_dry_run_over_http(hub):
    """HPD-Parsing (no uv in its image, no [tool.hf-jobs] header): its own check runs against
    the Hub (`uv run SCRIPT ... --check-only`) and counts the rows; nothing is submitted, nothing
    written. (Every other test runs ovis-ocr2-server.py's check.)"""
    fake, script = hub(4), "hpd-parsing-saturate.py"
    code, out, err = fake.run(None, "--dry-run", shards=2, script=script)
    assert code == 0, err
    assert out.count("shard 1: run") == 1 and "--num-shards 2 --shard-index 1" in out
    assert "nothing was submitted" in out and TOKEN not in out + err
    assert fake.server.jobs == [] and fake.server.repo("dataset", OUTPUT) is None
    assert not fake.server.calls("commit") and not fake.server.calls("whoami")
    print(f"\n$ ocr-jobs.py {script} {INPUT} {OUTPUT} --shards 2 --dry-run\n{out}",
          file=sys.__stderr__)


def test_hpd_parsing_runs_the_script_shipped_into_output(hub, stub_server, tmp_path):
    """HPD-Parsing's image has no uv: the launcher ships the script into OUTPUT's .ocr/launcher/
    and submits run_job with the install command; each Job fetches the script by its URL (the
    commit it was shipped in) with the token, and runs it."""
    from test_postprocessing import HPD_OUTPUT

    script = "hpd-parsing-saturate.py"
    (tmp_path / "answer.txt").write_text(HPD_OUTPUT, encoding="utf-8")
    fake = hub(4)
    stub = stub_server("--model", "HPD-Parsing", "--answer-file", str(tmp_path / "answer.txt"))
    code, out, err = fake.run(stub, "--no-sanity-check", shards=2, script=script)
    assert code == 0, err
    ds = fake.load_output()
    assert ds["row_id"] == [0, 1, 2, 3] and all(ds["markdown"])
    spec = fake.server.jobs[0].spec
    assert spec["dockerImage"].endswith("/hpd-parsing-vllm:latest-nvidia-gpu")
    assert spec["command"][:2] == ["bash", "-lc"] and "pip install -q uv" in spec["command"][2]
    assert spec["secrets"] == {"HF_TOKEN": TOKEN} and TOKEN not in json.dumps(spec["command"])
    url = spec["environment"]["SCRIPT_URL"]
    assert url.startswith(f"{fake.server.url}/datasets/{OUTPUT}/resolve/")
    commit = url.split("/resolve/")[1].split("/")[0]
    shipped = fake.server.repo("dataset", OUTPUT).files(commit)[f".ocr/launcher/{script}"]
    assert shipped == (ROOT / script).read_bytes()


def test_cancel_stops_the_launcher_watching_the_run(hub, stub_server):
    """--cancel from another terminal while a launcher watches the run: the Jobs end CANCELED
    with their rows missing, and the watching launcher stops instead of submitting them all
    again (it would run, and bill, what was just cancelled)."""
    fake, stub = hub(4), stub_server()
    fake.server.scheduling_s = 1e9
    first = fake.launcher(stub, shards=2)
    wait_for(lambda: len(fake.server.jobs) == 2)
    code, out, err = fake.run(stub, "--cancel", shards=2, machine="another-machine")
    assert code == 0 and "2 Jobs cancelled" in err, err
    try:
        out, err = first.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        first.send_signal(2)
        out, err = first.communicate(timeout=30)
    assert len(fake.server.jobs) == 2, err  # nothing submitted again
    assert first.returncode == 1 and "was cancelled (--cancel, on" in err, err
    assert "Traceback" not in err


def test_a_launcher_whose_claim_another_took_stops_and_leaves_it(hub, stub_server):
    """The claim on OUTPUT became another launcher's while this one watched (its own deleted by
    hand, or expired while the laptop slept, and another launcher started): before it submits
    a failed shard again, it reads the claim, stops, and leaves the other's claim in place."""
    fake, stub = hub(4), stub_server()
    fake.server.scheduling_s = 1e9
    fake.server.job_faults[(0, 1)] = "fail"
    first = fake.launcher(stub, shards=2)
    wait_for(lambda: len(fake.server.jobs) == 2)
    other = {"run": "20260101-000000-abcdef", "fingerprint": "0" * 12, "host": "elsewhere",
             "pid": 1, "id": "other", "since": time.time(), "until": time.time() + 900}
    claim = (json.dumps(other) + "\n").encode()
    fake.server.push_files("dataset", OUTPUT, {".ocr/launcher/watching.json": claim})
    fake.server.scheduling_s = 0.3  # shard 0's Job starts, and dies
    try:
        out, err = first.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        first.send_signal(2)
        out, err = first.communicate(timeout=30)
    assert fake.shard_jobs() == {"0": 1, "1": 1}, err  # shard 0 not submitted again
    assert first.returncode == 2 and "another launcher watches user/scans-ocr now (run " \
        "20260101-000000-abcdef" in err, err
    files = fake.server.repo("dataset", OUTPUT).files(None)
    assert files[".ocr/launcher/watching.json"] == claim  # the other's claim, left in place


def test_a_hub_that_refuses_the_claim_is_one_line_and_no_job(hub, stub_server):
    """The Hub answers 429 to every commit while the launcher claims OUTPUT: a clear line,
    nothing submitted, no traceback."""
    fake = hub(4)
    fake.server.throttle["commit"] = 100
    code, out, err = fake.run(stub_server(), shards=2)
    assert code == 1 and f"could not claim {OUTPUT} on the Hub" in err, err
    assert "Traceback" not in err and fake.server.jobs == []


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_secret_in_the_script_arguments_is_refused_never_printed(hub, dry_run):
    """A secret among the script's arguments (an API key, a token in --serve-args) would sit in
    every Job's command, which whoever sees the Jobs reads, and the dry run printed it: the
    script's own check names the options holding one, and the launcher refuses them."""
    fake, key = hub(4), "sk-abcdefghijklmnop"
    code, out, err = fake.run(None, "--serve-args", f"--max-num-seqs 8 --api-key {key}",
                              "--api-key", "plainvalue123", *(["--dry-run"] if dry_run else []),
                              shards=2)
    assert code == 2 and "--serve-args, --api-key hold secrets" in err, err
    for secret in (key, "plainvalue123", TOKEN):
        assert secret not in out + err
    assert fake.server.jobs == [] and "Traceback" not in err


def test_ctrl_c_while_the_run_is_checked_is_one_line(hub, stub_server):
    """Ctrl-C while the script checks the run (its `uv run ... --check-only`, seconds to
    minutes): a line saying nothing was submitted, exit 130, no traceback, no claim left."""
    fake = hub(4)
    launcher = fake.launcher(stub_server(), shards=2)
    assert "checking the run" in launcher.stderr.readline()
    time.sleep(0.5)
    launcher.send_signal(2)
    out, err = interrupted(launcher)
    assert launcher.returncode == 130 and "interrupted: no Job was submitted" in err, err
    assert "Traceback" not in err and fake.server.jobs == []


def test_a_launcher_stopped_by_sigterm_leaves_the_jobs_and_no_claim(hub, stub_server):
    """SIGTERM (`kill`, `timeout`) while watching: stopped as Ctrl-C is, exit 143, the Jobs left
    running and named, its claim deleted: a launcher on another machine adopts the run at once
    (Python's default ended it without deleting the claim: OUTPUT held for 15 minutes)."""
    fake, stub = hub(4), stub_server()
    fake.server.scheduling_s = 1e9
    first = fake.launcher(stub, shards=2)
    wait_for(lambda: len(fake.server.jobs) == 2)
    submitted = fake.server.calls("run_job")[-1][0]
    wait_for(lambda: len(fake.server.calls("list_jobs", since=submitted)) >= 2)
    first.send_signal(15)
    out, err = interrupted(first)
    assert first.returncode == 143, err
    assert "interrupted: the Jobs keep running" in err and "Traceback" not in err
    assert not fake.server.calls("cancel_job")
    run_id = fake.server.jobs[0].labels["ocr-jobs"]
    fake.server.scheduling_s = 0.3
    code, out, err = fake.run(stub, shards=2, machine="another-machine")
    assert code == 0, err
    assert f"adopting run {run_id}" in err and len(fake.server.jobs) == 2
    fake.assert_output_complete()


@pytest.mark.parametrize("fault, created", [("created-502", True), ("created-drop", True),
                                            ("502", False)])
def test_a_submission_the_hub_answers_unclearly_is_looked_for_before_it_is_sent_again(
        hub, stub_server, fault, created):
    """Issue #41 item 7: the Hub created shard 0's Job, then answered 502 (or closed the
    connection): the launcher submitted a second Job for shard 0, billed and missing from the
    cost (or stopped). Now it looks for the submission's Job first, and sends it again only
    when the Hub has none."""
    fake, stub = hub(4), stub_server()
    fake.server.submit_faults.append(fault)
    code, out, err = fake.run(stub, shards=2)
    assert code == 0, err
    assert fake.shard_jobs() == {"0": 1, "1": 1}, err
    said = "and created it: Job" if created else "and has no Job of it: submitting it again"
    assert said in err and "Traceback" not in err
    fake.assert_output_complete()


def test_a_hub_input_of_no_rows_is_nothing_to_do(hub, stub_server):
    """Issue #41 (low): a Hub INPUT with 0 rows exited 2 (`datasets` refuses an empty split,
    and the launcher refused --shards above 0 rows) where a local one says there is nothing
    to do and exits 0; the script's own check runs here, over HTTP, as a user's."""
    fake = hub(1)
    fake.paths = []
    fake.push_input()
    code, out, err = fake.run(stub_server(), shards=2)
    assert code == 0 and "has no rows: nothing to do" in err, err
    assert fake.server.jobs == [] and "Traceback" not in err


@pytest.mark.timeout(600)  # the module's 150 s, past which load alone can carry this test
def test_cancel_by_script_input_and_output_over_http(hub, stub_server):
    """Issue #41 item 3, as a user types it: a run launched with a script flag, cancelled by
    the docstring's `--cancel` form (no --shards, no flags)."""
    fake, stub = hub(4), stub_server()
    fake.server.scheduling_s = 1e9
    first = fake.launcher(stub, "--max-tokens", "900", shards=2)
    submitted(fake, first, 2)
    first.send_signal(2)
    interrupted(first)
    command = [sys.executable, str(ROOT / "ocr-jobs.py"), str(ROOT / SCRIPT), INPUT, OUTPUT,
               "--cancel"]
    done = subprocess.run(command, env=fake.env("another-machine"), capture_output=True,
                          text=True, timeout=300)  # for a loaded machine; it exits by itself
    assert done.returncode == 0 and "2 Jobs cancelled" in done.stderr, done.stderr
    assert all(job.stage() == "CANCELED" for job in fake.server.jobs)
