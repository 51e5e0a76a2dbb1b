"""The fake vllm's `vllm.sampling_params`: RepetitionDetectionParams as vLLM 0.17.1 on has it;
FAKE_VLLM_BEFORE_0_17=1 makes it a vLLM from before, without the class."""

import os

if os.environ.get("FAKE_VLLM_BEFORE_0_17"):
    raise ImportError("cannot import name 'RepetitionDetectionParams' from 'vllm.sampling_params'")


class RepetitionDetectionParams(dict):  # a dict: the call log records its fields
    def __init__(self, max_pattern_size: int = 0, min_pattern_size: int = 0, min_count: int = 0):
        super().__init__(max_pattern_size=max_pattern_size, min_pattern_size=min_pattern_size,
                         min_count=min_count)
