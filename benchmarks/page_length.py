"""A vLLM logits processor that gives a tiny random model realistic page lengths.

Random weights never stop on their own, so every answer would run to max_tokens. This
processor ends each answer (forces the end-of-sequence token) after a length drawn from a
long-tailed distribution of page lengths, chosen from a hash of the request's prompt tokens:
the same page gets the same length in every engine (offline or served), whichever client sent
it. Load it with `--logits-processors page_length:PageLengthProcessor` (vllm serve) or
`logits_processors=["page_length:PageLengthProcessor"]` (vllm.LLM), with this folder on
PYTHONPATH. Benchmarks only.
"""

from __future__ import annotations

import hashlib
import math
import os

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

# Lognormal page lengths: median 96 tokens, sigma 0.8 (p90 about 270, p99 about 620),
# clamped to [16, 768]: the shape of real OCR page lengths, scaled down for a CPU.
MEDIAN = float(os.environ.get("PAGE_LENGTH_MEDIAN", 96))
SIGMA = float(os.environ.get("PAGE_LENGTH_SIGMA", 0.8))
LOW, HIGH = 16, int(os.environ.get("PAGE_LENGTH_MAX", 768))


def page_length(prompt_ids) -> int:
    digest = hashlib.sha1(repr(list(prompt_ids)).encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2 ** 64
    z = math.sqrt(2) * _erfinv(2 * u - 1)
    return int(min(HIGH, max(LOW, round(MEDIAN * math.exp(SIGMA * z)))))


def _erfinv(y: float) -> float:
    return float(torch.erfinv(torch.tensor(y, dtype=torch.float64)))


class PageLengthProcessor(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        eos = vllm_config.model_config.hf_text_config.eos_token_id
        self.eos = eos[0] if isinstance(eos, (list, tuple)) else int(eos)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        eos = self.eos
        lengths: dict[int, int] = {}

        def force_end(prompt_ids, output_ids, logits):
            key = id(prompt_ids)
            if key not in lengths:
                lengths[key] = page_length(prompt_ids)
            if len(output_ids) >= lengths[key] - 1:
                logits[:] = -float("inf")
                logits[eos] = 0.0
            return logits

        return force_end
