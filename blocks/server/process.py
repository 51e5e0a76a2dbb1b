"""The vLLM server process: reused, or started under a watchdog, watched, stopped."""

import asyncio
import contextlib
import httpx
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

from blocks.common.errors import EXIT_REFUSED, EXIT_USAGE, fail, log, RunAborted
from blocks.common.inputs import requested_revision, resolved_revision
from blocks.common.jobs_command import jobs_advice, rerun_advice
from blocks.common.manifest import check_context_budget
from blocks.common.saving import HeldFailures
from blocks.common.secrets import (
    flag_items, flag_words, is_secret, redact_argv, redact_text, secret_literals,
)
from blocks.common.stats import RunStats
from blocks.model import SERVE_ENV, spawn_args
from blocks.model import JOB_IMAGE
from blocks.server.arguments import PARALLEL_FLAGS, visible_gpus
from blocks.server.serve_args import (
    effective_serve_args, option_name, serve_arg_value, serve_max_model_len, server_url_parts,
)

# Runs `vllm serve` in its own process group, its output to the driver (relay_log). When the
# driver dies without stopping it (kill -9, OOM), it notices within half a second, stops the
# group, then kills what is left (itself too).
SERVER_WATCHDOG = r"""
import os, signal, subprocess, sys, time
driver = os.getppid()
signal.signal(signal.SIGTERM, lambda *_: None)  # the driver's stop() signals the whole group
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
while server.poll() is None and os.getppid() == driver:
    time.sleep(0.5)
if server.poll() is None:  # the driver is gone
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    finally:
        os.killpg(0, signal.SIGKILL)
sys.exit(server.returncode if server.returncode >= 0 else 128 - server.returncode)
"""


def relay_log(output, log_file, known: set[str]) -> None:
    """The server's output into its log, secrets masked; never blocking on a full disk."""
    with output, log_file:
        for line in output:
            with contextlib.suppress(OSError):
                log_file.write(redact_text(line.decode(errors="surrogateescape"), known)
                               .encode(errors="surrogateescape"))


UNKNOWN_HOST = (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None))  # not a DNS hiccup
SILENT_PORT_S = 120.0  # connected, no HTTP answer this long: not vLLM (it listens once it answers)
HEALTH_EVERY_S = 10.0  # mid-run /health checks (at least 4 per --server-down-timeout)
REPORT_EVERY_S = 60.0  # while waiting for a server, a line this often


class ServerManager:
    """Reuse a server, wait for one that is starting, or start `vllm serve` and own it."""

    def __init__(self, args, log_dir: Path, window):  # window: its class, its serve flags
        self.args, (self.base, self.host, self.port) = args, server_url_parts(args.server)
        self.window = window
        self.log_path = log_dir / f"vllm-serve-{self.port}.log"
        self.may_spawn = self.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0") and \
            not args.no_spawn
        serve_args = effective_serve_args(args)
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or \
            serve_arg_value(serve_args, "--api-key") or None
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.model_name = serve_arg_value(serve_args, "--served-model-name") or args.model
        self.process: subprocess.Popen | None = None
        self.spawning = False  # plan()'s decision: start `vllm serve` here
        self.restarts, self.engines = 0, 1  # engines: data-parallel, of a server started here
        self.max_model_len = self.version = self.revision = None
        self.heard_at = time.monotonic()  # last passed a probe or /health, or answered a page
        self.silent_since: float | None = None  # connected, and no HTTP answer since
        self.asked_to_wait = False  # a 429/503's Retry-After was said
        self._lock = asyncio.Lock()

    def refused(self, what: str) -> RunAborted:
        return RunAborted(f"port {self.port} answers, but not as {what}: stop what uses the port, "
                          f"or pass --server with the vLLM server's URL (or a free port).",
                          EXIT_USAGE)

    def key_refused(self, status: int) -> RunAborted:
        hint = "the key sent is wrong" if self.api_key else "it wants one"
        return RunAborted(f"the server at {self.base} refuses the API key (HTTP {status}): "
                          f"{hint}: pass --api-key or set VLLM_API_KEY.", EXIT_REFUSED)

    async def probe(self, client, starting: bool = True) -> str:
        """"ready", "starting" (or no answer in time) or "absent"; RunAborted if it never will."""
        for attempt in range(2):  # a reset connection is tried once more before judging
            try:
                response = await client.get(f"{self.base}/v1/models", headers=self.headers,
                                            timeout=10)
                self.silent_since = None
                break
            except httpx.ReadTimeout:  # connected, no answer
                self.silent_since = self.silent_since or time.monotonic()
                if starting and time.monotonic() - self.silent_since >= SILENT_PORT_S:
                    raise RunAborted(f"port {self.port} accepts connections but has sent no HTTP "
                                     f"answer for {SILENT_PORT_S:.0f} s: not a vLLM server. Stop "
                                     f"what holds it, or pass --server a vLLM URL.", EXIT_USAGE)
                return "starting"
            except httpx.TimeoutException:
                return "starting"
            except httpx.HTTPError as exc:
                cause = exc  # TLS, or a host that DNS says does not exist, among its causes?
                while cause and not isinstance(cause, ssl.SSLError) and not (
                        isinstance(cause, socket.gaierror) and cause.errno in UNKNOWN_HOST):
                    cause = cause.__cause__ or cause.__context__
                if starting and cause:
                    raise RunAborted(f"cannot connect to {self.base} ({exc}): check the host and "
                                     f"scheme (http or https) of --server.", EXIT_USAGE) from None
                if isinstance(exc, httpx.ConnectError):
                    return "absent"
                if attempt:
                    raise self.refused(f"an HTTP server ({type(exc).__name__}: {exc}; for HTTPS, "
                                       f"write --server https://...)") from None
        status = response.status_code
        if status in (401, 403):
            raise self.key_refused(status)
        if status in (500, 502, 503, 504):
            return "starting"  # a proxy whose upstream boots, a server loading its model
        try:
            models = {m["id"]: m for m in response.json()["data"]} if status == 200 else None
        except (ValueError, KeyError, TypeError):
            models = None
        if models is None:
            raise self.refused(f"an OpenAI-compatible vLLM server (GET {self.base}/v1/models "
                               f"gave HTTP {status} without a model list)")
        if await self.health_problem(client, 5):
            return "starting"
        if self.model_name not in models:  # EXIT_REFUSED: it changed under a running job
            names = ", ".join(map(str, models)) or "no model"
            raise RunAborted(f"the server at {self.base} serves {names}, not {self.model_name}. "
                             f"Pass --model with the served name, or point --server elsewhere.",
                             EXIT_USAGE if starting else EXIT_REFUSED)
        self.max_model_len = models[self.model_name].get("max_model_len") or self.max_model_len
        self.heard_at = time.monotonic()
        return "ready"

    async def health_problem(self, client, timeout: float) -> str | None:
        """Why /health fails, or None. 404: an OpenAI-compatible proxy without one, passed."""
        try:
            response = await client.get(f"{self.base}/health", headers=self.headers,
                                        timeout=timeout)
        except httpx.TimeoutException:
            return f"no answer in {timeout:g} s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code in (200, 404) else f"HTTP {response.status_code}"

    async def watch(self, client, stats: RunStats, storm: HeldFailures) -> None:
        """Stop the run once the server is down for --server-down-timeout."""
        limit = self.args.server_down_timeout
        every = min(HEALTH_EVERY_S, limit / 4)
        while True:
            await asyncio.sleep(every)
            problem = await self.health_problem(client, every)
            if problem is None:
                self.heard_at = time.monotonic()
            elif time.monotonic() - self.heard_at >= limit:
                storm.stop(f"the server at {self.base} has failed /health ({problem}) and "
                           f"answered no page for {time.monotonic() - self.heard_at:.0f} s "
                           f"(--server-down-timeout), with {stats.in_flight} pages in flight")

    def waiting_on(self, state: str) -> str:
        if self.process is not None:
            return f"vllm serve, started here, is loading (its log: {self.log_path})"
        if self.silent_since is not None:
            return "it accepts connections but has sent no HTTP answer"
        return "it answers, not ready yet" if state == "starting" else \
            "it does not answer yet (`vllm serve` opens its port once the model is loaded)"

    async def plan(self) -> None:
        """Before the input is read: use a ready server, wait for one, or decide to start one."""
        async with httpx.AsyncClient() as client:
            state = await self.probe(client)
        self.spawning = state == "absent" and self.may_spawn
        # a server waited for (no max_model_len yet) is checked at start
        check_context_budget(serve_max_model_len(self.args) if self.spawning else
                             self.max_model_len, self.args, self.budget_option)
        if not self.spawning:
            head = f"using the vLLM server already running at {self.base} ({self.model_name}" \
                if state == "ready" else f"the server at {self.base}: " \
                f"{self.waiting_on(state)}; the run will be waiting for that URL (up to " \
                f"{self.args.server_timeout:.0f} s, --server-timeout"
            return log(f"{head}; not started by this run; it will be left running)")
        if shutil.which("vllm") is None:
            local = "`pip install vllm` on a machine with a GPU" \
                if JOB_IMAGE.startswith("vllm/vllm-openai:") else \
                f"run it inside {JOB_IMAGE} (the vendor's vLLM, the only one for this model)"
            fail(f"nothing answers at {self.base} and there is no `vllm` command here to start a "
                 f"server.\n\nRun it on Hugging Face Jobs:\n{jobs_advice()}\n\n"
                 f"or locally: {local}, then rerun the same command; or pass --server URL to use "
                 f"a running server.")

    async def start(self, client, stats: RunStats) -> None:
        """Act on plan()'s decision; return once the server is ready."""
        started = time.monotonic()
        if self.spawning:
            self.spawn()
        await self.wait_ready(client, self.args.server_timeout)
        if self.process is not None:
            stats.server_startup_s = round(time.monotonic() - started, 2)
        check_context_budget(self.max_model_len, self.args, self.budget_option)
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            response = await client.get(f"{self.base}/version", headers=self.headers, timeout=5)
            self.version = stats.vllm_version = response.json().get("version")

    @property
    def budget_option(self) -> str:
        """What raises max_model_len: this run's --serve-args, or the server's own flag."""
        return "--max-model-len in --serve-args" if self.spawning else \
            "the server's --max-model-len"

    def serve_command(self) -> list[str]:
        command = ["vllm", "serve", self.args.model, "--host", self.host, "--port", str(self.port)]
        self.revision = resolved_revision(self.args)  # what this server loads, and the record
        if revision := self.revision or requested_revision(self.args):
            command += ["--revision", revision]
        serve_args = effective_serve_args(self.args)
        # one engine per GPU (a multi-GPU flavor is paid for every one), unless told otherwise
        told = any(serve_arg_value(serve_args, flag) for flag in PARALLEL_FLAGS)
        self.engines = 1 if told else max(1, visible_gpus())
        parallel = ["--data-parallel-size", str(self.engines)] if self.engines > 1 else []
        return command + self.window.serve_args(self.args, serve_args) + parallel + serve_args

    def spawn(self) -> None:
        """Start `vllm serve` under SERVER_WATCHDOG; secrets go through its env, not its argv."""
        argv = self.serve_command() + spawn_args(self.args)
        secrets = {"VLLM_API_KEY": self.api_key,
                   "HF_TOKEN": self.args.hf_token or serve_arg_value(argv, "--hf-token")}
        command = flag_words([item for item in flag_items(argv)  # argv is public
                              if option_name(item[0]) not in ("--api-key", "--hf-token")])
        known = set().union(*(secret_literals(v, is_secret(name or "", values))
                              for name, values, _ in flag_items(argv) for v in values))
        known |= {v for v in secrets.values() if v and len(v) >= 4}
        env = {**os.environ, **SERVE_ENV, **{k: v for k, v in secrets.items() if v}}
        log(f"starting: {shlex.join(redact_argv(command))}\n  (server log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab", buffering=0)  # a line each write: none held back
        self.process = subprocess.Popen([sys.executable, "-c", SERVER_WATCHDOG, *command],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self.relay = threading.Thread(target=relay_log, daemon=True,
                                      args=(self.process.stdout, log_file, known))
        self.relay.start()

    def log_tail(self) -> str:
        if self.process is not None and self.process.poll() is not None:
            self.relay.join(timeout=5)  # its last lines, unless what it started holds the pipe
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()[-40:]
            return f"Last lines of {self.log_path}:\n" + "\n".join("  | " + s for s in lines)
        return "(no server log)"

    async def wait_ready(self, client, timeout: float) -> None:
        """Until the server (ours: started and still running) is ready, or RunAborted."""
        began = reported = time.monotonic()
        while (state := await self.probe(client)) != "ready":
            if self.process is not None and self.process.poll() is not None:
                raise RunAborted(f"vllm serve exited with code {self.process.returncode} "
                                 f"before it was ready. {self.log_tail()}")
            if state == "absent" and self.process is None and self.may_spawn:
                raise RunAborted(f"the server that was starting on port {self.port} is gone; "
                                 f"rerun to start one.")
            if time.monotonic() >= began + timeout:
                tail = f"\n{self.log_tail()}" if self.process else ""
                raise RunAborted(f"the server at {self.base} was not ready after {timeout:.0f} s "
                                 f"(--server-timeout): once it answers (or with a longer "
                                 f"--server-timeout), {rerun_advice()}{tail}")
            if time.monotonic() - reported >= REPORT_EVERY_S:
                reported = time.monotonic()
                log(f"waiting for the server at {self.base} for {reported - began:.0f} s of up to "
                    f"{timeout:.0f} s (--server-timeout): {self.waiting_on(state)}")
            await asyncio.sleep(1.0)

    async def recover(self, client) -> None:
        """After a connection error: wait for the server, restarting ours if it died."""
        async with self._lock:
            if await self.probe(client, starting=False) == "ready":
                return
            log(f"the server at {self.base} is not answering: waiting up to "
                f"{self.args.server_down_timeout:g} s for it (--server-down-timeout)")
            while await self.probe(client, starting=False) != "ready":
                if self.process is not None and self.process.poll() is not None:
                    if self.restarts >= self.args.max_restarts:
                        raise RunAborted(f"vllm serve died ({self.restarts + 1} starts); "
                                         f"giving up. {self.log_tail()}", EXIT_REFUSED)
                    self.restarts += 1
                    log(f"vllm serve died (exit {self.process.returncode}); restart "
                        f"{self.restarts}/{self.args.max_restarts}; its pages are sent again")
                    self.stop(force=True)  # what is left of its process group
                    self.spawn()
                    self.heard_at = float("inf")  # loading: wait_ready judges it, not watch()
                    return await self.wait_ready(client, self.args.server_timeout)
                await asyncio.sleep(1.0)

    def stop(self, force: bool = False) -> None:
        """Stop the server this run started and what is left of its process group, never more."""
        if self.process is None:
            return
        if not force and self.process.poll() is None:
            log("stopping the vllm serve this run started")
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)  # the watchdog waits for the server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.relay.join(timeout=5)  # the log complete
