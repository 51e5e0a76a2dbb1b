"""Fixtures and helpers for the tests that drive the real vLLM engine on CPU."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import engine_env
from conftest import ROOT, TESTS

REQUIRE_ENGINE = os.environ.get("OCR_REQUIRE_ENGINE") == "1"  # set by .ci/run: never skip there
TINY_ROOT = engine_env.CACHE_ROOT / "tiny-models"


def engine_or_skip() -> Path:
    try:
        return engine_env.build()
    except engine_env.EngineUnavailable as exc:
        if REQUIRE_ENGINE:
            pytest.fail(f"the CPU vLLM engine is required here but unavailable: {exc}")
        pytest.skip(f"CPU vLLM engine unavailable: {exc}")


def tiny_model(kind: str) -> Path:
    """A tiny random checkpoint, cached by the builder's source so an edit rebuilds it."""
    digest = hashlib.sha1((TESTS / "tiny_models.py").read_bytes()).hexdigest()[:10]
    target = TINY_ROOT / f"{kind}-{digest}"
    if not (target / "config.json").exists():
        tmp = target.with_name(target.name + ".tmp")
        subprocess.run([str(engine_env.python()), str(TESTS / "tiny_models.py"), kind, str(tmp)],
                       check=True, capture_output=True, env=engine_env.engine_environ())
        tmp.rename(target)
    return target


def vllm_check(command: str, payload: dict, model: Path | None = None,
               env: dict | None = None) -> dict:
    """tests/vllm_checks.py in the engine's Python; `env` (tests/pinned_vllm.py) may put a
    pinned release's `vllm` first on the path. Fails the test when the checker itself fails."""
    extra = {"CHECK_MODEL": str(model)} if model else {}
    result = subprocess.run([str(engine_env.python()), str(TESTS / "vllm_checks.py"), command,
                             json.dumps(payload)], capture_output=True, text=True,
                            env={**(env or engine_env.engine_environ()), **extra}, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, f"vllm_checks.py failed:\n{result.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def run_driver(script: str, *args: str, timeout: float = 900, extra_env: dict | None = None,
               python: str | None = None) -> subprocess.CompletedProcess:
    """Run a script with the engine's `vllm` on PATH, as on a GPU machine with vllm."""
    return subprocess.run([python or sys.executable, str(ROOT / script), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=engine_env.engine_environ(extra_env))


def vllm_serve_pids(port: int) -> list[int]:
    """Process ids of `vllm serve ... --port PORT` (the group leaders the drivers spawn)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            words = [w.decode() for w in (proc / "cmdline").read_bytes().split(b"\0") if w]
        except OSError:
            continue
        if "serve" in words[:4] and any(w.endswith("vllm") for w in words[:3]) \
                and "--port" in words and words[words.index("--port") + 1] == str(port):
            pids.append(int(proc.name))
    return pids


class RunningServer:
    """`vllm serve` started by a test (for tests that reuse a server via --server)."""

    def __init__(self, model: Path, port: int, serve_args: list[str], log: Path,
                 env: dict | None = None):
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}"
        command = ["vllm", "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                   *serve_args]
        self.process = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                        env=env or engine_env.engine_environ(),
                                        start_new_session=True)

    def wait(self, timeout: float = 600) -> None:
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vllm serve not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
