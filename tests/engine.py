"""Fixtures and helpers for the tests that drive the real vLLM engine on CPU."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
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


def builder_source(kind: str, source: str | None = None) -> str:
    """What tests/tiny_models.py builds `kind` from: its shared statements (everything but the
    `build_*` functions and the module docstring) and the `build_*` functions its BUILDERS entry
    reaches. A new builder leaves the other checkpoints' keys, so adding a model does not
    rebuild the others, and an edit of the docstring's guide rebuilds none."""
    source = source if source is not None else (TESTS / "tiny_models.py").read_text()
    tree = ast.parse(source)
    builders = {node.name: node for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name.startswith("build_")}
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "BUILDERS" for t in node.targets))
    entry = next(v for k, v in zip(table.keys, table.values) if ast.literal_eval(k) == kind)
    reached, todo = [], [entry]
    while todo:
        for name in (n.id for n in ast.walk(todo.pop()) if isinstance(n, ast.Name)):
            if name in builders and name not in reached:
                reached.append(name)
                todo.append(builders[name])
    docstring = tree.body[0] if ast.get_docstring(tree) else None  # prose: builds nothing
    shared = [ast.get_source_segment(source, node) for node in tree.body
              if node not in builders.values() and node is not table and node is not docstring]
    return "\n".join([*shared, ast.dump(entry), *(ast.get_source_segment(source, builders[name])
                                                  for name in sorted(reached))])


def tiny_model(kind: str) -> Path:
    """A tiny random checkpoint, cached by its builder's source (builder_source) so an edit
    rebuilds it, and only it."""
    digest = hashlib.sha1(builder_source(kind).encode()).hexdigest()[:10]
    target = TINY_ROOT / f"{kind}-{digest}"
    if not (target / "config.json").exists():
        # a folder of this process's own: two test runs may build the same checkpoint at once
        tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        built = subprocess.run([str(engine_env.python()), str(TESTS / "tiny_models.py"), kind,
                                str(tmp)], capture_output=True, text=True,
                               env=engine_env.engine_environ())
        assert built.returncode == 0, f"tests/tiny_models.py {kind} failed:\n{built.stderr[-3000:]}"
        try:
            tmp.rename(target)
        except OSError:  # the other run finished first: its checkpoint is the same
            shutil.rmtree(tmp, ignore_errors=True)
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
