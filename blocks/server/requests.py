"""One page's request: its body built once, sent with retries, its answer read."""

import asyncio
import base64
import contextlib
import httpx
import json
import random
import time

from blocks.common.errors import EXIT_REFUSED, log, RunAborted
from blocks.common.loops import cut_at_loop, kept_attempt, loop_seed, loops, repetition_detection
from blocks.common.model_options import LOOP_TEMPERATURE
from blocks.common.pages import PreparedPage
from blocks.common.rows import error_row, exception_row, PAGE, RowResult, SERVER
from blocks.model import build_request
from blocks.server.process import ServerManager

IMAGE_URL_PLACEHOLDER = "@@PAGE_IMAGE_URL@@"
SEND_AGAIN = globals().get("SEND_AGAIN")  # the model section's: a page it asks to send again
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
RETRY_AFTER_MAX_S = 120.0  # the longest wait a server's Retry-After is granted before a retry


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
    """`body` again with the retry's temperature and seed, its image URL cut out of the bytes."""
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
