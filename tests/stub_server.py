"""A stub OpenAI-compatible server for fault injection (latency, 500s, 400s, timeouts, a server
that dies, a slow /health). It is never the proof that a script works with vLLM: the engine
tests are. It answers each page with text derived from the image it received, so tests can
check that every row got its own page's answer, in order.

    python tests/stub_server.py --port 8123 [--latency 0.05] [--fail-first 3] ...

It also runs as a fake `vllm` command (`vllm serve MODEL --port P ...`) through
tests/fake_vllm/vllm, so the drivers' spawn and restart logic can be tested quickly.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def page_text(image_bytes: bytes, decode: bool) -> tuple[str | None, str | None]:
    """(text, error): the answer for one image; non-RGB images fail like vLLM's loader does."""
    digest = hashlib.sha1(image_bytes).hexdigest()[:12]
    if not decode:
        return f"# Page {digest}\n\nSome text of page {digest}.", None
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(image_bytes))
        img.load()
    except Exception as exc:
        return None, f"cannot load image: {exc}"
    if img.mode != "RGB":
        return None, f"image mode {img.mode} is not RGB"
    w, h = img.size
    r, g, b = img.resize((1, 1)).getpixel((0, 0))
    return f"# Page {w}x{h}\n\nmean colour {r},{g},{b}; digest {digest}.", None


def mapped_answer(image_bytes: bytes, path: str) -> str | None:
    """The answer --answer-map gives this page: the text of the mapped colour nearest to the
    page's mean colour (JSON {"r,g,b": text}; a null text refuses the page)."""
    from PIL import Image

    with open(path, encoding="utf-8") as handle:
        mapping = json.load(handle)
    mean = Image.open(io.BytesIO(image_bytes)).convert("RGB").resize((1, 1)).getpixel((0, 0))

    def distance(key: str) -> int:
        return sum((int(c) - m) ** 2 for c, m in zip(key.split(","), mean))
    return mapping[min(mapping, key=distance)]


def corner_answer(image_bytes: bytes, path: str) -> str | None:
    """The answer --corner-answers gives this page: the text of the mapped colour nearest to the
    page's top-left pixel (JSON {"r,g,b": text}): an answer that depends on which way up the
    page was sent, for a model that judges a page's rotation."""
    from PIL import Image

    with open(path, encoding="utf-8") as handle:
        mapping = json.load(handle)
    corner = Image.open(io.BytesIO(image_bytes)).convert("RGB").getpixel((0, 0))

    def distance(key: str) -> int:
        return sum((int(c) - m) ** 2 for c, m in zip(key.split(","), corner))
    return mapping[min(mapping, key=distance)]


def loop_text(text: str, seed) -> str:
    """A page's answer fallen into a repetition loop (cut at max_tokens or by repetition
    detection): the greedy loop runs 40 lines; a seeded one reads one line further before it
    falls into a loop of 20 to 34 lines (so the retry's is the shorter, with more text)."""
    if seed is None:
        return text + "\n" + "the same line again\n" * 40
    loop = "the same line again\n" * (20 + int(seed) % 15)
    return text + f"\nread further at seed {seed}.\n" + loop


class RequestProblem(Exception):
    """What a request lacks for the stub to answer it: answered 400 with this text and logged,
    never a dropped connection (which a driver would retry as a network fault)."""


def read_chat_request(raw: bytes) -> tuple[dict, str | None, list[str]]:
    """(request, the image's base64 or None, the text parts) of a chat-completions body, in
    the shape the scripts send it (OpenAI's: messages of role and content, content a string
    or a list of parts). Raises RequestProblem naming what is missing or malformed."""
    try:
        request = json.loads(raw)
    except ValueError:
        raise RequestProblem(f"body is not JSON ({len(raw)} bytes)") from None
    if not isinstance(request, dict):
        raise RequestProblem(f"body is JSON {type(request).__name__}, not an object")
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise RequestProblem("no 'messages' list in the request")
    image_b64, texts = None, []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise RequestProblem(f"messages[{i}] has no 'content' (a string or a list of parts)")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                url = (part.get("image_url") or {}).get("url") \
                    if isinstance(part.get("image_url"), dict) else None
                if not isinstance(url, str):
                    raise RequestProblem(f"messages[{i}]: an image_url part without image_url.url")
                match = re.match(r"data:image/[a-z]+;base64,(.*)$", url, re.S)
                image_b64 = match.group(1) if match else None
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise RequestProblem(f"messages[{i}]: a content part that is neither "
                                     f"{{type: text, text}} nor {{type: image_url, ...}}")
    for name in ("max_tokens", "temperature", "seed"):
        value = request.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RequestProblem(f"'{name}' is {value!r}, not a number")
    return request, image_b64, texts


def decoded_image(image_b64: str) -> bytes:
    try:
        return base64.b64decode(image_b64, validate=True)
    except ValueError:
        raise RequestProblem("the image's data URL is not valid base64") from None


def elide_images(messages):
    """The messages as sent, each image's data URL cut to its header (the log stays small)."""
    out = json.loads(json.dumps(messages))
    for message in out or []:
        for part in message.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                part["image_url"]["url"] = part["image_url"]["url"].split(",", 1)[0] + ",..."
    return out


class Stub:
    def __init__(self, opts):
        self.opts = opts
        self.lock = threading.Lock()
        self.requests = 0
        self.running = 0
        self.waiting = 0  # admitted past --capacity's limit: queued, as vLLM's scheduler would
        self.controlled: dict = {}  # what --control-file set
        self.latency = opts.latency  # each request's time (--latency, or --control-file's)
        self.slots = threading.Condition(self.lock)
        self.first_health = None  # --health-delay counts from the first probe
        self.log = open(opts.request_log, "a") if opts.request_log else None

    def capacity(self, n: int) -> float:
        """Requests that may run at once when request n arrives (--capacity, --capacity-after,
        --control-file)."""
        after, _, then = (self.opts.capacity_after or "").partition(":")
        if after and self.requests > int(after):
            return int(then)
        if self.controlled.get("capacity"):
            return self.controlled["capacity"]
        return self.opts.capacity or float("inf")

    def read_control(self) -> None:
        """--control-file: once it exists, its JSON sets capacity and latency from then on."""
        if not self.controlled and self.opts.control_file and os.path.exists(self.opts.control_file):
            with contextlib.suppress(ValueError):  # half written: read at the next request
                self.controlled = json.loads(open(self.opts.control_file).read())
                self.latency = self.controlled.get("latency", self.latency)

    def count(self) -> int:
        with self.slots:
            self.requests += 1
            self.slots.notify_all()  # --barrier: the held answers may go
            return self.requests

    def hold(self, n: int) -> None:
        """--barrier: answers wait until that many requests have arrived; --hold-after with
        --release-file: request n waits, past the first K, until the test creates the file."""
        with self.slots:
            self.slots.wait_for(lambda: self.requests >= self.opts.barrier)
        if self.opts.hold_after is not None and n > self.opts.hold_after:
            while not os.path.exists(self.opts.release_file):
                time.sleep(0.05)

    def wedged(self) -> bool:
        """--wedge-after: past request N, every request and /health hangs (a stuck engine)."""
        return bool(self.opts.wedge_after) and self.requests >= self.opts.wedge_after


def make_handler(stub: Stub):
    opts = stub.opts

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status: int, payload, content_type="application/json"):
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def route(self) -> str | None:
            """The path under --path-prefix (a reverse proxy's); None (after a 404) outside it."""
            if opts.foreign:  # some other web service on the port: a page for every path
                self.reply(200, b"<html><body>It works!</body></html>", "text/html")
                return None
            if not opts.path_prefix:
                return self.path
            if self.path.startswith(opts.path_prefix + "/"):
                return self.path[len(opts.path_prefix):]
            self.reply(404, {"error": "not found"})
            return None

        def authorized(self) -> bool:
            if not opts.api_key:
                return True
            if self.headers.get("Authorization") == f"Bearer {opts.api_key}":
                return True
            self.reply(401, {"error": "bad api key"})
            return False

        def do_GET(self):
            path = self.route()
            if path is None:
                return
            if path == "/health":
                if stub.wedged():
                    time.sleep(3600)
                with stub.lock:
                    stub.first_health = stub.first_health or time.monotonic()
                if time.monotonic() - stub.first_health < opts.health_delay:
                    self.reply(503, {"error": "starting"})
                else:
                    self.reply(200, b"", "text/plain")
            elif path == "/v1/models":
                if self.authorized():
                    self.reply(200, {"object": "list", "data": [
                        {"id": opts.model, "object": "model", "max_model_len": opts.max_model_len}]})
            elif path == "/version":
                self.reply(200, {"version": "stub-0"})
            elif path == "/metrics":
                text = (f"vllm:num_requests_running{{model_name=\"{opts.model}\"}} {stub.running}\n"
                        f"vllm:num_requests_waiting{{model_name=\"{opts.model}\"}} {stub.waiting}\n"
                        f"vllm:kv_cache_usage_perc{{model_name=\"{opts.model}\"}} 0.1\n")
                self.reply(200, text.encode(), "text/plain")
            else:
                self.reply(404, {"error": "not found"})

        def refuse(self, problem: str) -> None:
            """A request the stub cannot answer: say what it lacks, in the reply and the log."""
            print(f"stub: 400 for POST {self.path}: {problem}", file=sys.stderr, flush=True)
            self.reply(400, {"error": {"message": problem, "type": "BadRequestError",
                                       "code": 400}})

        def do_POST(self):
            if "Content-Length" not in self.headers:  # a chunked body would be read as the next request
                self.close_connection = True
                self.refuse("no Content-Length header (the stub reads only sized bodies)")
                return
            try:
                self.answer_post()
            except RequestProblem as problem:
                self.refuse(str(problem))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client left (a driver's timeout): nothing to answer
            except Exception as exc:  # the stub's own fault: say it rather than drop the connection
                print(f"stub: 500 for POST {self.path}: {exc!r}", file=sys.stderr, flush=True)
                self.reply(500, {"error": f"stub failure: {exc!r}"})

        def answer_post(self):
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            path = self.route()
            if path is None:
                return
            if path != "/v1/chat/completions":
                self.reply(404, {"error": "not found"})
                return
            if not self.authorized():
                return
            if stub.wedged():
                time.sleep(3600)
            n = stub.count()
            if opts.die_after and n > opts.die_after:
                os._exit(17)  # a server that dies mid-run, without a goodbye
            if opts.refuse_after is not None and n > opts.refuse_after:
                status = opts.refuse_status  # a key rotated, a restart with another model, ...
                message = {404: f"The model `{opts.model}` does not exist."}.get(status, "refused")
                self.reply(status, {"error": {"message": message, "code": status}})
                return
            request, image_b64, text_parts = read_chat_request(raw)
            if request.get("model") != opts.model:
                self.reply(404, {"error": f"model {request.get('model')} does not exist"})
                return
            if stub.log:
                with stub.lock:
                    stub.log.write(json.dumps({k: v for k, v in request.items() if k != "messages"}
                                              | {"texts": text_parts, "n": n, "t": time.time(),
                                                 "messages": elide_images(request.get("messages"))})
                                   + "\n")
                    stub.log.flush()
            if image_b64 is None:
                self.refuse("no image in the request (an image_url part with a base64 data URL)")
                return
            if n <= opts.fail_first:
                self.reply(500, {"error": "injected failure"})
                return
            if opts.rate_limit:  # 429 until S seconds after the first request, saying when
                with stub.lock:
                    stub.limited_until = getattr(stub, "limited_until", None) or \
                        time.monotonic() + opts.rate_limit
                left = stub.limited_until - time.monotonic()
                if left > 0:
                    body = json.dumps({"error": "rate limited"}).encode()
                    self.send_response(429)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Retry-After", str(int(left) + 1))
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
            if opts.fail_every and n % opts.fail_every == 0:
                self.reply(opts.fail_status, {"error": "injected overload"})
                return
            if n <= opts.hang_first:
                time.sleep(opts.hang_seconds)
            image_bytes = decoded_image(image_b64)
            text, error = page_text(image_bytes, not opts.no_decode)
            if opts.fail_seeded and request.get("seed") is not None:
                self.reply(500, {"error": "injected: a request with a seed fails"})
                return
            if opts.reject_digest and hashlib.sha1(image_bytes).hexdigest()[:12] in opts.reject_digest:
                self.reply(400, {"error": "injected: this page is refused"})
                return
            if opts.answer_map:
                text = mapped_answer(image_bytes, opts.answer_map)
                if text is None:
                    self.reply(400, {"error": "injected: the answer map refuses this page"})
                    return
            if opts.corner_answers:
                text = corner_answer(image_bytes, opts.corner_answers)
            if opts.reject_smaller_than and text and \
                    int(text.split("x")[0].split()[-1]) < opts.reject_smaller_than:
                self.reply(400, {"error": "image too small: height and width must be larger "
                                          "than factor"})  # as a Qwen-style processor says
                return
            if error:
                self.reply(500, {"error": error})
                return
            stub.hold(n)
            stub.read_control()
            with stub.slots:  # at most `capacity` run at once; the rest wait, and are counted
                stub.waiting += 1
                stub.slots.wait_for(lambda: stub.running < stub.capacity(n))
                stub.waiting -= 1
                stub.running += 1
            try:
                time.sleep(stub.latency)
            finally:
                with stub.slots:
                    stub.running -= 1
                    stub.slots.notify_all()
            if opts.degenerate:
                text = "a" * 64
            elif opts.content is not None:
                text = json.loads(opts.content)  # JSON: any string, lone surrogates included
            elif opts.answer_file:  # a model's own output shape (grounding markers, blocks)
                text = open(opts.answer_file, encoding="utf-8").read()
            max_tokens = int(request.get("max_tokens") or 16)
            finish = opts.finish_reason
            if opts.loop_below is not None and float(request.get("temperature") or 0) < opts.loop_below:
                text, finish = loop_text(text, request.get("seed")), opts.loop_finish
            if opts.blank_seeded and request.get("seed") is not None:
                text, finish = "", "stop"
            if opts.malformed_every and n % opts.malformed_every == 0:
                self.reply(200, {"id": f"stub-{n}", "choices": [{"message": text}]})
                return
            if opts.gzip_lie_every and n % opts.gzip_lie_every == 0:
                body = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")  # but the body is plain JSON
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.reply(200, {
                "id": f"stub-{n}", "object": "chat.completion", "model": opts.model,
                "choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": min(max_tokens, len(text) // 4),
                          "total_tokens": 100 + len(text) // 4},
            })

    return Handler


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--model", default="ATH-MaaS/OvisOCR2")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--latency", type=float, default=0.0)
    p.add_argument("--fail-first", type=int, default=0, help="answer 500 to the first N requests")
    p.add_argument("--rate-limit", type=float, default=0, help="answer 429 with Retry-After to "
                   "every request until S seconds after the first (a rate-limiting proxy)")
    p.add_argument("--fail-every", type=int, default=0, help="answer 503 to every Nth request")
    p.add_argument("--hang-first", type=int, default=0, help="the first N requests hang")
    p.add_argument("--hang-seconds", type=float, default=30.0)
    p.add_argument("--barrier", type=int, default=0, help="hold every answer until N "
                   "requests have arrived: a client that waits for answers before sending more "
                   "never gets one")
    p.add_argument("--hold-after", type=int, help="answer the first K requests; hold the others "
                   "until --release-file exists")
    p.add_argument("--release-file", help="the file whose creation releases --hold-after's requests")
    p.add_argument("--die-after", type=int, default=0, help="exit hard at request N+1")
    p.add_argument("--wedge-after", type=int, default=0,
                   help="answer N requests, then hang every request and /health")
    p.add_argument("--health-delay", type=float, default=0.0, help="/health answers 503 for S seconds after the first probe")
    p.add_argument("--start-delay", type=float, default=0.0, help="bind the port after S seconds")
    p.add_argument("--reject-digest", action="append", default=[],
                   help="answer 400 to pages whose sha1 starts so")
    p.add_argument("--blank-seeded", action="store_true",
                   help="answer an empty text (finish_reason stop) to every request that carries "
                        "a seed (a loop retry the model ended at once)")
    p.add_argument("--fail-seeded", action="store_true",
                   help="answer 500 to every request that carries a seed (a loop retry)")
    p.add_argument("--reject-smaller-than", type=int, default=0,
                   help="answer 400 to pages narrower than N pixels (needs decoding)")
    p.add_argument("--capacity", type=int, default=0,
                   help="at most N requests run at once; the others wait, and /metrics reports "
                        "them as vllm:num_requests_waiting (default: no limit)")
    p.add_argument("--capacity-after", help="K:M: from request K+1 on, the capacity is M (an "
                   "engine that slows down mid-run)")
    p.add_argument("--control-file", help="once this file exists, its JSON ({\"capacity\": M, "
                   "\"latency\": S}) holds from the next request on: an engine that slows down "
                   "at the moment a test chooses")
    p.add_argument("--fail-status", type=int, default=503,
                   help="the status --fail-every answers with (default: 503; 429: rate limited)")
    p.add_argument("--answer-file", help="answer every page with this file's text")
    p.add_argument("--answer-map", help="answer each page with the text a JSON file maps its "
                   "mean colour to ({\"r,g,b\": text}, the nearest colour; null refuses the page)")
    p.add_argument("--corner-answers", help="answer each page with the text a JSON file maps "
                   "the colour of its top-left pixel to ({\"r,g,b\": text}, the nearest colour): "
                   "the answer changes as the page is turned")
    p.add_argument("--degenerate", action="store_true", help="answer every page with 'aaaa...'")
    p.add_argument("--loop-below", type=float,
                   help="a request at a temperature below this answers a repetition loop cut at "
                        "max_tokens (finish_reason length): 0.25 loops greedy pages only, 9 always")
    p.add_argument("--finish-reason", default="stop",
                   help="every answer's finish_reason (length: a page cut at max_tokens)")
    p.add_argument("--loop-finish", default="length", choices=["length", "repetition"],
                   help="the finish_reason of a --loop-below answer (repetition: vLLM's "
                        "repetition_detection cut it)")
    p.add_argument("--no-decode", action="store_true", help="do not decode images (cheap)")
    p.add_argument("--refuse-after", type=int, help="answer --refuse-status to request N+1 on")
    p.add_argument("--refuse-status", type=int, default=401)
    p.add_argument("--content", help="answer every page with this JSON string")
    p.add_argument("--malformed-every", type=int, default=0,
                   help="every Nth answer is a 200 whose message is a bare string")
    p.add_argument("--gzip-lie-every", type=int, default=0,
                   help="every Nth answer says Content-Encoding: gzip over plain JSON")
    p.add_argument("--stop-delay", type=float, default=0.0,
                   help="on SIGTERM, take this many seconds to stop (an engine freeing a GPU)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="the key to require (default: VLLM_API_KEY, as vLLM reads it)")
    p.add_argument("--path-prefix", default="", help="serve under this path, as behind a proxy")
    p.add_argument("--foreign", action="store_true",
                   help="answer every path with an HTML page: another web service on the port")
    p.add_argument("--garbage", action="store_true",
                   help="not HTTP at all: send a banner line and close, like an SSH server")
    p.add_argument("--silent", action="store_true",
                   help="accept connections and read them, never answering (a wedged process)")
    p.add_argument("--request-log", help="append each request's fields (no image) as JSON lines")
    opts, _unknown = p.parse_known_args(argv)
    if opts.hold_after is not None and not opts.release_file:
        p.error("--hold-after needs --release-file")
    return opts


def serve_garbage(opts) -> None:
    import socket

    with socket.create_server((opts.host, opts.port)) as listener:
        print(f"stub (not HTTP) listening on {opts.host}:{opts.port}", flush=True)
        while True:
            connection, _ = listener.accept()
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")


def serve_silent(opts) -> None:
    import socket

    with socket.create_server((opts.host, opts.port)) as listener:
        print(f"stub (silent) listening on {opts.host}:{opts.port}", flush=True)
        held = []
        while True:
            connection, _ = listener.accept()
            connection.settimeout(1)
            with contextlib.suppress(OSError):
                connection.recv(65536)
            held.append(connection)  # kept open, never answered


def serve(opts) -> None:
    if opts.start_delay:
        time.sleep(opts.start_delay)
    if opts.stop_delay:
        import signal

        def slow_stop(signum, frame):
            time.sleep(opts.stop_delay)
            os._exit(0)
        signal.signal(signal.SIGTERM, slow_stop)
    if opts.garbage:
        serve_garbage(opts)
        return
    if opts.silent:
        serve_silent(opts)
        return
    stub = Stub(opts)
    ThreadingHTTPServer.request_queue_size = 1024  # read by listen() in the constructor
    server = ThreadingHTTPServer((opts.host, opts.port), make_handler(stub))
    server.daemon_threads = True
    print(f"stub listening on {opts.host}:{opts.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:  # invoked as `vllm serve MODEL ...` through tests/fake_vllm
        model, rest = argv[1], argv[2:]
        extra = os.environ.get("STUB_ARGS", "").split()
        opts = parse(["--model", model] + extra + rest)
    else:
        opts = parse(argv)
    serve(opts)
