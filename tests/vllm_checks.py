"""Checks that run inside the CPU vLLM environment, called by the engine tests.

    ENGINE_PYTHON tests/vllm_checks.py serve-args '{"script.py": ["--max-model-len", "32768"]}'
    ENGINE_PYTHON tests/vllm_checks.py llm-kwargs '{"script.py": {"max_model_len": 32768}}'
    ENGINE_PYTHON tests/vllm_checks.py request '{"script.py": {"model": "m", "messages": [...]}}'
    ENGINE_PYTHON tests/vllm_checks.py offline '{"script.py": {"llm": {...}, "sampling": {...},
                                                               "chat": {...}}}'

The `vllm` imported is whichever comes first on the path: the CI engine's own (0.32.0), or a
release a script pins, unpacked from its wheel and put first on PYTHONPATH (tests/pinned_vllm.py),
so the same checks run against the release each script's image ships. Several scripts are
checked in one process (importing vLLM takes seconds); each gets its parsed values or the
reason it was refused. CHECK_MODEL names a local checkpoint where one is needed.

Only a refusal is caught (argparse's exit, the ValueError/TypeError a validator or a dataclass
raises, pydantic's ValidationError): anything else, an import error first of all, ends the
process without a RESULT line, so the calling test fails instead of counting it as a refusal.

serve-args: the arguments parsed by that release's `vllm serve` parser (unmodified), its
pre-load validation, and the engine arguments built from them, as `vllm serve` does.
llm-kwargs: that release's EngineArgs built from the keyword arguments an offline script gives
`vllm.LLM` (what LLM(...) does), then its model config built from the checkpoint (the values
validated, not only named).
request: one chat request's top-level fields checked by name against that release's
ChatCompletionRequest (vLLM ignores unknown fields silently), then validated by it.
offline: vllm.LLM, SamplingParams and LLM.chat keyword arguments checked by name against that
release's EngineArgs fields and LLM.__init__ parameters, SamplingParams fields, and LLM.chat's
parameters; SamplingParams is built.
batch: '{"serve-args": {...}, "request": {...}}': several kinds in one process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
import os
import sys

REFUSALS = (SystemExit, ValueError, TypeError)  # pydantic's ValidationError is a ValueError


def serve_parser():
    try:  # 0.30 moved the serve arguments out of entrypoints.openai
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ModuleNotFoundError as exc:
        if exc.name not in ("vllm.entrypoints.launchers", "vllm.entrypoints.launchers.cli_args"):
            raise
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve")), validate_parsed_serve_args


def parse_serve_args(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser, validate = serve_parser()
    if argv[:1] == ["serve"]:  # a whole `vllm serve MODEL ...` command line, as a script spawns
        # it; the model becomes CHECK_MODEL, a local folder (with HF_HUB_OFFLINE, some releases
        # resolve a Hub id to its cached snapshot while building the engine arguments)
        argv = [os.environ.get("CHECK_MODEL", argv[1]), *argv[2:]]
    else:
        argv = [os.environ.get("CHECK_MODEL", "some/model"), *argv]
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None):  # as `vllm serve MODEL` does: the positional names it
        args.model = args.model_tag
    validate(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    keys = ["model", "max_model_len", "enable_prefix_caching", "mm_processor_cache_gb",
            "limit_mm_per_prompt", "mm_processor_kwargs", "logits_processors",
            "trust_remote_code", "gpu_memory_utilization", "served_model_name",
            "speculative_config", "attention_config", "enable_chunked_prefill",
            "default_chat_template_kwargs", "api_server_count", "gdn_prefill_backend",
            "attention_backend", "port", "host"]
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
    config = engine_args.create_model_config()  # validates the values against the checkpoint
    out = {}
    for key in kwargs:
        value = getattr(engine_args, key)
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)
        out[key] = value
    out["model_config.max_model_len"] = config.max_model_len
    return out


def request_model():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    return ChatCompletionRequest


def check_request(body: dict) -> dict:
    model = request_model()
    unknown = sorted(set(body) - set(model.model_fields))
    if unknown:
        raise ValueError(f"fields this vLLM does not define (it would ignore them): {unknown}")
    request = model.model_validate(body)
    return {key: repr(getattr(request, key)) for key in body if key != "messages"}


def check_offline(calls: dict) -> dict:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.llm import LLM
    from vllm.sampling_params import SamplingParams

    llm_params = set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(calls["llm"]) - llm_params - engine_fields)
    if unknown:
        raise TypeError(f"vllm.LLM keyword arguments this vLLM does not define: {unknown}")
    chat_params = set(inspect.signature(LLM.chat).parameters) - {"self"}
    unknown = sorted(set(calls["chat"]) - chat_params)
    if unknown:
        raise TypeError(f"LLM.chat keyword arguments this vLLM does not define: {unknown}")
    sampling_fields = set(getattr(SamplingParams, "__struct_fields__", ())) or \
        {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(calls["sampling"]) - sampling_fields)
    if unknown:
        raise TypeError(f"SamplingParams fields this vLLM does not define: {unknown}")
    sampling = SamplingParams(**calls["sampling"])
    return {key: repr(getattr(sampling, key)) for key in calls["sampling"]}


CHECKS = {"serve-args": parse_serve_args, "llm-kwargs": check_llm_kwargs,
          "request": check_request, "offline": check_offline}

def run_checks(command: str, payload: dict) -> dict:
    results = {}
    for name, value in payload.items():
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                results[name] = {"ok": True, "values": CHECKS[command](value)}
        except REFUSALS as exc:  # argparse exits with SystemExit(2) on a rejected flag
            said = stderr.getvalue().strip().splitlines()[-1:] or [""]
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc} {said[0]}".strip()}
    return results


if __name__ == "__main__":
    command, payload = sys.argv[1], json.loads(sys.argv[2])
    import vllm  # outside any try: a vllm that cannot be imported is a failure, not a refusal

    about = {"version": getattr(vllm, "__version__", None), "file": getattr(vllm, "__file__", None)}
    if command == "batch":  # {command: {name: value}}: several kinds of check in one process
        results = {kind: run_checks(kind, items) for kind, items in payload.items()}
    else:
        results = run_checks(command, payload)
    print("RESULT " + json.dumps({"__vllm__": about, **results}))
