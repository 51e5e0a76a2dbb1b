"""A vLLM logits processor that gives a tiny random model realistic page lengths.

Random weights stop at random places or never, so every answer would run to max_tokens or
end by chance. This processor ends each answer exactly (it forbids the end-of-sequence token
before, and forces it at) a length drawn from a long-tailed distribution of page lengths,
chosen from a hash of the page's number of image tokens: the same page gets the same length in
every engine (offline or served), whichever client sent it and whatever the prompt's wording.
Pages of different sizes get different lengths; pages of one size share one. Load it with `--logits-processors page_length:PageLengthProcessor` (vllm serve) or
`logits_processors=["page_length:PageLengthProcessor"]` (vllm.LLM), with this folder on
PYTHONPATH. Benchmarks only.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics

try:
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
except ImportError:  # imported outside the engine's environment (benchmarks/run.py): page_length()
    AdapterLogitsProcessor = object

# Lognormal page lengths: median 96 tokens, sigma 0.8 (p90 about 270, p99 about 620),
# clamped to [16, 768]: the shape of real OCR page lengths, scaled down for a CPU.
MEDIAN = float(os.environ.get("PAGE_LENGTH_MEDIAN", 96))
SIGMA = float(os.environ.get("PAGE_LENGTH_SIGMA", 0.8))
LOW, HIGH = 16, int(os.environ.get("PAGE_LENGTH_MAX", 768))


def page_length(key) -> int:
    digest = hashlib.sha1(repr(key).encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2 ** 64
    z = statistics.NormalDist().inv_cdf(u)
    return int(min(HIGH, max(LOW, round(MEDIAN * math.exp(SIGMA * z)))))


class PageLengthProcessor(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        eos = vllm_config.model_config.hf_text_config.eos_token_id
        self.eos = eos[0] if isinstance(eos, (list, tuple)) else int(eos)
        self.image_token = getattr(vllm_config.model_config.hf_config, "image_token_id", None)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        eos, image_token = self.eos, self.image_token
        lengths: dict[int, int] = {}

        def force_end(prompt_ids, output_ids, logits):
            key = id(prompt_ids)
            if key not in lengths:
                ids = list(prompt_ids)
                lengths[key] = page_length(ids.count(image_token) if image_token is not None else ids)
            if len(output_ids) >= lengths[key] - 1:
                logits[:] = -float("inf")
                logits[eos] = 0.0
            else:
                logits[eos] = -float("inf")
            return logits

        return force_end
