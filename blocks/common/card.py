"""The dataset card: what ran, on what, with what result; metadata for Hub search."""

import contextlib
import json
import os
import shlex
from pathlib import Path

from blocks.common.inputs import _TEXT_LAYER_COLUMNS, InputSource, ROW_IDENTITY, script_name
from blocks.common.jobs_command import jobs_command, jobs_notes
from blocks.common.model_options import (
    IMAGE_TAG_MOVING, LOOP_TEMPERATURE, MODEL_CARD_NOTE, REPETITION_DETECTION_NOTE,
)
from blocks.common.saving import part_name, ranges_from_names
from blocks.common.store import OutputStore
from blocks.model import JOB_IMAGE, MODEL_ID, SCRIPT_SHAPE

def part_note(path: Path, column: str) -> dict:
    """A part's error rows (row -> kind) and text-layer row count, as a rerun and the card read."""
    import pyarrow.parquet as pq

    names = [column + suffix for suffix in ("", "_error", "_error_kind", "_skipped")]
    part = pq.ParquetFile(path)
    table = part.read(columns=[name for name in names if name in part.schema_arrow.names])
    text, error, kind, skipped = (table[name].to_pylist() if name in table.column_names
                                  else [None] * table.num_rows for name in names)
    start = ranges_from_names([path.name])[0][0]
    return {"errors": {str(start + i): k for i, (e, k) in enumerate(zip(error, kind))
                       if e is not None},
            "text_layer": sum(t is None and s is not None for t, s in zip(text, skipped)),
            "blank": [start + i for i, (t, s) in enumerate(zip(text, skipped))
                      if t == "" and s is not None]}


def output_counts(store: OutputStore, column: str) -> str:
    """The whole output's rows, counted from its parts (every shard, every earlier run)."""
    rows = failed = text_layer = blank = unknown = 0
    for (start, stop), path in store.parts():
        rows += stop - start
        try:
            note = part_note(path, column) if path else store.notes[part_name(start, stop)]
            failed, text_layer = failed + len(note["errors"]), text_layer + note["text_layer"]
            blank += len(note["blank"])
        except Exception:  # only on the Hub, without a note (an older run), or another layout
            unknown += stop - start
    layer = f", {text_layer:,} from their PDF text layer (not sent)" if text_layer else ""
    layer += f", {blank:,} blank pages (not sent: an empty text, `{column}_skipped` says " \
        f"why)" if blank else ""
    return (f"This output holds {rows:,} rows: {rows - failed - text_layer - unknown:,} with "
            f"text{layer} and {failed:,} error rows"
            + (f" ({unknown:,} on the Hub were not counted)." if unknown else "."))


SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                   (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"),
                   (1_000_000_000, "100M<n<1B"))


def input_license(args, hub: bool) -> str | None:
    """The licence the input's card (Hub, or a local README.md) gives, else None."""
    with contextlib.suppress(Exception):  # offline, private, an unreadable card: no licence
        from huggingface_hub import DatasetCard, HfApi

        if hub:
            data = HfApi(token=args.hf_token or None).dataset_info(
                args.input, revision=args.revision, timeout=10).card_data
        else:
            local = Path(args.input).expanduser()
            card = (local if local.is_dir() else local.parent) / "README.md"
            data = DatasetCard.load(card).data if card.is_file() else None
        licence = getattr(data, "license", None) if data is not None else None
        return licence if isinstance(licence, (str, list)) and licence else None
    return None


def card_metadata(source: InputSource, store: OutputStore, args):
    """The card's YAML for the Hub's search and filters (no `configs:`, see REFERENCE)."""
    from huggingface_hub import DatasetCardData

    rows = sum(stop - start for (start, stop), _ in store.parts())
    hub_input = source.files is None  # as input_identity tells a Hub input from a local one
    return DatasetCardData(
        pretty_name=f"{source.description} OCR with {MODEL_ID.split('/')[-1]}"[-120:],
        task_categories=["image-to-text"], tags=["ocr", "vllm", "uv-script"],
        size_categories=[next((name for top, name in SIZE_CATEGORIES if rows < top), "n>1B")],
        source_datasets=[args.input] if hub_input else None, license=input_license(args, hub_input))


def build_card(source: InputSource, store: OutputStore, args, stats: dict,
               info_entry: dict) -> str:
    from huggingface_hub import DatasetCard

    column, pdf, settings = args.output_column, source.pdf, info_entry["settings"]
    serve = info_entry.get("serve_args")
    on_jobs = os.environ.get("JOB_ID") or os.environ.get("HF_JOB_ID")
    moving = ", a moving tag: its vLLM version is in the stats" if IMAGE_TAG_MOVING else ""
    text = "the PDF's pages as Markdown, each after a line `<!-- page N -->`" \
        if pdf is not None and pdf.per_document else "the page as Markdown"
    rows = "".join(f"| `{name}` | {meaning} |\n" for name, meaning, shown in (
        ("page_number", "the page of its PDF, from 1; null for an image or a PDF that cannot be "
         "opened", pdf is not None and not pdf.per_document),
        ("page_count", "the pages of its PDF", pdf is not None),
        (f"{column}_text_layer", "the text embedded in the PDF page",
         "text_layer" in _TEXT_LAYER_COLUMNS),
        (f"{column}_skipped", f"why the page was not sent: blank (no ink found; `{column}` is "
         f"empty) or its text layer had enough text (`{column}` is null); null when sent", True)) if shown)
    looping, detection = stats.get("pages_still_looping") or 0, settings["repetition_detection"]
    shards = [f"The run was split into {args.num_shards} shards: one Job each, with --shard-index "
              f"0 to {args.num_shards - 1}."] if args.num_shards > 1 else []
    loop_summary = (f"{stats.get('pages_loop_retried') or 0:,} pages looped and were sent again "
                    f"at temperature {LOOP_TEMPERATURE} with a seed from the row (`--loop-retries "
                    f"{args.loop_retries}`); {looping:,} still loop." if args.loop_retries else
                    f"Looping pages were not sent again (`--loop-retries 0`); {looping:,} loop.") \
        + (f" vLLM's repetition detection ended loops in the engine (`repetition_detection` "
           f"{json.dumps(detection)}){REPETITION_DETECTION_NOTE}." if detection else "")
    return str(DatasetCard(f"---\n{card_metadata(source, store, args).to_yaml()}\n---\n" + f"""
# OCR of `{source.description}` with {MODEL_ID}

Each row of the input with its page transcribed into the `{column}` column by
[{MODEL_ID}](https://huggingface.co/{MODEL_ID}) on vLLM (`{JOB_IMAGE}`{moving}),
with `{script_name()}` ({SCRIPT_SHAPE} shape), from {
    f"Hugging Face Job {on_jobs}" if on_jobs else "a local run"}.
Weights: `{args.model}` at revision `{info_entry.get("model_revision") or "unknown"}`.
{f"{chr(10)}{MODEL_CARD_NOTE}{chr(10)}" if MODEL_CARD_NOTE else ""}
| column | meaning |
| --- | --- |
| `{column}` | {text}; null when the row failed |
| `{column}_error` | why the row failed; null on success |
| `{column}_error_kind` | `page` (the page caused it: final) or `server` (a rerun retries it) |
| `{column}_finish_reason` | `stop`, `length` (out of tokens) or `repetition` (cut by the engine) |
| `{column}_prompt_tokens`, `{column}_completion_tokens` | token counts of the request |
| `{column}_attempts` | generations the text took: above 1 when it looped and was sent again |
| `{ROW_IDENTITY}` | the page the row was made from: SHA-256 of the image's bytes (first 20 hex \
digits); of a PDF page, its document's and `#page=N`. Rows of byte-identical pages share it \
(`ocr-compare.py` pairs rows by it); kept from the input when it has one |
{rows}\
| `inference_info` | JSON list, one entry per model run over this dataset |

{output_counts(store, column)}

## This run

{loop_summary}

```json
{json.dumps(stats, indent=2)}
```

Settings:

```json
{json.dumps(settings, indent=2, ensure_ascii=False)}
```

Serve flags: `{shlex.join(serve) if serve else 'offline engine'}`

Reproduce on Hugging Face Jobs:

```
{jobs_command(in_card=True)}
```

{chr(10).join("* " + note for note in jobs_notes(in_card=True) + shards)}
"""))
