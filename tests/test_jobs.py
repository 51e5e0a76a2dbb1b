"""ocr-jobs.py, the launcher, in-process: a fake of the Jobs API (FakeJobs) runs each shard's
Job as a real process of the model script (tests/jobs_shard.py) against the stub server, its Hub
the FakeHub folder of tests/conftest.py that the launcher reads too; the launcher runs
in-process, given FakeJobs as its HfApi, as the model scripts' Hub tests give them a FakeHub.

The faults of a real day are run over HTTP, as a user runs the launcher, in
tests/test_jobs_http.py. Here: what those do not show (attempts spent, a poll the network
drops, --cancel, the refusals before any Job, the scripts' own check, the dry run's and
HPD-Parsing's submissions, and the API calls a minute while watching 50 shards on a fake
clock)"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from conftest import ROOT, TESTS, FakeHub, expected_text, load_output, load_script, \
    write_image_folder, write_parquet_dataset

# The model scripts' --check-only (issue #31 item 1): the tests of the check itself run the
# scripts' own; the others give the launcher their row count (with_rows).
CHECK_ONLY_EXISTS = True
needs_check_only = pytest.mark.skipif(not CHECK_ONLY_EXISTS,
                                      reason="the scripts' --check-only is not there yet")

pytestmark = pytest.mark.timeout(120)
LAUNCHER = "ocr-jobs.py"
SCRIPT = "ovis-ocr2-server.py"
INPUT, OUTPUT = "user/scans", "user/scans-ocr"


def utc(seconds_ago: float = 0.0) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds_ago)


class FakeJob:
    """A Job: SCHEDULING (for `hold` seconds), then its process; its status read as the API's."""

    def __init__(self, jobs, job_id, command, labels, env, fault, hold):
        self.jobs, self.id, self.labels, self.fault = jobs, job_id, labels, fault
        self.command, self.env, self.hold = command, env, hold
        self.created_at = utc()
        self.submitted = time.monotonic()
        self.started_at = self.finished_at = None
        self.process, self.cancelled, self.log = None, False, jobs.root / f"{job_id}.log"

    @property
    def status(self):
        return types.SimpleNamespace(stage=self.stage(), message=None)

    def stage(self) -> str:
        if self.cancelled:
            return "CANCELED"
        if self.process is None:
            if time.monotonic() - self.submitted < self.hold:
                return "SCHEDULING"
            self.start()
        code = self.process.poll()
        if code is None:
            return "RUNNING"
        if self.finished_at is None:
            self.finished_at = utc()
        return "COMPLETED" if code == 0 else "ERROR"

    def start(self) -> None:
        self.started_at = utc()
        command = self.command
        if self.fault == "fail":  # the first attempt dies as a GPU out of memory does
            command = [sys.executable, "-c", "import sys; print('torch.OutOfMemoryError: CUDA "
                       "out of memory', file=sys.stderr); sys.exit(1)"]
        self.process = subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL,
                                        stderr=open(self.log, "w"))


class FakeJobs(FakeHub):
    """HfApi as the launcher uses it: the FakeHub's repo calls, and the Jobs API's, each Job a
    real process of the script. `faults` maps (shard, attempt) to "fail"; `refuse` answers the
    Jobs API with that status."""

    def __init__(self, root: Path, faults: dict | None = None, refuse: int | None = None,
                 hold: float = 0.0, spawn: bool = True):
        super().__init__(root)
        self.faults, self.refuse, self.hold = faults or {}, refuse, hold
        self.spawn = spawn
        self.jobs: list[FakeJob] = []
        self.api_calls: list[str] = []
        self.submitted: list[dict] = []
        self.interrupt_after_lists: int | None = None
        self.lists = 0

    def whoami(self, token=None):
        self.api_calls.append("whoami")
        return {"name": "user"}

    def dataset_info(self, repo_id, revision=None, timeout=None):
        self.api_calls.append("dataset_info")
        return types.SimpleNamespace(sha="0123456789abcdef0123456789abcdef01234567")

    def list_jobs_hardware(self, token=None):
        self.api_calls.append("list_jobs_hardware")
        return [types.SimpleNamespace(name="l4x1", unit_cost_usd=0.0133, unit_label="minute"),
                types.SimpleNamespace(name="a10g-small", unit_cost_usd=0.0167,
                                      unit_label="minute")]

    def list_repo_files(self, repo_id, repo_type=None, revision=None):
        self.api_calls.append("list_repo_files")
        if not (self.root / repo_id).exists():
            return []
        return super().list_repo_files(repo_id, repo_type, revision)

    def hf_hub_download(self, repo_id, filename, repo_type=None, local_dir=None):
        self.api_calls.append("hf_hub_download")
        return super().hf_hub_download(repo_id, filename, repo_type, local_dir)

    def refused(self):
        if self.refuse:
            raise self.refusal(f"{self.refuse} Payment Required (injected)", self.refuse, {})

    def list_jobs(self, *, labels=None, status=None, namespace=None, token=None, timeout=None):
        self.api_calls.append("list_jobs")
        self.refused()
        labels = labels or {}
        self.lists += bool(self.submitted)  # the watch's polls (and the lists after a submission)
        if self.interrupt_after_lists is not None and self.lists > self.interrupt_after_lists:
            self.interrupt_after_lists = None
            raise KeyboardInterrupt
        return [job for job in self.jobs
                if all(job.labels.get(k) == v for k, v in labels.items())]

    def run_uv_job(self, script, *, script_args=None, image=None, flavor=None, timeout=None,
                   attempts=None, name=None, labels=None, secrets=None, namespace=None,
                   **kwargs):
        self.api_calls.append("run_uv_job")
        self.refused()
        assert attempts == 1 and not any("hf_" in a for a in script_args)
        shard = int(labels["ocr-shard"])
        attempt = sum(job.labels["ocr-shard"] == str(shard) for job in self.jobs) + 1
        fault = self.faults.get((shard, attempt))
        self.submitted.append({"script": script, "script_args": script_args, "image": image,
                               "flavor": flavor, "timeout": timeout, "name": name,
                               "labels": labels, "secrets": sorted(secrets), "fault": fault})
        home = self.root / f"home-{len(self.jobs)}"  # every Job starts on an empty disk
        home.mkdir()
        env = {**os.environ, **secrets, "HOME": str(home), "FAKE_HUB_ROOT": str(self.root)}
        command = [sys.executable, str(TESTS / "jobs_shard.py"), script, *script_args]
        job = FakeJob(self, f"job{len(self.jobs):03d}", command, labels, env, fault, self.hold)
        if not self.spawn:
            job.stage = lambda: "RUNNING"
            job.started_at = utc()
        self.jobs.append(job)
        return job

    def inspect_job(self, *, job_id, namespace=None, token=None):
        return next(job for job in self.jobs if job.id == job_id)

    def cancel_job(self, *, job_id, namespace=None, token=None):
        self.api_calls.append("cancel_job")
        job = self.inspect_job(job_id=job_id)
        job.cancelled = True
        if job.process is not None and job.process.poll() is None:
            job.process.kill()
            job.process.wait()

    def fetch_job_logs(self, *, job_id, namespace=None, tail=None, follow=False, token=None):
        self.api_calls.append("fetch_job_logs")
        lines = self.inspect_job(job_id=job_id).log.read_text().splitlines()
        return lines[-tail:] if tail else lines

    def stop(self) -> None:
        for job in self.jobs:
            if job.process is not None and job.process.poll() is None:
                job.process.kill()
                job.process.wait()


@pytest.fixture
def launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the launcher's lock
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecret")
    module = load_script(LAUNCHER)
    return module


RUN_DIGEST = "0123456789abcdef"  # the run's identity as a script's check prints it


def with_rows(module, monkeypatch, rows: int):
    """The launcher's check, answered as the script's --check-only answers (its own tests run
    it: test_the_scripts_check_*); here `uv run` would install the script's engine."""
    monkeypatch.setattr(module, "run_check", lambda *a: {"rows": rows, "run": RUN_DIGEST})


@pytest.fixture
def hub(tmp_path):
    made = []

    def make(rows: int = 9, **kwargs) -> FakeJobs:
        jobs = FakeJobs(tmp_path / "hub", **kwargs)
        jobs.paths = write_image_folder(tmp_path / "pages", rows)
        write_parquet_dataset(tmp_path / "hub" / INPUT / "data",
                              [p.read_bytes() for p in jobs.paths])
        made.append(jobs)
        return jobs

    yield make
    for jobs in made:
        jobs.stop()


def launch(module, jobs, stub, *extra, shards: int = 3) -> int:
    argv = [str(ROOT / SCRIPT), INPUT, OUTPUT, "--shards", str(shards), "--poll-seconds", "0.3",
            *extra, "--server", stub.url, "--part-rows", "2"]
    return module.main(argv, hf_api=jobs)


def assert_output_complete(jobs) -> None:
    ds = load_output(jobs.root / OUTPUT)
    assert ds["row_id"] == list(range(len(jobs.paths)))  # every row once, in order
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in jobs.paths]


def test_a_shard_that_keeps_failing_is_named(launcher, hub, stub_server, monkeypatch, capsys):
    jobs = hub(4, faults={(1, 1): "fail", (1, 2): "fail"})
    with_rows(launcher, monkeypatch, 4)
    assert launch(launcher, jobs, stub_server(), "--max-attempts", "2", shards=2) == 1
    err = capsys.readouterr().err
    assert "shards 1 still miss rows after 2 attempts" in err


def test_a_poll_the_hub_does_not_answer_is_asked_again(launcher, hub, stub_server, monkeypatch,
                                                       capsys):
    """A network blip while watching (the laptop's Wi-Fi): a traceback, the Jobs left running
    unnamed. Now said in a line, and the next poll goes on."""
    import httpx

    jobs, stub = hub(4, hold=1.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    listing, blips = jobs.list_jobs, [2]

    def flaky(**kwargs):
        if jobs.submitted and blips[0]:  # a poll while watching
            blips[0] -= 1
            raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution")
        return listing(**kwargs)
    monkeypatch.setattr(jobs, "list_jobs", flaky)
    assert launch(launcher, jobs, stub, shards=2) == 0
    err = capsys.readouterr().err
    assert "the Hub did not answer this poll (ConnectError" in err and "Traceback" not in err
    assert len(jobs.submitted) == 2
    assert_output_complete(jobs)


def test_a_claim_left_on_output_refuses_until_it_expires_or_its_launcher_is_gone(
        launcher, hub, stub_server, monkeypatch, capsys):
    """The claim of the launcher watching OUTPUT (.ocr/launcher/watching.json, on the Hub):
    another machine's refuses the run, naming its run and until when; an expired one, or one
    left by a launcher killed on this machine (kill -9: its pid is gone), is taken over."""
    import socket

    jobs, stub = hub(4), stub_server()
    with_rows(launcher, monkeypatch, 4)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = jobs.root / OUTPUT / ".ocr" / "launcher" / "watching.json"
    path.parent.mkdir(parents=True)
    claim = {"run": "20260101-000000-abcdef", "host": "another-machine", "pid": dead.pid,
             "id": "theirs", "since": time.time(), "until": time.time() + 600}
    path.write_text(json.dumps(claim))
    assert launch(launcher, jobs, stub, shards=2) == 2
    err = capsys.readouterr().err
    assert f"another launcher is watching {OUTPUT} (run 20260101-000000-abcdef, pid " \
           f"{dead.pid} on another-machine)" in err and f"holds {OUTPUT} until" in err
    assert jobs.submitted == []
    path.write_text(json.dumps({**claim, "until": time.time() - 1}))  # expired
    assert launch(launcher, jobs, stub, shards=2) == 0
    assert not path.exists()  # this launcher's own claim went when it stopped
    assert_output_complete(jobs)
    path.write_text(json.dumps({**claim, "host": socket.gethostname()}))  # killed here
    assert launch(launcher, jobs, stub, shards=2) == 0
    assert "adopting run" in capsys.readouterr().err and len(jobs.submitted) == 2


def test_ctrl_c_on_a_hub_that_hangs_ends_the_launcher_and_says_the_claim_expires(
        launcher, hub, stub_server, monkeypatch, capsys):
    """Ctrl-C while the Hub stops answering: the launcher deletes its claim in the background,
    waits RELEASE_WAIT_S at most, and ends, saying the claim expires by itself (it hung on the
    deletion before, with no way out but a second Ctrl-C and a traceback)."""
    jobs, stub = hub(4, hold=30.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    jobs.interrupt_after_lists = 1
    monkeypatch.setattr(launcher, "RELEASE_WAIT_S", 1.0)
    commit, hang = jobs.create_commit, threading.Event()

    def hangs_on_the_claims_deletion(repo_id, operations, **kwargs):
        if any(not hasattr(op, "path_or_fileobj") and op.path_in_repo.endswith("watching.json")
               for op in operations):
            hang.wait(60)
        return commit(repo_id, operations, **kwargs)
    monkeypatch.setattr(jobs, "create_commit", hangs_on_the_claims_deletion)
    started = time.monotonic()
    assert launch(launcher, jobs, stub, shards=2) == 130
    took = time.monotonic() - started
    hang.set()
    err = capsys.readouterr().err
    assert f"could not remove this launcher's claim on {OUTPUT} (no answer in 1 s)" in err
    assert "expires by itself in 15 min" in err and "Traceback" not in err
    assert took < 30, took


def test_cancel_cancels_every_job_of_the_run(launcher, hub, stub_server, monkeypatch, capsys):
    jobs, stub = hub(4, hold=30.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    jobs.interrupt_after_lists = 1
    assert launch(launcher, jobs, stub, shards=2) == 130
    assert launch(launcher, jobs, stub, "--cancel", shards=2) == 0
    assert [job.stage() for job in jobs.jobs] == ["CANCELED", "CANCELED"]
    assert "2 Jobs cancelled" in capsys.readouterr().err


@pytest.mark.parametrize("extra, shards, refuse, expected", [
    (["--restart"], 2, None, "--restart is not passed to the Jobs"),
    (["--num-shards", "4"], 2, None, "--num-shards is not passed"),
    ([], 0, None, "--shards must be at least 1"),
    ([], 5, None, "--shards 5 is more than the 4 rows"),
    ([], 2, 402, "the Jobs API refuses this account (402"),
    ([], 2, 403, "the Jobs API refuses this account (403"),
    (["--flavor", "a10g-smal"], 2, None, "flavor 'a10g-smal' is not one the Jobs API offers"),
    (["--run", "0123abcd"], 2, None, "--run names the run to cancel: it goes with --cancel"),
])
def test_refused_before_any_job(launcher, hub, stub_server, monkeypatch, capsys, extra, shards,
                                refuse, expected):
    jobs = hub(4, refuse=refuse)
    with_rows(launcher, monkeypatch, 4)
    assert launch(launcher, jobs, stub_server(), *extra, shards=shards) == 2
    assert expected in capsys.readouterr().err
    assert jobs.submitted == [] and not jobs.commits


def test_local_paths_and_no_token_are_refused(launcher, hub, stub_server, monkeypatch, tmp_path,
                                              capsys):
    jobs, stub = hub(4), stub_server()
    with_rows(launcher, monkeypatch, 4)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("OCR this")
    for argv, expected in [
        ([str(tmp_path / "pages"), OUTPUT], "INPUT"),
        ([INPUT, str(tmp_path / "out")], "OUTPUT"),
        ([INPUT, "./out"], "OUTPUT './out' is not a Hub dataset id: a Job cannot write to this "
                           "machine. Pass a new Hub dataset id (user/name) as OUTPUT"),  # no push
        ([INPUT, OUTPUT, "--prompt-file", str(prompt)], "names a local file"),
        ([INPUT, OUTPUT, "--model", str(tmp_path)], "names a local folder"),  # a fine-tune here
        ([INPUT, OUTPUT, f"--model={tmp_path}"], "names a local folder"),
        ([INPUT, OUTPUT, "--work-dir", "/data/x"], "/data is where the Jobs API mounts"),
    ]:
        code = launcher.main([str(ROOT / SCRIPT), *argv, "--shards", "2"], hf_api=jobs)
        assert code == 2 and expected in capsys.readouterr().err, argv
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(launcher, "hub_token", lambda args: None)
    assert launch(launcher, jobs, stub, shards=2) == 2
    assert "no Hub token" in capsys.readouterr().err
    assert jobs.submitted == []


def test_help_shows_the_examples_and_the_exit_status():
    """--help printed the options only: the docstring's examples and exit codes were unseen."""
    run = subprocess.run([sys.executable, str(ROOT / LAUNCHER), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "uv run ocr-jobs.py lighton-ocr3-saturate.py user/scans user/scans-ocr --shards 16 " \
        "--dry-run" in run.stdout
    assert "Exit status: 0 every shard is done (or INPUT has no rows); 1 shards with rows " \
        "left" in run.stdout
    assert "user/scans user/scans-ocr --cancel" in run.stdout  # no --shards, no flags


def test_a_script_without_check_only_is_named(launcher, hub, tmp_path, monkeypatch, capsys):
    """An older copy of a script, from before --check-only: said in one line, no Job."""
    jobs = hub(4)
    old = tmp_path / "old-ocr.py"
    old.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('input')\n"
                   "p.add_argument('output')\np.parse_args()\n")
    (tmp_path / "models.json").write_text(json.dumps({"scripts": [
        {"script": "old-ocr.py", "image": "vllm/vllm-openai:v0.26.0", "flavor": "l4x1",
         "timeout": "4h"}]}))
    monkeypatch.setattr(launcher, "CHECK_COMMAND", [sys.executable])
    code = launcher.main([str(old), INPUT, OUTPUT, "--shards", "2"], hf_api=jobs)
    assert code == 2
    assert "old-ocr.py does not know --check-only" in capsys.readouterr().err
    assert jobs.submitted == []


@needs_check_only
def test_the_scripts_check_refuses_before_any_job(launcher, hub, monkeypatch, capsys):
    """The script's own check (a bad flag value): its error, its exit code, no Job."""
    jobs = hub(4)
    monkeypatch.setattr(launcher, "CHECK_COMMAND", [sys.executable, str(TESTS / "jobs_shard.py")])
    monkeypatch.setenv("FAKE_HUB_ROOT", str(jobs.root))
    code = launcher.main([str(ROOT / SCRIPT), INPUT, OUTPUT, "--shards", "2",
                          "--max-tokens", "0"], hf_api=jobs)
    assert code == 2 and "--max-tokens" in capsys.readouterr().err
    assert jobs.submitted == []


@needs_check_only
@pytest.mark.timeout(300)  # three launches, each with the script's own check, on a loaded machine
def test_the_scripts_check_counts_the_rows(launcher, hub, stub_server, monkeypatch):
    jobs, stub = hub(4), stub_server()
    monkeypatch.setattr(launcher, "CHECK_COMMAND", [sys.executable, str(TESTS / "jobs_shard.py")])
    monkeypatch.setenv("FAKE_HUB_ROOT", str(jobs.root))
    assert launch(launcher, jobs, stub, shards=5) == 2
    assert launch(launcher, jobs, stub, shards=2) == 0
    assert_output_complete(jobs)
    # the same command again (after Ctrl-C, or to finish a run): the check of OUTPUT's
    # manifest, which the shards wrote, is the shards' check, not an unsharded run's refusal
    submitted = len(jobs.submitted)
    assert launch(launcher, jobs, stub, shards=2) == 0
    assert len(jobs.submitted) == submitted
    assert_output_complete(jobs)


def test_dry_run_prints_the_submissions_and_the_estimate(launcher, hub, monkeypatch, capsys):
    jobs = hub(4)
    with_rows(launcher, monkeypatch, 120_000)
    code = launcher.main([str(ROOT / "lighton-ocr3-saturate.py"), INPUT, OUTPUT, "--shards", "4",
                          "--dry-run", "--max-tokens", "4096"], hf_api=jobs)
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("run_uv_job image=vllm/vllm-openai:v0.30.0 flavor=a10g-small") == 4
    assert "--num-shards 4 --shard-index 3" in out and "--max-tokens 4096" in out
    assert "hf_secretsecretsecret" not in out and "secrets=HF_TOKEN (values not shown)" in out
    assert "30000 per shard at 2.2 pages/s" in out
    assert "WARNING: a shard needs about" in out and "beyond its timeout 4h" in out
    assert "per 1,000 pages" in out and "nothing was submitted" in out
    assert jobs.submitted == [] and "whoami" not in jobs.api_calls
    code = launcher.main([str(ROOT / "hpd-parsing-saturate.py"), INPUT, OUTPUT, "--shards", "2",
                          "--dry-run"], hf_api=jobs)
    out = capsys.readouterr().out
    assert code == 0 and "run_job (install uv, fetch the script)" in out
    assert "image=ccr-2vdh3abv-pub.cnc.bj.baidubce.com/paddlepaddle/hpd-parsing-vllm:" \
           "latest-nvidia-gpu flavor=a10g-small timeout=4h" in out
    assert "no measured pages/s" in out


def test_hpd_parsing_runs_through_run_job_with_the_script_shipped(launcher, hub, monkeypatch):
    jobs = hub(4)
    with_rows(launcher, monkeypatch, 4)
    sent = []
    jobs.run_job = lambda **kwargs: sent.append(kwargs) or types.SimpleNamespace(
        id=f"hpd{len(sent)}", labels=kwargs["labels"], status=types.SimpleNamespace(
            stage="RUNNING", message=None), created_at=utc(), started_at=utc(), finished_at=None)
    pressed = []

    def list_jobs(**kwargs):  # Ctrl-C once, in the watch loop, after both submissions
        if len(sent) == 2 and not pressed:
            pressed.append(True)
            raise KeyboardInterrupt
        return []

    jobs.list_jobs = list_jobs
    code = launcher.main([str(ROOT / "hpd-parsing-saturate.py"), INPUT, OUTPUT, "--shards", "2"],
                         hf_api=jobs)
    assert code == 130 and len(sent) == 2
    shipped = jobs.root / OUTPUT / ".ocr" / "launcher" / "hpd-parsing-saturate.py"
    assert shipped.read_bytes() == (ROOT / "hpd-parsing-saturate.py").read_bytes()
    first = sent[0]
    assert first["image"].endswith("hpd-parsing-vllm:latest-nvidia-gpu")
    assert first["attempts"] == 1 and first["secrets"] == {"HF_TOKEN": "hf_secretsecretsecret"}
    assert first["command"][:2] == ["bash", "-lc"] and "pip install -q uv" in first["command"][2]
    assert "--shard-index 0" in first["command"][2] and "hf_secret" not in first["command"][2]
    assert first["env"]["SCRIPT_URL"].endswith("/.ocr/launcher/hpd-parsing-saturate.py")


class Clock:
    """Simulated time for the launcher's watch loop: sleeps advance it at once."""

    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def strftime(self, fmt):
        return time.strftime(fmt)


def test_watching_50_shards_costs_at_most_6_api_calls_a_minute(launcher, hub, monkeypatch,
                                                               capsys):
    jobs = hub(4, spawn=False)
    with_rows(launcher, monkeypatch, 5000)
    clock = Clock()
    monkeypatch.setattr(launcher, "time", clock)
    jobs.interrupt_after_lists = 41  # 20 minutes of polls, then Ctrl-C
    stamps = []
    calls = jobs.api_calls
    jobs.api_calls = type("Recorder", (list,), {"append": lambda self, name: (
        stamps.append((clock.now, name)), list.append(self, name))})(calls)
    argv = [str(ROOT / SCRIPT), INPUT, OUTPUT, "--shards", "50"]
    assert launcher.main(argv, hf_api=jobs) == 130
    # the calls after the last submission (the fake clock has not moved while it submitted:
    # the calls before it, at the same time, are no part of watching)
    start = max(i for i, (t, name) in enumerate(stamps) if name == "run_uv_job")
    watching = [t for t, name in stamps[start + 1:] if name in (
        "list_jobs", "list_repo_files", "hf_hub_download", "fetch_job_logs")]
    worst = max(sum(t0 <= t < t0 + 60 for t in watching) for t0 in watching)
    minutes = (watching[-1] - watching[0]) / 60
    assert worst <= 6 and minutes >= 19
    print(f"watching 50 shards: at most {worst} API calls in any minute "
          f"({len(watching)} over {minutes:.0f} min)", file=sys.__stderr__)


# ---------------------------------------------------------------------------- issue #41


def rows_of_output(jobs) -> list:
    return load_output(jobs.root / OUTPUT)["markdown"]


@pytest.mark.timeout(400)  # Jobs of the script in a row, on a loaded machine
def test_a_shard_whose_rows_failed_on_the_server_is_submitted_again(
        launcher, hub, stub_server, monkeypatch, capsys):
    """Issue #41 item 1: the server fails a page (500, --max-retries 0): its Job ends COMPLETED
    with an error row of kind `server`, which the launcher called done (exit 0, a row without
    text). A shard is done when every row has text, a skip reason or a final error; the shard
    with the server-error row is submitted again, and the run ends with every text."""
    jobs, stub = hub(4), stub_server("--fail-first", "1")
    with_rows(launcher, monkeypatch, 4)
    assert launch(launcher, jobs, stub, "--max-retries", "0", shards=2) == 0
    err = capsys.readouterr().err
    assert "with 1 rows failed on the server's side (error_kind server): submitting it " \
        "again" in err, err
    assert len(jobs.submitted) == 3  # the shard with the failed row, once more
    assert_output_complete(jobs)


@pytest.mark.parametrize("script", ["ovis-ocr2-server.py", "lighton-ocr3.py"])
def test_the_launcher_judges_a_shard_by_the_scripts_own_rule(launcher, script):
    """One question, one answer (which rows a rerun redoes): the launcher runs the script's own
    rows_to_redo, read from the script's text, not a copy of its rule; an edit of the rule in the
    script changes the launcher's judgement too."""
    text = (ROOT / script).read_text()
    note = {"errors": {"3": "server", "4": "page"}, "blank": [5], "text_layer": 0}
    notes, files = {"part-000000000-000000008.parquet": note}, \
        ["data/part-000000000-000000008.parquet", "data/part-000000008-000000016.parquet"]
    rule = launcher.script_function(text, "rows_to_redo")
    assert launcher.server_error_rows(notes, files, 0, 8, rule) == [3]
    assert launcher.server_error_rows(notes, files, 4, 8, rule) == []  # another shard's row
    assert load_script(script).rows_to_redo(note, 0, 8) == [3]  # what the script's plan redoes
    assert load_script(script).rows_to_redo(note, 0, 8, True, True) == [3, 4, 5]
    edited = text.replace("(kind == SERVER or retry_errors)", '(kind in (SERVER, "page") or retry_errors)')
    assert edited != text
    assert launcher.server_error_rows(
        notes, files, 0, 8, launcher.script_function(edited, "rows_to_redo")) == [3, 4]
    with pytest.raises(launcher.UsageError, match="defines no rows_to_redo"):
        launcher.script_function(text.replace("def rows_to_redo(", "def other_rule("), "rows_to_redo")


@pytest.mark.timeout(400)  # Jobs of the script in a row, on a loaded machine
def test_rows_left_after_the_attempts_are_named_and_the_same_command_goes_on(
        launcher, hub, stub_server, monkeypatch, capsys):
    """Issue #41 item 1: with the attempts spent and a server-error row left, exit 1 naming the
    shard's rows; the same command again (the server healthy now) submits that shard only,
    and ends with every text."""
    jobs, stub = hub(4), stub_server("--fail-first", "1")
    with_rows(launcher, monkeypatch, 4)
    assert launch(launcher, jobs, stub, "--max-retries", "0", "--max-attempts", "1",
                  shards=2) == 1
    err = capsys.readouterr().err
    left = [i for i in (0, 1) if f"  shard {i}: rows " in err]
    assert len(left) == 1 and "failed on the server's side (error_kind server)" in err, err
    assert "rerun this same command: it goes on with these rows only" in err
    assert rows_of_output(jobs).count(None) == 1
    first = len(jobs.submitted)
    assert launch(launcher, jobs, stub, "--max-retries", "0", "--max-attempts", "1",
                  shards=2) == 0
    again = jobs.submitted[first:]
    assert sorted(int(s["labels"]["ocr-shard"]) for s in again) == left
    assert_output_complete(jobs)


def resubmit_as_another_launcher(jobs, shard: int):
    """What launcher A does (its shard's earlier Job, submitted again with the run's labels)."""
    earlier = next(s for s in jobs.submitted if s["labels"]["ocr-shard"] == str(shard))
    jobs.run_uv_job(earlier["script"], script_args=earlier["script_args"],
                    image=earlier["image"], flavor=earlier["flavor"], timeout=earlier["timeout"],
                    attempts=1, name=earlier["name"],
                    labels={**earlier["labels"], "ocr-submission": "by-a"},
                    secrets={"HF_TOKEN": "hf_secretsecretsecret"})


@pytest.mark.parametrize("when", ["while_b_checks", "while_b_watches"])
def test_a_job_another_launcher_submitted_is_adopted_never_doubled(
        launcher, hub, stub_server, monkeypatch, capsys, when):
    """Issue #41 item 2: launcher B lists OUTPUT's Jobs; launcher A resubmits its failed shard 0
    while B checks the run (or after B took the claim, A's submission in flight), then stops.
    B listed the Jobs before: it submitted shard 0 a second time beside A's live Job. Now B
    lists them again once it holds the claim, and adopts any Job with the run's labels while
    it watches."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    jobs.interrupt_after_lists = 1
    assert launch(launcher, jobs, stub, shards=2) == 130  # A: 2 Jobs, then Ctrl-C
    jobs.jobs[0].stage = lambda: "ERROR"  # A's shard 0 dies
    capsys.readouterr()
    if when == "while_b_checks":
        def check(*args):
            resubmit_as_another_launcher(jobs, 0)
            return {"rows": 4, "run": RUN_DIGEST}
        monkeypatch.setattr(launcher, "run_check", check)
    else:
        listing, lists = jobs.list_jobs, []

        def list_jobs(**kwargs):
            lists.append(1)
            if len(lists) == 3:  # B's first poll (after the check's list and the claim's)
                resubmit_as_another_launcher(jobs, 0)
            return listing(**kwargs)
        monkeypatch.setattr(jobs, "list_jobs", list_jobs)
    jobs.interrupt_after_lists = jobs.lists + 4  # B: two polls, then Ctrl-C
    assert launch(launcher, jobs, stub, shards=2) == 130
    err = capsys.readouterr().err
    assert len(jobs.submitted) == 3, err  # A's two, A's again: none of B's
    assert [job.labels["ocr-shard"] for job in jobs.jobs] == ["0", "1", "0"]
    assert f"interrupted: the Jobs keep running ({jobs.jobs[2].id}, {jobs.jobs[1].id})" in err


def test_cancel_needs_only_script_input_and_output(launcher, hub, stub_server, monkeypatch,
                                                   capsys):
    """Issue #41 item 3: a run launched with script flags (--max-tokens 900) and the
    docstring's `--cancel` (no --shards, no flags): "0 Jobs cancelled" before (or argparse's
    refusal), both Jobs billing on."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    jobs.interrupt_after_lists = 1
    assert launch(launcher, jobs, stub, "--max-tokens", "900", shards=2) == 130
    assert launcher.main([str(ROOT / SCRIPT), INPUT, OUTPUT, "--cancel"], hf_api=jobs) == 0
    assert [job.stage() for job in jobs.jobs] == ["CANCELED", "CANCELED"]
    assert "2 Jobs cancelled" in capsys.readouterr().err


def legacy_labels(shard: int, script_args: list[str], shards: int = 2) -> dict:
    """The labels ocr-jobs.py gave a Job before the run's identity (issue #41 item 3): the run
    named by the words typed (sha1 of script, input, output, shards, script arguments)."""
    import hashlib

    words = [SCRIPT, INPUT, OUTPUT, str(shards), *script_args]
    fingerprint = hashlib.sha1("\0".join(words).encode()).hexdigest()[:12]
    return {"ocr-jobs": f"20260101-000000-{fingerprint[:6]}", "ocr-run": fingerprint,
            "ocr-output": "user-scans-ocr", "ocr-shard": str(shard),
            "ocr-script": "ovis-ocr2-server"}


def submit_legacy(jobs, stub, shard: int, shards: int = 2) -> None:
    script_args = ["--server", stub.url, "--part-rows", "2"]
    jobs.run_uv_job(str(ROOT / SCRIPT), script_args=[INPUT, OUTPUT, *script_args],
                    image="vllm/vllm-openai:v0.26.0", flavor="l4x1", timeout="4h", attempts=1,
                    name=f"ocr-ovis-ocr2-server-{shard}-of-{shards}",
                    labels=legacy_labels(shard, script_args, shards),
                    secrets={"HF_TOKEN": "hf_secretsecretsecret"})


def test_jobs_labelled_before_the_run_identity_are_adopted_and_cancelled(
        launcher, hub, stub_server, monkeypatch, capsys):
    """Issue #41 item 3: Jobs an older launcher left (labelled by the words typed) are adopted
    by the same command, and `--cancel` finds them; beside another run's Jobs, `--cancel`
    asks which (--run), and cancels only the one named."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    submit_legacy(jobs, stub, 0)
    submit_legacy(jobs, stub, 1)
    jobs.interrupt_after_lists = jobs.lists + 3
    assert launch(launcher, jobs, stub, shards=2) == 130
    err = capsys.readouterr().err
    assert "adopting run 20260101-000000-" in err and len(jobs.submitted) == 2, err
    # another run of the script on OUTPUT (other flags): its Job
    jobs.run_uv_job(str(ROOT / SCRIPT), script_args=[INPUT, OUTPUT], image="i", flavor="l4x1",
                    timeout="4h", attempts=1, name="x", secrets={"HF_TOKEN": "hf_x"},
                    labels={"ocr-jobs": "20260102-000000-fedcba", "ocr-identity": "f" * 16,
                            "ocr-output": "user-scans-ocr", "ocr-input": "user-scans",
                            "ocr-shard": "0", "ocr-script": "ovis-ocr2-server"})
    cancel = [str(ROOT / SCRIPT), INPUT, OUTPUT, "--cancel"]
    assert launcher.main(cancel, hf_api=jobs) == 2
    err = capsys.readouterr().err
    assert f"2 runs of {SCRIPT} have Jobs running on {OUTPUT}" in err and "--run ffff" in err
    fingerprint = jobs.jobs[0].labels["ocr-run"]
    assert launcher.main([*cancel, "--run", fingerprint[:8]], hf_api=jobs) == 0
    assert [job.stage() for job in jobs.jobs] == ["CANCELED", "CANCELED", "SCHEDULING"]
    assert launcher.main(cancel, hf_api=jobs) == 0  # one run left: no --run needed
    assert jobs.jobs[2].stage() == "CANCELED"


@needs_check_only
def test_a_run_is_the_scripts_identity_not_the_words_typed(launcher, hub, stub_server,
                                                          monkeypatch, capsys):
    """Issue #41 item 3: `--max-tokens=900` or the flags in another order counted as another
    run (refused, or every shard submitted again). The run is what the script's manifest
    compares, its --check-only digest: the same run however spelled is adopted; another value
    is another run."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    monkeypatch.setattr(launcher, "CHECK_COMMAND", [sys.executable, str(TESTS / "jobs_shard.py")])
    monkeypatch.setenv("FAKE_HUB_ROOT", str(jobs.root))
    jobs.interrupt_after_lists = 1
    assert launch(launcher, jobs, stub, "--max-tokens", "900", "--no-sanity-check",
                  shards=2) == 130
    identity = jobs.jobs[0].labels["ocr-identity"]
    assert len(identity) == 16
    capsys.readouterr()
    jobs.interrupt_after_lists = jobs.lists + 3
    assert launch(launcher, jobs, stub, "--no-sanity-check", "--max-tokens=900", shards=2) == 130
    err = capsys.readouterr().err
    assert "adopting run" in err and len(jobs.submitted) == 2, err
    assert launch(launcher, jobs, stub, "--max-tokens", "901", shards=2) == 2
    assert "another launch (run" in capsys.readouterr().err and len(jobs.submitted) == 2


def test_ctrl_c_while_the_claim_is_committed_leaves_no_claim(launcher, hub, stub_server,
                                                             monkeypatch, capsys):
    """Issue #41 (low): Ctrl-C while the claim's commit is on its way (it landed, the answer
    did not): the claim stayed, holding OUTPUT for 15 minutes on other machines."""
    jobs, stub = hub(4), stub_server()
    with_rows(launcher, monkeypatch, 4)
    commit = jobs.create_commit

    def interrupted_after_landing(repo_id, operations, **kwargs):
        done = commit(repo_id, operations, **kwargs)
        if any(getattr(op, "path_in_repo", "").endswith("watching.json") and
               hasattr(op, "path_or_fileobj") for op in operations):
            raise KeyboardInterrupt
        return done
    monkeypatch.setattr(jobs, "create_commit", interrupted_after_landing)
    assert launch(launcher, jobs, stub, shards=2) == 130
    err = capsys.readouterr().err
    assert not (jobs.root / OUTPUT / ".ocr" / "launcher" / "watching.json").exists(), err
    assert jobs.submitted == [] and "Traceback" not in err


def test_ctrl_c_while_submitting_names_the_job_in_flight(launcher, hub, stub_server,
                                                         monkeypatch, capsys):
    """Issue #41 (low): Ctrl-C while shard 1's submission is answered (the Job created): its
    Job was missing from the Jobs named as left running."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    submit = jobs.run_uv_job

    def interrupted_on_the_second(*args, **kwargs):
        job = submit(*args, **kwargs)
        if len(jobs.jobs) == 2:
            raise KeyboardInterrupt
        return job
    monkeypatch.setattr(jobs, "run_uv_job", interrupted_on_the_second)
    assert launch(launcher, jobs, stub, shards=2) == 130
    err = capsys.readouterr().err
    assert f"the Jobs keep running ({jobs.jobs[0].id}, {jobs.jobs[1].id})" in err, err


def test_the_shards_advice_counts_each_jobs_start_up(launcher, hub, monkeypatch, capsys):
    """Issue #41 (low): 60,500 rows on lighton-ocr3-saturate.py got "--shards 2 or more", and 2
    shards need 4h04m each (every Job pays its start-up). The shards advised now fit."""
    jobs = hub(4)
    with_rows(launcher, monkeypatch, 60_500)

    def dry_run(shards: int) -> str:
        argv = [str(ROOT / "lighton-ocr3-saturate.py"), INPUT, OUTPUT, "--shards", str(shards),
                "--dry-run"]
        assert launcher.main(argv, hf_api=jobs) == 0
        return capsys.readouterr().out

    import re

    advised = int(re.search(r"--shards (\d+) or more", dry_run(1)).group(1))
    assert "WARNING" not in dry_run(advised)
    assert "WARNING" in dry_run(advised - 1)  # and no more than it takes


def test_two_live_jobs_for_one_shard_keep_the_older_and_cancel_the_newer(
        launcher, hub, stub_server, monkeypatch, capsys):
    """Issue #41 (review): two live Jobs for the same rows (a submission the Hub listed only
    after it was sent again, or two launchers at one instant) bill the rows twice: the
    launcher watching them cancels the newer, and submits nothing."""
    jobs, stub = hub(4, hold=3600.0), stub_server()
    with_rows(launcher, monkeypatch, 4)
    jobs.interrupt_after_lists = 1
    assert launch(launcher, jobs, stub, shards=2) == 130
    resubmit_as_another_launcher(jobs, 0)  # shard 0 twice, both waiting for a GPU
    capsys.readouterr()
    jobs.interrupt_after_lists = jobs.lists + 4
    assert launch(launcher, jobs, stub, shards=2) == 130
    err = capsys.readouterr().err
    assert [job.stage() for job in jobs.jobs] == ["SCHEDULING", "SCHEDULING", "CANCELED"], err
    assert f"Job {jobs.jobs[2].id} runs beside Job {jobs.jobs[0].id} for the same rows" in err
    assert len(jobs.submitted) == 3
