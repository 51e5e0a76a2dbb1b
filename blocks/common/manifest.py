"""What one run is: the identity a rerun must match, in OUTPUT's manifest."""

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from blocks.common.arguments import _IDENTITY
from blocks.common.errors import EXIT_USAGE, fail, RunAborted
from blocks.common.inputs import image_extensions, InputSource, ROW_IDENTITY, script_name
from blocks.common.loops import repetition_detection
from blocks.common.model_options import LOOP_TEMPERATURE
from blocks.common.pdf import file_tail, PdfPages
from blocks.common.secrets import redact_value
from blocks.common.store import OutputStore
from blocks.model import image_token_budget, inference_settings, JOB_IMAGE, SCRIPT_SHAPE

# The version of what OUTPUT records (manifest, journal, notes): another version is refused.
MANIFEST_FORMAT = 2  # 2: parts hold ROW_IDENTITY and <column>_skipped, notes list blank rows

# Engine flags that change speed and memory, never the text: the rest of the engine is identity
SPEED_ONLY_ENGINE_FLAGS = set("""gpu-memory-utilization data-parallel-size tensor-parallel-size
    pipeline-parallel-size api-server-count speculative-config max-num-seqs max-num-batched-tokens
    host port enforce-eager swap-space kv-cache-memory""".split())


def input_identity(args, files: list | None) -> dict:
    """A Hub dataset at its revision, or the files read: names, sizes, hashes (not of images)."""
    if files is None:
        return {"hub": args.input, "revision": hub_dataset_sha(args) or args.revision}
    local, entries, images = Path(args.input).expanduser(), [], image_extensions()
    for path in files:
        entry = str(path.relative_to(local) if path != local else path.name)
        try:
            entry += f" {path.stat().st_size} B"
            if path.suffix.lower() not in images:
                entry += f" #{hashlib.sha1(file_tail(path)).hexdigest()[:12]}"
        except OSError:  # a broken link: its row says it cannot be read
            entry += " unreadable"
        entries.append(entry)
    text = "\n".join(entries).encode("utf-8", "surrogateescape")
    identity = {"files": len(files), "digest": hashlib.sha256(text).hexdigest()[:20]}
    return {**identity, "list": entries} if len(entries) <= 2000 else identity  # names changes


def hub_dataset_sha(args) -> str | None:
    with contextlib.suppress(Exception):  # offline, or private without a token: datasets says so
        from huggingface_hub import HfApi

        return HfApi(token=args.hf_token or None).dataset_info(
            args.input, revision=args.revision, timeout=10).sha
    return None


def check_context_budget(max_model_len, args, option: str = "--max-model-len in --serve-args"
                         ) -> None:
    """Image tokens + max_tokens must fit the context (None: unknown), else every page fails."""
    budget = image_token_budget(args)
    need, room = budget + args.max_tokens, int(max_model_len or 0) - budget
    if max_model_len and need > int(max_model_len):
        advice = f"Lower --max-tokens to at most {room}, or raise" if room > 0 else \
            f"The largest page alone needs {budget} prompt tokens: raise"
        raise RunAborted(f"--max-tokens {args.max_tokens} plus {budget} prompt tokens (the largest "
                         f"page) is {need}, over max_model_len {max_model_len}: every request "
                         f"would be refused. {advice} {option} to at least {need}.", EXIT_USAGE)


def inference_info_entry(args, model_revision: str | None, **engine) -> dict:
    """This run's inference_info entry; engine: the shape's serve_args or llm_kwargs, redacted."""
    return {"model": args.model, "model_revision": model_revision, "script": script_name(),
            "shape": SCRIPT_SHAPE, "image": JOB_IMAGE, **engine,
            "column": args.output_column, "settings": run_settings(args)}  # plan_run stamps it


def run_settings(args) -> dict:
    """The model's settings and the loop retry's: what the card, inference_info and manifest say."""
    return {**inference_settings(args), "loop_retries": args.loop_retries,
            "loop_temperature": LOOP_TEMPERATURE,
            "repetition_detection": repetition_detection(args)}


def run_identity(args, source: InputSource, engine: dict) -> dict:
    """What a rerun must repeat: the input, options declared identity=True, the engine's flags."""
    options = {k: v for k, v in sorted(vars(args).items()) if _IDENTITY[k]
               and (k != "seed" or args.shuffle)}
    flags = {k.lstrip("-").replace("_", "-"): v for k, v in engine.items()}
    pdf = {"pdf": source.pdf.fingerprint()} if source.pdf is not None else {}
    return redact_value({  # a secret is no part of what the run is: a new token, the same run
        "script": script_name(), "input": input_identity(args, source.files), **pdf,
        "rows": source.rows_full, "options": options, "settings": run_settings(args), "engine": {
            k: v for k, v in sorted(flags.items()) if k not in SPEED_ONLY_ENGINE_FLAGS}}, None)


def run_digest(identity: dict, args) -> str:
    """The manifest's identity and --max-samples in 16 hex digits (ocr-jobs.py's Jobs label)."""
    text = json.dumps({"identity": identity, "max_samples": args.max_samples}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity_differences(old, new, where: str = "") -> list[str]:
    """Each difference between two identities, named (an option by its flag)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new), key=str)
                if key != "digest" or "list" not in old or "list" not in new  # the lists say more
                for line in identity_differences(old.get(key), new.get(key), (
                    f"--{key.replace('_', '-')}" if where == "options" else f"{where}.{key}"
                    ).lstrip("."))]
    if where == "input.list" and isinstance(old, list) and isinstance(new, list):
        changed = sorted(set(old) ^ set(new))  # a file renamed or changed: twice
        return [f"input files gone, new or changed: {', '.join(changed[:4])}"
                f"{f', ... ({len(changed)} in all)' * (len(changed) > 4)}"]
    return [f"{where}: was {json.dumps(old)}, now {json.dumps(new)}"]


def pinned_input(store: "OutputStore", args):
    """A rerun without --revision (not a whole --restart) reads the Hub input the first read."""
    if args.revision is None and not (args.restart and args.num_shards == 1):
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            args.revision = store.manifest()["identity"]["input"].get("revision")
    return args


def check_same_run(recorded: dict | None, identity: dict, store: "OutputStore", args,
                   pdf: "PdfPages | None" = None) -> None:
    """Refused, each difference named, unless OUTPUT's manifest is of this format and run."""
    def way_out(restart: str) -> str:  # no --restart deletes other shards' rows
        others = store.other_shards_rows() + store.other_writers() if args.num_shards > 1 else []
        return f"write to a new OUTPUT (other shards' rows are in it: {others[0]}, and a " \
            f"shard's --restart redoes its own rows only)" if others else restart

    version = (recorded or {}).get("format", 0)
    if version != MANIFEST_FORMAT:
        newer = isinstance(version, int) and version > MANIFEST_FORMAT
        fail(f"OUTPUT {store.location()} was written by {'a newer' if newer else 'an older'} "
             f"version of this script (manifest format {version}): " + (
                 "update the script (fetch it again from its URL) and rerun." if newer else
                 way_out("pass --restart to redo the run, or write to a new OUTPUT") + "."))
    before, now = recorded.get("max_samples"), args.max_samples
    longer = args.num_shards == 1 and (now is None or (before is not None and now > before))
    was = (recorded.get("identity") or {}).get("pdf")
    if pdf is not None and isinstance(was, str):  # recorded before the count was: its digest
        identity = {**identity, "pdf": pdf.fingerprint()["digest"]}
    elif pdf is not None and longer and isinstance(was, dict) and \
            isinstance(was.get("documents"), int):  # more documents: the first ones the same
        identity = {**identity, "pdf": pdf.fingerprint(was["documents"])}
    problems = identity_differences(recorded.get("identity"), identity)
    if before != now and not longer:  # the same order, longer
        problems.append(f"--max-samples: was {before}, now {now} (only a larger one, on an "
                        f"unsharded run)")
    if problems:
        advice = way_out("write to another OUTPUT, or pass --restart to delete what OUTPUT "
                         "holds and start it over")
        fail(f"OUTPUT {store.location()} holds another run, so resuming into it would mix "
             f"two runs:\n  " + "\n  ".join(problems) + f"\n{advice[0].upper()}{advice[1:]}.")


def claim_output(store: "OutputStore", identity: dict, args,
                 pdf: "PdfPages | None" = None) -> None:
    """The first run of an OUTPUT records what the run is; every later one must be the same."""
    identity = json.loads(json.dumps(identity))  # as it reads back
    rows, running = (store.other_shards_rows(), store.other_writers()) \
        if args.restart and args.num_shards > 1 else ([], [])
    if args.restart and not rows + running:
        store.restart()
    elif store.manifest() is not None or (rows if args.restart else store.parts()):
        check_same_run(store.manifest(), identity, store, args, pdf)
    if rows + running:  # a shard's --restart redoes its rows only, as the same run
        store.restart(f"shard {args.shard_index} of {args.num_shards}")
    existing = store.write_manifest({
        "format": MANIFEST_FORMAT, "identity": identity, "max_samples": args.max_samples,
        "row_identity": ROW_IDENTITY,  # the column ocr-compare.py pairs rows by
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": os.urandom(8).hex()})  # a run restarted in the same second is another
    if existing is not None:  # another run (a shard, a rerun) recorded it: this one must match
        check_same_run(existing, identity, store, args, pdf)
        if existing.get("max_samples") != args.max_samples:  # and what the longer run reads
            store.write_manifest({**existing, "max_samples": args.max_samples,
                                  "identity": identity}, replace=True)
