"""The OFFLINE HELPERS block of the offline scripts: vllm.LLM in fixed batches.

Edit here, then run `python tools/sync_helpers.py`. In a script, the names imported below come
from its model section (blocks/model.py) or an earlier block.
"""

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from blocks.common.arguments import option
from blocks.common.errors import fail, log
from blocks.common.inputs import iter_image_cells, requested_revision, resolved_revision
from blocks.common.jobs_command import jobs_advice
from blocks.common.loops import cut_at_loop, kept_attempt, loop_seed, loops, repetition_detection
from blocks.common.model_options import LOOP_TEMPERATURE
from blocks.common.pages import PreparedPage
from blocks.common.rows import exception_row, PAGE, read_page, RowResult
from blocks.common.saving import finish_row, HeldFailures
from blocks.model import (
    build_messages, CHAT_KWARGS, JOB_IMAGE, LLM_KWARGS, sampling_kwargs, VLLM_REQUIREMENT,
)

# ==== BEGIN OFFLINE HELPERS (edit blocks/offline.py, then run tools/sync_helpers.py) ====
# vllm.LLM in fixed batches, with the model section's LLM_KWARGS, CHAT_KWARGS, build_messages().
import base64
import site
from concurrent.futures import ThreadPoolExecutor

for _extra_site in filter(None, os.environ.get("OCR_SCRIPT_EXTRA_SITE", "").split(os.pathsep)):
    if _extra_site not in sys.path:  # after the image's torch and vllm; .pth files read (uv)
        site.addsitedir(_extra_site)


def gpu_visible() -> bool:
    """An NVIDIA or AMD GPU device, or nvidia-smi: where a vLLM GPU build is worth installing."""
    return bool(shutil.which("nvidia-smi")) or any(map(os.path.exists, ("/dev/nvidiactl",
                                                                        "/dev/kfd")))


def ensure_vllm(argv: list[str]) -> None:
    """Before anything is read or created: vllm here, else this script under the Python that has
    it (the vLLM image's), else under uv with vllm where a GPU is; else exit 2 with Jobs advice."""
    import importlib.util

    with contextlib.suppress(ImportError, ValueError):
        if importlib.util.find_spec("vllm") is not None:
            return
    script, env = str(Path(sys.argv[0]).resolve()), {**os.environ, "OCR_SCRIPT_REEXEC": "1"}
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    for python in ("/usr/bin/python3", "/usr/local/bin/python3", "/opt/conda/bin/python3"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if not os.environ.get("OCR_SCRIPT_REEXEC") and not subprocess.run(
                    [python, "-c", probe], capture_output=True, timeout=60).returncode:
                log(f"using the vllm installed for {python} (nothing heavy is installed)")
                extra = os.pathsep.join(site.getsitepackages())  # the light dependencies
                os.execve(python, [python, script, *argv], {**env, "OCR_SCRIPT_EXTRA_SITE": extra})
    if gpu_visible() and (uv := shutil.which("uv")) and not os.environ.get("OCR_SCRIPT_REEXEC"):
        log(f"vllm is not installed here; asking uv for vllm{VLLM_REQUIREMENT} (several GB once)")
        os.execve(uv, [uv, "run", "--with", f"vllm{VLLM_REQUIREMENT}", script, *argv], env)
    fail(f"vllm cannot be imported here.\n\nRun it on Hugging Face Jobs:\n{jobs_advice()}\n\n"
         f"or locally: `pip install 'vllm{VLLM_REQUIREMENT}'` (or run it in "
         f"{JOB_IMAGE}), then rerun the same command.")


def effective_llm_kwargs(args) -> dict:
    """LLM_KWARGS, the resolved revision, then --llm-kwargs over them (null removes a key)."""
    revision = resolved_revision(args) or requested_revision(args)
    merged = {**LLM_KWARGS, **({"revision": revision} if revision else {}),
              **json.loads(args.llm_kwargs or "{}")}
    return {key: value for key, value in merged.items() if value is not None}


def generate_batch(llm, sampling, items: list, args, held: HeldFailures) -> list[tuple]:
    """[(result, counted exception name)]; a raising batch is split till the bad row is alone."""
    try:
        urls = [f"data:{page.mime};base64,{base64.b64encode(page.data).decode()}"
                for _, page in items]
        outputs = llm.chat([build_messages(url, args) for url in urls], sampling, use_tqdm=False,
                           **CHAT_KWARGS)
    except Exception as exc:
        memory = "out of memory" in str(exc).lower()
        if "EngineDead" in type(exc).__name__ or memory:  # no engine
            held.stop(f"the vLLM engine is gone ({type(exc).__name__}: {str(exc)[:300]})" + (
                "; out of memory: a smaller --batch-size, or gpu_memory_utilization in "
                "--llm-kwargs, is the same run" if memory else ""))
        if len(items) == 1:
            counts = None if isinstance(exc, ValueError) else type(exc).__name__
            return [(exception_row(exc, PAGE, "generation failed: "), counts)]
        half = len(items) // 2
        return generate_batch(llm, sampling[:half], items[:half], args, held) + \
            generate_batch(llm, sampling[half:], items[half:], args, held)
    results = []
    for output in outputs:
        try:  # an output without a completion is this row's error
            done = output.outputs[0]
            results.append(RowResult(text=cut_at_loop(done.text, done.finish_reason),
                                     finish_reason=done.finish_reason, attempts=1,
                                     prompt_tokens=len(output.prompt_token_ids or []),
                                     completion_tokens=len(done.token_ids)))
        except Exception as exc:
            results.append(exception_row(exc, PAGE, "unreadable output: "))
    return [(result, None) for result in results]


def run_offline(run, args, llm_kwargs: dict) -> None:
    """Start vllm.LLM, then fixed batches, the next one prepared while the engine runs this."""
    from tqdm import tqdm

    # bare CUDA images have no compiler for these JIT paths; set before import
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_USE_DEEP_GEMM", "0")
    import vllm

    run.stats.vllm_version = run.info_entry["vllm_version"] = getattr(vllm, "__version__", None)
    started = time.monotonic()
    llm = vllm.LLM(model=args.model, **llm_kwargs)
    run.stats.server_startup_s = round(time.monotonic() - started, 2)
    detection = {}
    if repetition_detection(args):
        try:
            from vllm.sampling_params import RepetitionDetectionParams
            detection["repetition_detection"] = RepetitionDetectionParams(
                **repetition_detection(args))
        except ImportError:  # a vLLM before 0.17.1 runs without, and the record says so
            log("warning: this vLLM has no repetition_detection (it came in 0.17.1): "
                "--repetition-detection is off for this run")
            run.info_entry["settings"]["repetition_detection"] = None

    def sampling(seed: int | None):  # with a seed, a loop retry's
        retry = {} if seed is None else {"temperature": LOOP_TEMPERATURE, "seed": seed}
        return vllm.SamplingParams(**{**sampling_kwargs(args), **detection, **retry})

    stats, writer, pending = run.stats, run.writer, run.plan.send
    pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                              thread_name_prefix="prepare")
    cells = iter_image_cells(run.source, pending)

    def submit_next():
        return [(index, pool.submit(read_page, cell, args, run.renderer))
                for index, cell in itertools.islice(cells, args.batch_size)]

    # 16 pages in a row failing alone (the engine raised), none answered between, stop the run
    held = HeldFailures("engine", 16, 0.0, "failed one by one, none answered between")
    bar = tqdm(total=len(pending), unit="page", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 10.0)
    try:
        upcoming = submit_next()
        while upcoming:
            prepared = [(index, future.result()) for index, future in upcoming]
            upcoming = submit_next()
            results = dict(prepared)  # a page not sent: its row (its error, its text layer)
            valid = [(index, page) for index, page in prepared if isinstance(page, PreparedPage)]
            counted = {}  # row -> its exception, when its failure counts in the streak
            stats.peak_in_flight = max(stats.peak_in_flight, len(valid))
            stats.first_started = stats.first_started or time.monotonic()
            started = time.monotonic()
            for attempt in range(args.loop_retries + 1 if valid else 0):
                # the first pass, then the looping pages again, each with its row's seed
                batch = [(index, page) for index, page in valid if not attempt or
                         loops(results[index].text, results[index].finish_reason)]
                if not batch:
                    break
                seeded = [sampling(loop_seed(index, attempt)) for index, _ in batch] \
                    if attempt else [sampling(None)] * len(batch)  # one for the greedy pass
                for (index, page), (result, counts) in zip(
                        batch, generate_batch(llm, seeded, batch, args, held)):
                    result.text_layer, result.digest = page.text_layer, page.digest
                    results[index] = kept_attempt(results[index], result) if attempt else result
                    counted.setdefault(index, counts)
            latency = time.monotonic() - started
            for index, page in prepared:
                finish_row(writer, stats, held, index, results[index],
                           latency if isinstance(page, PreparedPage) else None, counted.get(index))
            bar.update(len(prepared))
            bar.set_postfix(errors=stats.errors_seen, refresh=False)
            if writer.due():
                writer.flush()
        held.at_end(writer)
    finally:
        bar.close()
        pool.shutdown(wait=False, cancel_futures=True)


def add_offline_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    option(group, "--batch-size", type=int, at_least=1, default=16, identity=False,
           help="pages per generate call (default: 16)")
    option(group, "--llm-kwargs", default="", identity=False, help="JSON over the script's "
           "vllm.LLM arguments, e.g. '{\"max_model_len\": 16384}'; null removes one")


def offline_argument_problems(args) -> list[str]:
    """--llm-kwargs, if wrong (parse_arguments reports it with the rest)."""
    with contextlib.suppress(ValueError):
        if isinstance(json.loads(args.llm_kwargs or "{}"), dict):
            return []
    return ["--llm-kwargs must be a JSON object"]
# ==== END OFFLINE HELPERS ====
