"""A fake `vllm` package for the offline scripts' driver paths (no engine, no torch): put its
parent folder on PYTHONPATH. `LLM.chat` answers each page with the stub server's text for the
image it was given. Every call is appended, as a JSON line, to $FAKE_VLLM_CALLS (when set), so
tests can hand the exact keyword arguments a script gives vllm.LLM, vllm.SamplingParams and
LLM.chat to the pinned vLLM release's own definitions (tests/test_pinned_vllm.py).

Faults, by environment variable: FAKE_VLLM_FAIL_ON=TEXT makes `chat` raise ValueError for a
call holding a page whose answer contains TEXT (every answer has "Page"; a page's own answer
has the sha1 of its bytes, first 12 hex digits); FAKE_VLLM_RAISE="NAME[: MESSAGE]" raises a
RuntimeError subclass of that name instead ("EngineDeadError", "OutOfMemoryError: CUDA out
of memory"), on every call when FAKE_VLLM_FAIL_ON is unset; FAKE_VLLM_REFUSE_ON=TEXT raises
ValueError for such a page whatever else is asked. FAKE_VLLM_LOOP_BELOW=T answers in
a repetition loop below temperature T (finish_reason FAKE_VLLM_LOOP_FINISH, default
length); FAKE_VLLM_BATCH_SECONDS sleeps that long per call;
FAKE_VLLM_ENGINE_LINGERS=S forks an engine process that outlives the driver by S seconds.

It is never the proof that a script works with vLLM: tests/test_engine.py is.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

__version__ = "fake-0"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the stub's page_text
from stub_server import loop_text, page_text  # noqa: E402


def _record(call: str, **fields) -> None:
    path = os.environ.get("FAKE_VLLM_CALLS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"call": call, **fields}, default=repr) + "\n")


class SamplingParams:
    def __init__(self, **kwargs):
        _record("SamplingParams", kwargs=kwargs)
        self.kwargs = kwargs


class LLM:
    def __init__(self, model: str, **kwargs):
        _record("LLM", model=model, kwargs=kwargs)
        self.model = model
        linger = float(os.environ.get("FAKE_VLLM_ENGINE_LINGERS") or 0)
        if linger and os.fork() == 0:  # as vLLM forks its engine process: every fd inherited;
            time.sleep(linger)  # and one that outlives a killed driver for this long
            os._exit(0)

    def chat(self, messages, sampling_params=None, **kwargs):
        time.sleep(float(os.environ.get("FAKE_VLLM_BATCH_SECONDS") or 0))  # a batch's work
        per_page = sampling_params if isinstance(sampling_params, list) \
            else [sampling_params] * len(messages)
        assert len(per_page) == len(messages), "one SamplingParams per conversation"
        _record("chat", pages=len(messages), kwargs=kwargs,
                seeds=[p.kwargs.get("seed") if p else None for p in per_page])
        fail_on = os.environ.get("FAKE_VLLM_FAIL_ON")  # a page whose text this says raises
        loop_below = os.environ.get("FAKE_VLLM_LOOP_BELOW")  # as the stub's --loop-below
        outputs = []
        for conversation, params in zip(messages, per_page):
            sampling = params.kwargs if params else {}
            max_tokens = sampling.get("max_tokens") or 16
            url = next(part["image_url"]["url"] for message in conversation
                       for part in message["content"] if part.get("type") == "image_url")
            raw = base64.b64decode(re.match(r"data:image/[a-z]+;base64,(.*)$", url, re.S).group(1))
            text, error = page_text(raw, decode=True)
            raise_as = os.environ.get("FAKE_VLLM_RAISE")  # "EngineDeadError", "Name: message"
            if error or os.environ.get("FAKE_VLLM_REFUSE_ON", "\0") in text:
                raise ValueError(error or "input refused")
            if (fail_on and fail_on in text) or (raise_as and not fail_on):
                name, _, message = (raise_as or "").partition(": ")
                raise (type(name, (RuntimeError,), {}) if name else ValueError)(
                    message or "injected failure")
            finish = "stop"
            if loop_below and float(sampling.get("temperature") or 0) < float(loop_below):
                text = loop_text(text, sampling.get("seed"))
                finish = os.environ.get("FAKE_VLLM_LOOP_FINISH") or "length"
            tokens = list(range(min(max_tokens, len(text) // 4)))
            outputs.append(SimpleNamespace(
                prompt_token_ids=list(range(100)),
                outputs=[SimpleNamespace(text=text, finish_reason=finish, token_ids=tokens)]))
        return outputs
