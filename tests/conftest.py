"""Shared fixtures: load a script as a module, make page images, start the stub server."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from pages import page_image  # noqa: F401  (re-exported for the tests)

ROOT = Path(__file__).resolve().parent.parent
# A suite started in the background of a script (`.ci/run &`, a CI runner) inherits SIGINT
# ignored from the shell, and so would every process a test starts: Python then never raises
# KeyboardInterrupt, and a launcher a test presses Ctrl-C on runs on (three test_jobs_http tests
# waited 60 to 90 s for one). The tests press Ctrl-C as a user's terminal does: the test
# processes take SIGINT back, for themselves and for what they start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# One datasets cache for the whole session, shared by the tests and the scripts they start, as a
# user has one: outputs must load fresh through it (same folder names, resumed outputs).
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="ocr-tests-datasets-"))
TESTS = ROOT / "tests"
# Figures the engine tests measure, printed at the end of the run. The xdist workers inherit
# this file's path from the controller, which prints it.
if "OCR_TEST_FIGURES" not in os.environ:
    os.environ["OCR_TEST_FIGURES"] = tempfile.mkstemp(prefix="ocr-test-figures-", suffix=".txt")[1]
# A top-level script that is a tool of the collection, not a model script (ocr-compare.py),
# says so with this line; it has no models.json entry, no helper blocks, no engine case.
TOOL_MARKER = re.compile(r'^SCRIPT_KIND = "tool"$', re.M)


def is_tool_script(path: Path) -> bool:
    return bool(TOOL_MARKER.search(path.read_text()))


TOOL_SCRIPTS = sorted(p.name for p in ROOT.glob("*.py") if is_tool_script(p))
ALL_SCRIPTS = sorted(p.name for p in ROOT.glob("*.py") if not is_tool_script(p))  # model scripts
SERVER_SCRIPTS = sorted(name for name in ALL_SCRIPTS
                        if name.endswith(("-server.py", "-saturate.py")))
_loaded: dict[str, object] = {}


def _sigint_state() -> tuple:
    return (signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.fixture(autouse=True)
def sigint_reaches_the_processes_a_test_starts():
    """As above, for what a test leaves in this worker: SIGINT ignored or blocked in it would be
    inherited by every process a later test starts. It is undone, and named in a warning."""
    yield
    ignored, blocked = _sigint_state()
    if ignored or blocked:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        warnings.warn(f"this test left SIGINT {'ignored' if ignored else 'blocked'} in the "
                      f"test process; restored")


def load_script(name: str):
    """Import a top-level script (hyphenated file name) as a module, once."""
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(name.replace("-", "_")[:-3], ROOT / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def write_image_folder(folder: Path, count: int, fmt="PNG") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"page_{i:04d}.{fmt.lower()}"
        path.write_bytes(page_image(i, fmt=fmt))
        paths.append(path)
    return paths


def write_parquet_dataset(folder: Path, cells: list, extra: dict | None = None) -> Path:
    """A parquet file with an Image column holding the given bytes/None cells."""
    import datasets

    features = {"image": datasets.Image(), "row_id": datasets.Value("int64")}
    data = {"image": [None if c is None else {"bytes": c, "path": None} for c in cells],
            "row_id": list(range(len(cells)))}
    for name, values in (extra or {}).items():
        data[name] = values
        features[name] = datasets.Value("string")
    ds = datasets.Dataset.from_dict(data, features=datasets.Features(features))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "input.parquet"
    ds.to_parquet(str(path))
    return path


def expected_text(raw: bytes) -> str:
    """The stub's answer for a page sent as these exact bytes."""
    from stub_server import page_text

    return page_text(raw, decode=True)[0]


def whole_lines(path: Path) -> list[str]:
    """The lines another process has finished appending to path so far: a reader polling a file
    while it is written can see the start of a line whose end is not there yet."""
    text = path.read_text() if path.exists() else ""
    return text[:text.rfind("\n") + 1].splitlines()


class StubServer:
    def __init__(self, port: int, process: subprocess.Popen, log: Path):
        self.port, self.process, self.log = port, process, log
        self.url = f"http://127.0.0.1:{port}"

    def log_lines(self) -> list[str]:
        """What the stub printed (a refused request's reason: tests/stub_server.py, refuse)."""
        path = self.log.with_suffix(".stderr")
        return path.read_text().splitlines() if path.exists() else []

    def requests(self) -> list[dict]:
        import json
        return [json.loads(line) for line in whole_lines(self.log) if line]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def stub_server(tmp_path):
    """Factory: stub_server(--latency=..., ...) starts a stub on a free port."""
    started: list[StubServer] = []

    def start(*extra: str, port: int | None = None, wait: bool = True) -> StubServer:
        port = port or free_port()
        log = tmp_path / f"stub-{port}-{len(started)}.jsonl"
        with open(log.with_suffix(".stderr"), "wb") as stderr:  # the child keeps its own copy
            process = subprocess.Popen(
                [sys.executable, str(TESTS / "stub_server.py"), "--port", str(port),
                 "--request-log", str(log), *extra],
                stdout=subprocess.DEVNULL, stderr=stderr)
        server = StubServer(port, process, log)
        started.append(server)
        if wait:
            wait_port(port)
        return server

    yield start
    for server in started:
        server.stop()


def run_script(script: str, *args: str, env: dict | None = None, timeout: float = 300,
               python: str | None = None, python_args: list[str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a top-level script as a user would (a fresh process), capturing its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([python or sys.executable, *(python_args or []), str(ROOT / script), *args],
                          capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd)


def fake_vllm_env(tmp_path: Path, stub_args: str = "") -> dict:
    """PATH with the fake `vllm` (the stub) first; its invocations logged."""
    return {"PATH": f"{TESTS / 'fake_vllm'}{os.pathsep}{os.environ['PATH']}",
            "STUB_PYTHON": sys.executable, "STUB_ARGS": stub_args,
            "FAKE_VLLM_LOG": str(tmp_path / "fake-vllm.log")}


def load_output(folder: Path):
    """`datasets.load_dataset(OUTPUT)`, exactly as a user calls it: the session's one datasets
    cache (see the top of this file), images decoded by default."""
    import datasets

    return datasets.load_dataset(str(folder), split="train")


class FakeHub:
    """The HfApi calls an OutputStore makes, against a folder (no network here): a head that
    moves with each commit (a commit naming another parent is refused with 412), uploads that
    fail on demand, and a 429 with Retry-After for the first `refuse_first` attempts."""

    def __init__(self, root: Path, fail_uploads: bool = False, refuse_first: int = 0):
        self.root, self.fail_uploads, self.refuse_first = root, fail_uploads, refuse_first
        self.calls, self.commits, self.attempts, self.head = [], [], [], 0
        self.private: dict[str, bool] = {}  # repo -> its visibility, set when it is created

    @staticmethod
    def refusal(message: str, status: int, headers: dict) -> Exception:
        error = RuntimeError(message)
        error.response = type("Response", (), {"status_code": status, "headers": headers})()
        return error

    def create_repo(self, repo_id, repo_type=None, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private))
        if not (self.root / repo_id).exists():  # exist_ok: an existing repo keeps its own
            self.private[repo_id] = bool(private)
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)

    def repo_info(self, repo_id, repo_type=None):
        import types
        return types.SimpleNamespace(sha=f"head-{self.head}", private=self.private.get(repo_id))

    def list_repo_files(self, repo_id, repo_type=None, revision=None):
        base = self.root / repo_id
        return [str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()]

    def hf_hub_download(self, repo_id, filename, repo_type=None, local_dir=None):
        import shutil
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.root / repo_id / filename, target)
        return str(target)

    def create_commit(self, repo_id, operations, commit_message=None, repo_type=None,
                      parent_commit=None):
        import shutil
        self.attempts.append(time.monotonic())
        if self.fail_uploads:
            raise ConnectionError("hub unreachable (injected)")
        if len(self.attempts) <= self.refuse_first:
            raise self.refusal("429 Too Many Requests (injected)", 429, {"Retry-After": "1"})
        if parent_commit is not None and parent_commit != f"head-{self.head}":
            raise self.refusal("412 Precondition Failed: the head moved (injected)", 412, {})
        for op in operations:
            target = self.root / repo_id / op.path_in_repo
            if not hasattr(op, "path_or_fileobj"):  # a CommitOperationDelete
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(op.path_or_fileobj, bytes):  # as HfApi takes: a path, bytes, a file
                target.write_bytes(op.path_or_fileobj)
            else:
                shutil.copy(op.path_or_fileobj, target)
            self.calls.append(("upload_file", op.path_in_repo))
        self.head += 1
        self.commits.append([op.path_in_repo for op in operations])


def record_figure(line: str) -> None:
    """A figure an engine test measured (throughput, parity), for the end of the run's log."""
    with open(os.environ["OCR_TEST_FIGURES"], "a") as figures:
        figures.write(line + "\n")


def pytest_terminal_summary(terminalreporter):
    figures = Path(os.environ["OCR_TEST_FIGURES"]).read_text()
    if figures:
        terminalreporter.section("figures measured on the real engine")
        for line in figures.splitlines():
            terminalreporter.write_line(line)
