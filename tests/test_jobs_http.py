"""ocr-jobs.py as a user runs it, over HTTP, with nothing monkeypatched: the launcher is a
process (`python ocr-jobs.py ...`, HF_ENDPOINT and HF_TOKEN set), the Hub is tests/
fake_hub_server.py (a local HTTP fake of the Hub's endpoints and of the Jobs API), each shard's
Job a real process of the model script against the stub server, its input a dataset repo of the
fake (a parquet pushed into it), the output read back with `datasets.load_dataset(OUTPUT)` by
another process, as a user reads it.

The faults of a real day, each carried by a test: 429 with Retry-After (test_a_run_...),
a shard that fails once, one stuck in SCHEDULING, one whose Job succeeds with rows missing
(test_failed_stuck_and_incomplete_...), Ctrl-C then adopt (test_ctrl_c_...), two launchers on
one output, on one machine and on two (test_a_second_launcher_...), a refused account
(test_a_refused_account_...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, expected_text, write_image_folder
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
        return subprocess.Popen(command, env=self.env(machine), cwd=self.tmp / machine,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, stub, *extra, timeout: float = 120, **kwargs) -> tuple[int, str, str]:
        process = self.launcher(stub, *extra, **kwargs)
        out, err = process.communicate(timeout=timeout)
        (self.tmp / f"launcher-{time.monotonic():.0f}.err").write_text(err)
        return process.returncode, out, err

    def load_output(self) -> dict:
        """`datasets.load_dataset(OUTPUT)` in a process of its own, as a user calls it."""
        code = ("import datasets, json; ds = datasets.load_dataset(%r, split='train'); "
                "print(json.dumps({'row_id': list(ds['row_id']), 'markdown': list(ds['markdown'])}))"
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


def test_a_run_over_three_jobs_writes_every_row_once(hub, stub_server, tmp_path):
    """The whole path over HTTP. The Hub answers 429 with Retry-After to the first two listings
    of Jobs (huggingface_hub waits and asks again) and to the first submission (the launcher
    waits as the Hub says, and submits again)."""
    fake, stub = hub(9), stub_server()
    fake.server.throttle.update({"list_jobs": 2, "run_job": 1})
    stats = tmp_path / "stats.json"
    code, out, err = fake.run(stub, "--stats-json", str(stats))
    assert code == 0, err
    fake.assert_output_complete()
    assert fake.shard_jobs() == {"0": 1, "1": 1, "2": 1}
    assert err.count("HTTP Error 429 thrown while requesting GET") == 2  # huggingface_hub's wait
    assert "answered 429 to run_uv_job: waiting 1 s" in err  # the Hub's Retry-After, honoured
    spec = fake.server.jobs[0].spec
    assert spec["dockerImage"] == "vllm/vllm-openai:v0.26.0" and spec["flavor"] == "l4x1"
    assert spec["timeoutSeconds"] == 4 * 3600 and spec["attempts"] == 1
    assert spec["secrets"] == {"HF_TOKEN": TOKEN} and TOKEN not in json.dumps(spec["command"])
    assert spec["command"][:3] == ["uv", "run", f"/data/{SCRIPT}"]
    figures = json.loads(stats.read_text())
    assert figures["rows_done"] == figures["rows_total"] == 9 and figures["card_rows"] == 9
    assert figures["cost_usd"] is not None
