"""Forced loops for the repetition-detection benchmark (issue #29, item 3); engine side.

`ForcedLoopProcessor` (a vLLM logits processor: `--logits-processors
forced_loop:ForcedLoopProcessor` with this folder on PYTHONPATH) makes a tiny random model write what the request's extra
arguments (`vllm_xargs`, or SamplingParams.extra_args) say: `page_length` L tokens that never
repeat, then the end; or, with `loop_period` p, `loop_after` tokens that never repeat, then a
cycle of p distinct tokens until max_tokens, or until repetition detection ends it. Every token
is forced, so the random weights' own degenerate text never reaches the check.

Run in the engine's environment:
    python forced_loop.py check-cost P C         # the engine's check, per step, as JSON
    python forced_loop.py offline MODEL P C MAX  # tokens per looping page through vllm.LLM
"""

from __future__ import annotations

import json
import random
import sys
import time

PERIODS = (1, 8, 32, 128)
LOOP_AFTER = 100  # tokens of page before the loop starts


def forced_token(step: int, args: dict, vocab: int) -> int | None:
    """The token to write at `step`, or None for the end of the page."""
    period, after = args.get("loop_period"), int(args.get("loop_after", LOOP_AFTER))
    if period and step >= after:
        return 10 + (step - after) % int(period)
    if not period and step >= int(args.get("page_length", 64)):
        return None
    return 200 + (step * 2654435761 + int(args.get("salt", 0))) % (vocab - 300)  # no repeats


try:
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
except ImportError:  # imported outside the engine's environment: only the helpers above
    AdapterLogitsProcessor = object


class ForcedLoopProcessor(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        eos = vllm_config.model_config.hf_text_config.eos_token_id
        self.eos = eos[0] if isinstance(eos, (list, tuple)) else int(eos)
        self.vocab = vllm_config.model_config.get_vocab_size()

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        args = dict(params.extra_args or {})
        if not args:
            return None
        eos, vocab = self.eos, self.vocab

        def force(output_ids, logits):
            token = forced_token(len(output_ids), args, vocab)
            logits[:] = -float("inf")
            logits[eos if token is None else token] = 0.0
            return logits

        return force


def check_cost(p: int, c: int) -> dict:
    """Seconds per scheduler step of vLLM's check_sequence_repetition over n running requests
    whose outputs are between 0 and 1,600 tokens long (a page of about 800), none looping."""
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition
    from vllm.v1.utils import ConstantList  # what the scheduler hands it

    rng = random.Random(0)
    params = RepetitionDetectionParams(max_pattern_size=p, min_count=c)
    out = {}
    for n in (32, 256, 1024):
        outputs = [ConstantList([rng.randrange(1000, 150000) for _ in range(rng.randrange(1600))])
                   for _ in range(n)]
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(10):
                for tokens in outputs:
                    check_sequence_repetition(tokens, params)
            best = min(best, (time.perf_counter() - started) / 10)
        out[n] = best
    return out


def offline(model: str, p: int, c: int, max_tokens: int) -> dict:
    """Completion tokens per looping page through vllm.LLM, by period, without and with
    detection at (P, C)."""
    import vllm
    from vllm.sampling_params import RepetitionDetectionParams

    llm = vllm.LLM(model=model, max_model_len=max_tokens + 256, enforce_eager=True,
                   logits_processors=[ForcedLoopProcessor], limit_mm_per_prompt={"image": 0})
    out = {}
    for detection in (None, RepetitionDetectionParams(max_pattern_size=p, min_count=c)):
        params = [vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                      extra_args={"loop_period": period},
                                      repetition_detection=detection) for period in PERIODS]
        answers = llm.generate(["A page:"] * len(PERIODS), params, use_tqdm=False)
        out["on" if detection else "off"] = {
            period: [len(a.outputs[0].token_ids), a.outputs[0].finish_reason]
            for period, a in zip(PERIODS, answers)}
    return out


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "check-cost":
        print(json.dumps(check_cost(int(rest[0]), int(rest[1]))))
    else:
        print(json.dumps(offline(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))))
