"""The SERVER HELPERS block of the server scripts (edit here, then run tools/sync_helpers.py).
The names imported below come from the model section (blocks/model.py) or an earlier block."""

import argparse
import json
import os
import random
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from blocks.model import build_request, DEFAULT_SERVER, JOB_IMAGE, SERVE_ARGS, SERVE_ENV, spawn_args
from blocks.common import (
    check_context_budget, cut_at_loop, error_row, exception_row, EXIT_REFUSED, EXIT_USAGE, fail,
    finish_row, flag_items, flag_words, HeldFailures, inference_info_entry, is_secret,
    iter_image_cells, jobs_command, JOBS_NOTE, kept_attempt, log, loop_seed, LOOP_TEMPERATURE,
    loops, PAGE, parse_arguments, PreparedPage, read_page, redact_argv, repetition_detection,
    requested_revision, rerun_advice, resolved_revision, RowResult, run_script, RunAborted,
    RunStats, SERVER, TOKEN_VALUE,
)

# ==== BEGIN SERVER HELPERS (edit blocks/server.py, then run tools/sync_helpers.py) ====
# The vLLM server's life cycle, the request loop and its window (a -saturate.py script's
# SATURATE block replaces WINDOW). Model section: SERVE_ARGS .. spawn_args().
import asyncio
import base64
import contextlib
import functools
import shutil
import socket
import ssl
import subprocess
import urllib.parse
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import httpx

IMAGE_URL_PLACEHOLDER = "@@PAGE_IMAGE_URL@@"
SEND_AGAIN = globals().get("SEND_AGAIN")  # the model section's: a page it asks to send again
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
RETRY_AFTER_MAX_S = 120.0  # the longest wait a server's Retry-After is granted before a retry


def option_name(flag) -> str:
    return str(flag).replace("_", "-")  # like vLLM, an option may be spelled with underscores


def effective_serve_args(args) -> list[str]:
    """SERVE_ARGS, then --serve-args; --logits-processors last (it would swallow a bare value)."""
    items = flag_items(list(SERVE_ARGS) + shlex.split(args.serve_args or ""))
    return flag_words(sorted(items, key=lambda item: option_name(item[0]) == "--logits-processors"))


def serve_arg_value(argv: list[str], name: str, default=None):
    """The last value given for a flag."""
    values = [v[0] for flag, v, _ in flag_items(argv) if v and option_name(flag) == name]
    return values[-1] if values else default


def parse_vllm_size(value) -> int | None:
    """A size as vLLM reads it: 24k is 24000, 24K is 24576 (no decimals), auto or -1 is None."""
    text = str(value).strip()
    if text.lower() in ("auto", "-1"):
        return None
    match = re.fullmatch(r"(\d+(\.\d+)?)([kmgtKMGT]?)", text)
    if match and match[2] and match[3].isupper():
        raise ValueError(f"{text!r}: no decimals with {text[-1]} (did you mean {text.lower()}?)")
    if not match or match[2] and not match[3]:
        raise ValueError(f"{text!r} is not a size (write e.g. 32768, 24k, 32K or auto)")
    scale = (1024 if match[3].isupper() else 1000) ** " kmgt".index(match[3].lower())
    return int(float(match[1]) * scale)


def serve_max_model_len(args) -> int | None:
    """The context of the server this script would start; None: the model's own (`auto`)."""
    return parse_vllm_size(serve_arg_value(effective_serve_args(args), "--max-model-len", "auto"))


def server_url_parts(url: str) -> tuple[str, str, int]:
    """(base, host, port) of --server; the base keeps a proxy's path prefix, drops a /v1."""
    parsed = urllib.parse.urlparse(url if "//" in url else "http://" + url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--server {url!r} is not an http(s) URL (write e.g. "
                         f"http://127.0.0.1:8000)")
    if "@" in parsed.netloc:  # httpx would send it as Basic auth, in place of the API key
        raise ValueError(f"--server {url!r} holds a user or password: give the server's API key "
                         f"with --api-key (or VLLM_API_KEY), and --server without it")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)  # ValueError on a bad port
    path = parsed.path.rstrip("/").removesuffix("/v1")
    return f"{parsed.scheme}://{parsed.netloc}{path}", parsed.hostname, port


def server_argument_problems(args) -> list[str]:
    """The server options a user can get wrong (parse_arguments reports them with the rest)."""
    problems = []
    try:
        server_url_parts(args.server)
    except ValueError as exc:
        problems.append(str(exc))
    try:
        words = shlex.split(args.serve_args)
    except ValueError as exc:
        return problems + [f"--serve-args cannot be split as a command line: {exc}"]
    for flag, word in ((flag, word) for flag, values, _ in flag_items(words) for word in values):
        if not re.match(r"\{\s*[\w\"']", word):  # not a JSON object (nor a {{ template }})
            continue
        try:  # one whose inner quotes the shell took is refused, its value unshown (a secret?)
            json.loads(word)
        except ValueError:
            problems.append(f"--serve-args: the value of {flag or 'a word'} is not JSON (the shell "
                            f"took its quotes): quote it twice, e.g. --serve-args "
                            f"'{flag or '--flag'} \"{{\\\"key\\\": 1}}\"'")
    try:
        serve_max_model_len(args)
    except ValueError as exc:
        problems.append(f"--serve-args --max-model-len: {exc}")
    return problems


# Runs `vllm serve` in its own process group. When the driver dies without stopping it (kill -9,
# OOM), it notices within half a second, stops the group, then kills what is left (itself too).
SERVER_WATCHDOG = r"""
import json, os, signal, subprocess, sys, threading, time
driver = os.getppid()
signal.signal(signal.SIGTERM, lambda *_: None)  # the driver's stop() signals the whole group
masked = [s.encode() for s in json.loads(os.environ.pop("OCR_LOG_MASK", "[]"))]
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                          stdout=subprocess.PIPE if masked else None)

def pump():  # the server's log, the secrets it prints (its non-default args) masked
    for line in server.stdout:
        for secret in masked:
            line = line.replace(secret, b"***")
        try:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        except OSError:  # a full disk: the line is lost, but the server must not block on it
            pass

reader = threading.Thread(target=pump, daemon=True)
if masked:
    reader.start()
while server.poll() is None and os.getppid() == driver:
    time.sleep(0.5)
if server.poll() is None:  # the driver is gone
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    finally:
        os.killpg(0, signal.SIGKILL)
if masked:
    reader.join(timeout=5)
sys.exit(server.returncode if server.returncode >= 0 else 128 - server.returncode)
"""


def secret_literals(value, secret: bool = False) -> set[str]:
    """The secrets in a value as given (a JSON value's at every depth): the values under a
    secret's name, and token-like ones; what a server's log must not show."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if isinstance(value, dict):
        return set().union(*(secret_literals(v, secret or is_secret(k, v))
                             for k, v in value.items()))
    if isinstance(value, list):
        return set().union(*(secret_literals(v, secret) for v in value))
    text = str(value)
    found = {text} if secret and len(text) >= 4 else set()
    return found | set(TOKEN_VALUE.findall(text))


UNKNOWN_HOST = (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None))  # not a DNS hiccup
SILENT_PORT_S = 120.0  # connected, no HTTP answer this long: not vLLM (it listens once it answers)
HEALTH_EVERY_S = 10.0  # mid-run /health checks (at least 4 per --server-down-timeout)
REPORT_EVERY_S = 60.0  # while waiting for a server, a line this often


class ServerManager:
    """Reuse a server, wait for one that is starting, or start `vllm serve` and own it."""

    def __init__(self, args, log_dir: Path):
        self.args, (self.base, self.host, self.port) = args, server_url_parts(args.server)
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
        """Stop the run once the server neither passes /health nor answers a page for
        --server-down-timeout; a page generating on a live server is never cut here."""
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
                 f"server.\n\nRun it on Hugging Face Jobs:\n  {jobs_command()}\n{JOBS_NOTE}\n\n"
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
        return command + WINDOW.serve_args(self.args, serve_args) + parallel + serve_args

    def spawn(self) -> None:
        """Start `vllm serve` under SERVER_WATCHDOG; secrets go through its env, not its argv."""
        argv = self.serve_command() + spawn_args(self.args)
        secrets = {"VLLM_API_KEY": self.api_key,
                   "HF_TOKEN": self.args.hf_token or serve_arg_value(argv, "--hf-token")}
        command = flag_words([item for item in flag_items(argv)  # argv is public
                              if option_name(item[0]) not in ("--api-key", "--hf-token")])
        masked = set().union(*(secret_literals(v, is_secret(name or "", values))
                               for name, values, _ in flag_items(argv) for v in values))
        masked |= {v for v in secrets.values() if v and len(v) >= 4}
        env = {**os.environ, **SERVE_ENV, **{k: v for k, v in secrets.items() if v},
               "OCR_LOG_MASK": json.dumps(sorted(masked, key=len, reverse=True))}
        log(f"starting: {shlex.join(redact_argv(command))}\n  (server log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen([sys.executable, "-c", SERVER_WATCHDOG, *command],
                                            stdout=log_file, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            env=env)

    def log_tail(self) -> str:
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
        """After a connection error: wait for the server, restarting ours if it died. One that
        stays down is watch()'s to judge, as one that hangs: exit 4 either way."""
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


def request_json(model_name: str, args, seed: int | None = None) -> tuple[bytes, bytes]:
    """The JSON body's text before and after the image URL; with a seed, a loop retry's."""
    request = {**build_request(IMAGE_URL_PLACEHOLDER, args), "model": model_name}
    if repetition_detection(args):
        request["repetition_detection"] = repetition_detection(args)
    if seed is not None:
        request.update(temperature=LOOP_TEMPERATURE, seed=seed)
    head, tail = json.dumps(request, ensure_ascii=False).split(IMAGE_URL_PLACEHOLDER)
    return head.encode(), tail.encode()


def request_body(page: PreparedPage, model_name: str, args) -> bytes:
    """The JSON body with the page's base64 spliced in as bytes: one copy, no escaping needed."""
    head, tail = request_json(model_name, args)
    return b"".join((head, b"data:", page.mime.encode(), b";base64,",
                     base64.b64encode(page.data), tail))


def loop_retry_body(body: bytes, model_name: str, args, seed: int, previous: int | None) -> bytes:
    """`body` (sent with seed `previous`) again with the retry's temperature and seed: its image
    URL is cut out of the bytes, so the page is neither kept decoded nor encoded twice."""
    head, tail = request_json(model_name, args, previous)
    new_head, new_tail = request_json(model_name, args, seed)
    with memoryview(body) as view:
        return b"".join((new_head, view[len(head):len(body) - len(tail)], new_tail))


async def send_until_clean(client, server: "ServerManager", body: bytes, index: int,
                           args) -> RowResult:
    """send_page(), then up to --loop-retries more while the kept answer loops."""
    result, previous = await send_page(client, server, body, args), None
    for attempt in range(1, args.loop_retries + 1):
        if not loops(result.text, result.finish_reason):  # an error row has no text
            break
        seed = loop_seed(index, attempt)
        body, previous = loop_retry_body(body, server.model_name, args, seed, previous), seed
        result = kept_attempt(result, await send_page(client, server, body, args))
    return result


def read_completion(response) -> RowResult:
    """The row's result from a 200 answer; a malformed one is the server's error."""
    def count(value) -> int | None:  # a token count as the int32 column holds it
        return value if isinstance(value, int) and 0 <= value < 2 ** 31 else None

    try:
        payload = response.json()
        choice, usage = payload["choices"][0], payload.get("usage") or {}
        text, finish = choice["message"]["content"], choice.get("finish_reason")
        if text is not None and not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}")
        finish = finish if isinstance(finish, str) else None
        return RowResult(text=cut_at_loop(text or "", finish), finish_reason=finish,
                         prompt_tokens=count(usage.get("prompt_tokens")),
                         completion_tokens=count(usage.get("completion_tokens")), attempts=1)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return error_row(f"unreadable response ({type(exc).__name__}: {exc}): "
                         f"{response.text[:300]}", SERVER)


async def send_page(client, server: "ServerManager", body: bytes, args) -> RowResult:
    """POST one page; retry what may pass next time, record what will not."""
    url = f"{server.base}/v1/chat/completions"
    headers = {"Content-Type": "application/json", **server.headers}
    attempt, outages, last_error = 0, 0, ""
    while attempt <= args.max_retries:
        asked = 0.0  # the wait a 429/503's Retry-After asks (seconds; capped)
        try:
            response = await client.post(url, content=body, headers=headers)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            outages += 1
            if outages > args.max_restarts + 5:
                return error_row(f"connection failed {outages} times: {exc}", SERVER)
            await server.recover(client)  # one that stays down, watch() stops the run
            continue
        except httpx.TimeoutException:
            last_error = f"timed out after {args.request_timeout:g} s"
        except httpx.HTTPError as exc:  # an answer httpx cannot read (a gzip body that is not)
            last_error = f"unreadable answer: {type(exc).__name__}: {exc}"
        except Exception as exc:  # whatever else the transport raised: the server's side
            return exception_row(exc, SERVER, "request failed: ")
        else:
            server.heard_at = time.monotonic()
            status, text = response.status_code, response.text[:300]
            if status == 200:
                return read_completion(response)
            if status in (401, 403):  # these two refuse the whole run, not this page
                raise server.key_refused(status)
            if status == 404 and "does not exist" in text:
                raise RunAborted(f"the server at {server.base} no longer serves "
                                 f"{server.model_name} (HTTP 404: {text}); it was restarted with "
                                 f"another model?", EXIT_REFUSED)
            last_error = f"HTTP {status}: {response.text[:500]}"
            if status not in RETRY_STATUS:
                return error_row(last_error, PAGE)  # the request itself (this page) is refused
            with contextlib.suppress(TypeError, ValueError):
                asked = min(RETRY_AFTER_MAX_S, float(response.headers.get("Retry-After")))
            if asked >= 5 and not server.asked_to_wait:  # once: the bar may stand still a while
                server.asked_to_wait = True
                log(f"the server asks to wait {asked:.0f} s before a retry (HTTP {status}, "
                    f"Retry-After): waiting")
        attempt += 1
        if attempt <= args.max_retries:
            await asyncio.sleep(max(asked, min(30.0, 2 ** attempt) * random.uniform(0.5, 1.0)))
    return error_row(f"gave up after {args.max_retries + 1} attempts: {last_error}", SERVER)


class ClientGroup(contextlib.AsyncExitStack):
    """httpx clients behind one `post`/`get`, each with at most 16 requests: httpx scans its whole
    pool on each request (256 in one pool cost 14-16 ms of driver CPU per page, 4-5 ms at 32)."""

    def __init__(self, **client_kwargs):
        super().__init__()  # closes every client on exit
        self.client_kwargs, self.clients = client_kwargs, {}  # client: its requests in flight

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        client = min(self.clients, key=self.clients.__getitem__, default=None)
        if client is None or self.clients[client] >= 16:
            client = httpx.AsyncClient(**self.client_kwargs)
            self.push_async_callback(client.aclose)
            self.clients[client] = 0
        self.clients[client] += 1
        try:
            return await client.request(method, url, **kwargs)
        finally:
            self.clients[client] -= 1

    post = functools.partialmethod(request, "POST")
    get = functools.partialmethod(request, "GET")


PAGES_PER_ENGINE = 32  # the measured window: on l4x1 the KV cache was under 10% used at 32


class Window:
    """Pages in flight, taken before a page is prepared, given back when its answer is in. This
    one stays at --concurrency; a -saturate.py script's WINDOW adapts."""

    def __init__(self, args, run):
        self.limit, self.used, self.preparing = max(1, args.concurrency or PAGES_PER_ENGINE), 0, 0
        self.changed = asyncio.Event()  # a slot given back, the limit raised, or the run stopped
        self.body_sizes: deque[int] = deque(maxlen=256)  # of recent requests
        self.input_done = self.stopped = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, group) -> None:
        group.add_argument("--concurrency", type=int, default=None,
                           help=f"pages in flight (default: {PAGES_PER_ENGINE} per engine of the "
                                f"server, the measured setting)")

    @staticmethod
    def serve_args(args, serve_args: list[str]) -> list[str]:  # for a server started here
        return []

    async def acquire(self) -> bool:
        """A slot for the next page; False once the run stopped (unstarted pages give none back)."""
        while self.used >= self.limit and not self.stopped:
            self.changed.clear()
            await self.changed.wait()
        self.used += 1
        return not self.stopped

    def release(self) -> None:
        self.used -= 1
        self.changed.set()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.changed.set()

    async def adapt(self, client, server: "ServerManager") -> None:
        """Resize the window while the pages run (an adaptive one does)."""

    async def sample(self, client, server: "ServerManager") -> None:
        """Read the server's gauges and decide (an adaptive one does)."""

    def summary(self) -> dict:
        return {}


WINDOW = Window


def holds_interrupt(exc) -> bool:
    """A KeyboardInterrupt, or an exception group holding one (a signal in anyio's connect)."""
    return isinstance(exc, KeyboardInterrupt) or any(map(holds_interrupt,
                                                         getattr(exc, "exceptions", ())))


def run_async(work) -> None:
    """asyncio.run; a Ctrl-C landing in a task is said once (run_script), not as its traceback."""
    async def quietly():
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: holds_interrupt(context.get("exception")) or
            loop.default_exception_handler(context))
        await work

    asyncio.run(quietly())


async def run_server_pipeline(run, args, server: ServerManager, window: Window) -> None:
    """Start or reuse the server, then keep the window full until every pending row is done."""
    from tqdm import tqdm

    loop, stats, writer = asyncio.get_running_loop(), run.stats, run.writer
    write_lock = asyncio.Lock()
    storm = HeldFailures(SERVER, args.abort_after_failures, args.abort_after_seconds,
                         "all failed on the server's side over {:.0f} s")
    failure: list[BaseException] = []
    tasks: set[asyncio.Task] = set()

    def stop(exc: BaseException) -> None:  # the pages in flight stay pending
        failure.append(exc)
        window.stopped = True
        window.changed.set()
        for task in tasks - {asyncio.current_task()}:
            task.cancel()

    async with ClientGroup(timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        # what the exit undoes, last first: the tasks, the bar, the pools
        write_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")
        client.callback(write_pool.shutdown, wait=True)
        prep_pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                       thread_name_prefix="prepare")
        client.callback(prep_pool.shutdown, wait=False, cancel_futures=True)
        await server.start(client, stats)
        writer.info_entry.update(vllm_version=server.version, model_revision=server.revision)
        if not args.concurrency and server.engines > 1:  # a window for every engine
            window.resize(max(window.limit, PAGES_PER_ENGINE * server.engines))
        bar = tqdm(total=len(run.plan.send), unit="page", dynamic_ncols=True, smoothing=0.1,
                   mininterval=0.5 if sys.stderr.isatty() else 10.0)
        client.callback(bar.close)
        adapting = asyncio.create_task(window.adapt(client, server))
        client.callback(adapting.cancel)

        async def one(index: int, cell) -> None:
            latency = None
            stats.enter()  # in the task: one cancelled before it began neither enters nor leaves
            try:
                held = cell.get("bytes") if isinstance(cell, dict) else cell
                window.preparing += 1  # bytes in memory go out as they are: no pool hop
                page = isinstance(held, (bytes, bytearray, memoryview)) and \
                    read_page(cell, args, decode=False) or \
                    await loop.run_in_executor(prep_pool, read_page, cell, args)
                window.preparing -= 1
                if isinstance(page, RowResult):  # not sent: its error, or its text layer
                    result = page
                else:
                    layer, digest, size = page.text_layer, page.digest, (page.width, page.height)
                    body = request_body(page, server.model_name, args)
                    del page, cell, held
                    window.body_sizes.append(len(body))
                    sent = time.monotonic()
                    result = await send_until_clean(client, server, body, index, args)
                    if SEND_AGAIN is not None:  # e.g. olmOCR-2: a page said rotated, turned
                        result = await SEND_AGAIN(functools.partial(
                            send_until_clean, client, server, index=index, args=args),
                            body, result, args)
                    del body
                    latency = time.monotonic() - sent
                    result.text_layer, result.digest, result.sent_size = layer, digest, size
            except RunAborted as exc:
                return stop(exc)
            except Exception as exc:  # preparing or sending the page: this row fails, not the run
                result = exception_row(exc, PAGE)
            finally:
                stats.leave()
                window.release()  # the answer is in: the next page may go
            try:
                finish_row(writer, stats, storm, index, result, latency)
            except RunAborted as exc:  # nothing written: degenerate, or held by the storm
                return stop(exc)
            bar.update(1)
            if result.error is not None:
                bar.set_postfix(errors=stats.errors_seen, refresh=False)
            if writer.store.conflict:
                return stop(RunAborted(writer.store.conflict, EXIT_USAGE))
            if writer.due():
                async with write_lock:
                    await loop.run_in_executor(write_pool, writer.flush, False)
            writer.store.commit_if_due()

        watching = asyncio.create_task(server.watch(client, stats, storm))
        watching.add_done_callback(lambda watch: watch.cancelled() or stop(watch.exception()))
        client.callback(watching.cancel)
        for index, cell in iter_image_cells(run.source, run.plan.send):
            if not await window.acquire():
                break
            task = asyncio.create_task(one(index, cell))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        window.input_done = True
        while tasks and not failure:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        if failure:
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failure[0]
        storm.at_end(writer)
        adapting.cancel()  # then one last sample: the final state, the final counters
        await asyncio.gather(adapting, return_exceptions=True)
        await window.sample(client, server)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--server", default=DEFAULT_SERVER, help="vLLM server URL: reused when it "
                       "answers, else started here if local (default: %(default)s)")
    group.add_argument("--api-key", help="server API key (default: VLLM_API_KEY)")
    group.add_argument("--serve-args", default="", help="extra `vllm serve` arguments, appended "
                       "after the script's own so they override them, e.g. \"--max-model-len "
                       "16384\"")
    group.add_argument("--no-spawn", action="store_true",
                       help="never start a server: wait for --server (up to --server-timeout)")
    group.add_argument("--server-timeout", type=float, default=1800.0,
                       help="seconds to wait for a server to be ready (default: 1800)")
    group.add_argument("--server-down-timeout", type=float, default=300.0, help="seconds a "
                       "server may go without answering (/health, a page) mid-run before the run "
                       "stops (default: 300; rerun to resume)")
    group.add_argument("--max-restarts", type=int, default=3,
                       help="restarts of a spawned server that dies mid-run (default: 3)")
    group.add_argument("--request-timeout", type=float, default=900.0,
                       help="seconds for one page's answer (default: 900)")
    group.add_argument("--max-retries", type=int, default=4,
                       help="retries of a page after a timeout, 429 or 5xx (default: 4)")
    group.add_argument("--abort-after-failures", type=int, default=20, help="stop after this "
                       "many pages in a row fail on the server's side (5xx, timeouts) over "
                       "--abort-after-seconds (default: 20)")
    group.add_argument("--abort-after-seconds", type=float, default=60.0,
                       help="see --abort-after-failures (default: 60)")
    WINDOW.add_arguments(parser, group)


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


def run_server_script(doc: str, argv: list[str] | None = None, hub_api=None) -> int:
    """The whole run: arguments, input, server, output. `main()` calls it with the docstring."""
    args = parse_arguments(doc, argv, add_server_arguments, server_argument_problems)
    serve_args = effective_serve_args(args)
    settings = {flag: values[0] if len(values) == 1 else values or True  # a bare flag is True
                for flag, values, _ in flag_items(serve_args) if flag}
    server = ServerManager(args, Path("."))

    def ready(check_only: bool) -> None:  # before the input is read and the repo created
        if check_only:  # no server planned or started; a Job's own server's context checked
            return check_context_budget(serve_max_model_len(args), args)
        run_async(server.plan())

    def work(run) -> None:
        server.log_path = run.store.meta / "logs" / server.log_path.name
        window = WINDOW(args, run)
        try:
            run_async(run_server_pipeline(run, args, server, window))
        finally:
            run.stats.extra.update(window.summary())

    info_entry = inference_info_entry(args, None, serve_args=redact_argv(serve_args))
    return run_script(args, hub_api, settings, info_entry, ready, work, server.stop)
# ==== END SERVER HELPERS ====
