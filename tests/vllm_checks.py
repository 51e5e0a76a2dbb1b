"""Checks that run inside the CPU vLLM environment, called by the engine tests.

    ENGINE_PYTHON tests/vllm_checks.py serve-args '{"script.py": ["--max-model-len", "32768"]}'
    ENGINE_PYTHON tests/vllm_checks.py llm-kwargs '{"script.py": {"max_model_len": 32768}}'

CHECK_MODEL names a local checkpoint for the model argument (nothing is downloaded here).
Several scripts are checked in one process (importing vLLM takes seconds); each gets its
parsed values or its error.

serve-args: parse the arguments with vLLM's own `vllm serve` parser (unmodified), run its
pre-load validation, build the engine arguments from them, and print the parsed values the
tests care about as JSON. A flag the pinned vLLM rejects exits non-zero.
llm-kwargs: build vLLM's EngineArgs from the keyword arguments an offline script gives
`vllm.LLM`, as LLM(...) does; an unknown or mistyped argument exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys


def parse_serve_args(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args([os.environ.get("CHECK_MODEL", "some/model"), *argv])
    if args.model_tag:  # as `vllm serve MODEL` does: the positional names the model
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    keys = ["max_model_len", "enable_prefix_caching", "mm_processor_cache_gb",
            "limit_mm_per_prompt", "mm_processor_kwargs", "logits_processors",
            "trust_remote_code", "gpu_memory_utilization", "served_model_name",
            "speculative_config", "attention_config", "enable_chunked_prefill",
            "default_chat_template_kwargs", "api_server_count", "gdn_prefill_backend",
            "attention_backend", "port"]
    out = {}
    for key in keys:
        value = getattr(engine_args, key, getattr(args, key, None))
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)
        out[key] = value
    return out


def check_llm_kwargs(kwargs: dict) -> dict:
    from vllm.engine.arg_utils import EngineArgs

    engine_args = EngineArgs(model=os.environ.get("CHECK_MODEL", "some/model"), **kwargs)
    return {key: repr(getattr(engine_args, key)) for key in kwargs}


if __name__ == "__main__":
    command, payload = sys.argv[1], json.loads(sys.argv[2])
    check = parse_serve_args if command == "serve-args" else check_llm_kwargs
    results = {}
    for name, value in payload.items():
        try:
            results[name] = {"ok": True, "values": check(value)}
        except BaseException as exc:  # argparse exits with SystemExit on a rejected flag
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print("RESULT " + json.dumps(results))
