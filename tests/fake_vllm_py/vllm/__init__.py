"""A fake `vllm` package for fault injection in the offline scripts' write path (kill -9 in the
middle of a run, signals, a clean-up that raises): `LLM.chat` answers each page with text
derived from its image, after FAKE_LLM_BATCH_SECONDS per batch, and logs how many pages each
call got to FAKE_LLM_LOG. It is never the proof that a script works with vLLM: the engine
tests drive the real `vllm.LLM`.
"""

import base64
import hashlib
import os
import time
from types import SimpleNamespace

__version__ = "fake-0"


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class LLM:
    def __init__(self, model, **kwargs):
        self.model, self.kwargs = model, kwargs

    def chat(self, conversations, sampling, use_tqdm=False, **kwargs):
        time.sleep(float(os.environ.get("FAKE_LLM_BATCH_SECONDS", "0")))
        log = os.environ.get("FAKE_LLM_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{len(conversations)}\n")
        outputs = []
        for messages in conversations:
            url = next(part["image_url"]["url"] for message in messages
                       for part in message["content"] if part.get("type") == "image_url")
            digest = hashlib.sha1(base64.b64decode(url.split(",", 1)[1])).hexdigest()[:12]
            text = os.environ.get("FAKE_LLM_CONTENT") or f"# Page {digest}\n\nText of page {digest}."
            completion = SimpleNamespace(text=text, finish_reason="stop", token_ids=[0] * 8)
            outputs.append(SimpleNamespace(outputs=[completion], prompt_token_ids=[0] * 100))
        return outputs
