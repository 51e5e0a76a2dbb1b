"""The server scripts' options, and the server's settings a run records."""

import argparse
import contextlib
import os
import subprocess

from blocks.common.arguments import option
from blocks.common.secrets import flag_items
from blocks.model import DEFAULT_SERVER
from blocks.server.pipeline import Window

def add_server_arguments(parser: argparse.ArgumentParser, window=Window) -> None:
    group = parser.add_argument_group("server")
    option(group, "--server", default=DEFAULT_SERVER, identity=False, this_machine=True,
           help="vLLM server URL: reused when it answers, else started here if local (default: "
           "%(default)s)")
    option(group, "--api-key", identity=False, help="server API key (default: VLLM_API_KEY)")
    option(group, "--serve-args", default="", identity=False,  # its flags: run_identity
           help="extra `vllm serve` arguments, appended after the script's own so they override "
           "them, e.g. \"--max-model-len 16384\"")
    option(group, "--no-spawn", action="store_true", identity=False, this_machine=True,
           help="never start a server: wait for --server (up to --server-timeout)")
    option(group, "--server-timeout", type=float, above=0, default=1800.0, identity=False,
           help="seconds to wait for a server to be ready (default: 1800)")
    option(group, "--server-down-timeout", type=float, above=0, default=300.0, identity=False,
           help="seconds a server may go without answering (/health, a page) mid-run before "
           "the run stops (default: 300; rerun to resume)")
    option(group, "--max-restarts", type=int, at_least=0, default=3, identity=False,
           help="restarts of a spawned server that dies mid-run (default: 3)")
    option(group, "--request-timeout", type=float, above=0, default=900.0, identity=False,
           help="seconds for one page's answer (default: 900)")
    option(group, "--max-retries", type=int, at_least=0, default=4, identity=False,
           help="retries of a page after a timeout, 429 or 5xx (default: 4)")
    option(group, "--abort-after-failures", type=int, default=20, identity=False,
           help="stop after this many pages in a row fail on the server's side (5xx, timeouts) "
           "over --abort-after-seconds (default: 20)")
    option(group, "--abort-after-seconds", type=float, default=60.0, identity=False,
           help="see --abort-after-failures (default: 60)")
    window.add_arguments(parser, group)


PARALLEL_FLAGS = ("--data-parallel-size", "--tensor-parallel-size", "--pipeline-parallel-size",
                  "-dp", "-tp", "-pp")


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() not in ("", "-1")])
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    return 0


def serve_settings(serve_args: list[str]) -> dict:
    """The server's flags as the run's identity holds them (a bare flag: True)."""
    return {flag: values[0] if len(values) == 1 else values or True
            for flag, values, _ in flag_items(serve_args) if flag}
