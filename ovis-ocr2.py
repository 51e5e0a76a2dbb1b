# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "datasets>=3.0",
#     "huggingface_hub>=0.34",
#     "pillow>=10.4",
#     "tqdm>=4.66",
# ]
#
# [tool.hf-jobs]
# image = "vllm/vllm-openai:v0.26.0"
# flavor = "l4x1"
# secrets = ["HF_TOKEN"]
# ///
"""OCR a dataset of page images with ATH-MaaS/OvisOCR2, offline: this script owns vllm.LLM.

Pages go to the engine in fixed batches (`--batch-size`, default 16), the shape of the model
card's own example. It is the baseline that ovis-ocr2-server.py is measured against (the seed:
0.83 img/s offline against 1.44 img/s through a server on l4x1); use it when you want one
process and no HTTP. A page whose image cannot be decoded gets its error before the batch is
built, and a batch that raises is split until the failing row is isolated: one bad row never
fails its batch.

Run it
    hf jobs uv run --image vllm/vllm-openai:v0.26.0 --flavor l4x1 --secrets HF_TOKEN \\
        ovis-ocr2.py user/scans user/scans-ocr
    uv run ovis-ocr2.py ./scans ./scans-ocr          # a machine with a GPU

vLLM is not in the dependency list on purpose: in the vLLM image the script runs on the
image's own vllm and torch (it re-runs itself under the interpreter that has them, with the
light dependencies above appended to its path), so a Job installs nothing heavy. On a machine
without vllm it asks uv for it (`uv run --with vllm...`), so `uv run ovis-ocr2.py` still works.

Where the engine arguments come from
    The card's offline arguments: max_model_len 32768, gpu_memory_utilization 0.8, one image
    per prompt, gdn_prefill_backend "triton" (avoids a JIT compile), the card's pixel bounds
    (448x448 to 2880x2880) as processor kwargs; plus the recurring OCR settings (no prefix
    caching, no multimodal processor cache). Thinking off, greedy, max_tokens 16384.
"""

import math
import re

# ============================================================================================
# Model section: the only part that differs between scripts. To adapt this script to another
# model, edit this section (and models.json); leave the helper blocks below untouched.
# ============================================================================================

MODEL_ID = "ATH-MaaS/OvisOCR2"
MODEL_REVISION = None  # a commit sha pins the weights; None takes the repo's main branch
IMAGE_TAG = "v0.26.0"  # vllm/vllm-openai:<tag> this script was run with
JOB_IMAGE = f"vllm/vllm-openai:{IMAGE_TAG}"
IMAGE_HAS_UV = True  # the vLLM images have uv: `hf jobs uv run` works
VLLM_REQUIREMENT = ">=0.22.1"  # what `uv run --with vllm...` asks for where none is installed
DEFAULT_FLAVOR = "l4x1"
SCRIPT_SHAPE = "offline"

# The card's prompt, character for character (it starts with a newline; braces are literal).
PROMPT = (
    "\nExtract all readable content from the image in natural human reading order and output "
    "the result as a single Markdown document. For charts or images, represent them using an "
    'HTML image tag: <img src="images/bbox_{left}_{top}_{right}_{bottom}.jpg" />, where left, '
    "top, right, bottom are bounding box coordinates scaled to [0, 1000). Format formulas as "
    "LaTeX. Format tables as HTML: <table>...</table>. Transcribe all other text as standard "
    "Markdown. Preserve the original text without translation or paraphrasing."
)

MAX_MODEL_LEN = 32768
DEFAULT_MAX_TOKENS = 16384
TEMPERATURE = 0.0
MIN_PIXELS = 448 * 448  # 200,704: the processor upscales below this; the client never does
MAX_PIXELS = 2880 * 2880  # 8,294,400: the client downscales above this, to the processor's grid
PATCH_GRID = 32  # Qwen3.5 vision: 16 px patches merged 2x2, so sizes snap to multiples of 32
PROMPT_TEXT_TOKENS = 256  # generous bound on the chat template and prompt text around the image
PAGE_FORMAT = "jpeg"  # pages that must be converted or resized: JPEG quality 95 (others go as is)
PREFIX_CACHING = False

LLM_KWARGS = {
    "max_model_len": MAX_MODEL_LEN,
    "gpu_memory_utilization": 0.8,
    "limit_mm_per_prompt": {"image": 1},
    "enable_prefix_caching": False,
    "mm_processor_cache_gb": 0,
    "mm_processor_kwargs": {"images_kwargs": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}},
    "gdn_prefill_backend": "triton",
}
CHAT_KWARGS = {"chat_template_kwargs": {"enable_thinking": False}}


def image_token_budget() -> int:
    """Worst-case prompt tokens of one page: the largest image plus the text around it."""
    return MAX_PIXELS // (PATCH_GRID * PATCH_GRID) + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int) -> tuple[int, int]:
    """The size to send: unchanged unless above MAX_PIXELS, then the processor's own choice."""
    if width * height <= MAX_PIXELS:
        return width, height
    scale = math.sqrt(width * height / MAX_PIXELS)
    new_w = max(PATCH_GRID, math.floor(width / scale / PATCH_GRID) * PATCH_GRID)
    new_h = max(PATCH_GRID, math.floor(height / scale / PATCH_GRID) * PATCH_GRID)
    return new_w, new_h


def add_model_arguments(parser) -> None:
    parser.add_argument(
        "--keep-image-tags", action="store_true",
        help="keep the <img src=\"images/bbox_...\"> figure placeholders in the Markdown "
             "(the card's clean-up drops them)")


def build_messages(image_url: str, args) -> list[dict]:
    """One conversation: the image first, then the prompt (the same message the server gets)."""
    return [{
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": PROMPT},
        ],
    }]


def sampling_kwargs(args) -> dict:
    return {"temperature": TEMPERATURE, "max_tokens": args.max_tokens}


def postprocess(text: str, args) -> tuple[str, dict]:
    """The card's clean-up: drop figure-placeholder blocks, trim a degenerate repeated tail."""
    if not args.keep_image_tags:
        blocks = re.split(r"\n\s*\n", text)
        text = "\n\n".join(b for b in blocks if not b.lstrip().startswith('<img src="images/bbox_'))
    return trim_repeated_tail(text), {}


EXTRA_COLUMNS: dict = {}  # column suffix -> "blocks" or "string": model-specific output columns


def inference_settings(args) -> dict:
    """What the inference_info entry and the card record about this model's settings."""
    return {"prompt": PROMPT, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
            "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
            "chat_template_kwargs": {"enable_thinking": False}}


# ==== BEGIN COMMON HELPERS (identical in every script; edit one copy, run tools/sync_helpers.py) ====
# Input, page images, output parts, dataset card, stats. The model section above provides:
# MODEL_ID, MODEL_REVISION, JOB_IMAGE, IMAGE_HAS_UV, DEFAULT_FLAVOR, SCRIPT_SHAPE, PAGE_FORMAT,
# target_size(), postprocess(), inference_settings(), EXTRA_COLUMNS, DEFAULT_MAX_TOKENS.
import argparse
import io
import json
import os
import random
import resource
import shlex
import signal
import statistics
import sys
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif", ".jp2"}
MAX_DECODE_PIXELS = 250_000_000  # larger than any real scan: above it, a decompression bomb
PART_NAME = re.compile(r"^part-(\d{9})-(\d{9})\.parquet$")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
UPLOAD_ATTEMPTS, UPLOAD_BACKOFF_S = 5, 2.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    log(f"error: {message}")
    raise SystemExit(code)


class PageError(Exception):
    """A row that cannot be OCR'd: it becomes an error row, the run goes on."""


class RunAborted(Exception):
    """The run cannot go on (degenerate output, server down); finished rows are kept."""

    def __init__(self, message: str, code: int = 3):
        super().__init__(message)
        self.code = code


# ---- where the data comes from and goes to ------------------------------------------------

def is_local_target(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().is_dir()


def resolve_output(value: str) -> tuple[str, str]:
    """('local', path) or ('hub', repo_id); anything else exits 2 saying how to write a path."""
    if is_local_target(value):
        return "local", str(Path(value).expanduser().resolve())
    if REPO_ID.match(value):
        return "hub", value
    fail(f"OUTPUT {value!r} is neither a Hub dataset id (namespace/name) nor a local path. "
         f"For a local folder write ./{value} or an absolute path.")


@dataclass
class InputSource:
    dataset: object  # datasets.Dataset, image column not decoded, rows in run order
    image_column: str
    description: str
    lo: int  # this shard's rows are dataset rows [lo, hi)
    hi: int


def _load_local_dataset(path: Path, args):
    import datasets

    if path.is_file():
        if path.suffix != ".parquet":
            fail(f"INPUT file {path} is not a .parquet file; pass a folder of images instead.")
        return datasets.load_dataset("parquet", data_files=[str(path)], split="train")
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if args.split not in loaded:
                fail(f"split {args.split!r} not in {path}; it has {sorted(loaded)}")
            loaded = loaded[args.split]
        return loaded
    parquet_files = sorted(str(p) for p in path.rglob("*.parquet"))
    if parquet_files:
        return datasets.load_dataset("parquet", data_files=parquet_files, split="train")
    image_files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not image_files:
        fail(f"INPUT folder {path} holds no images, no .parquet files and no saved dataset.")
    features = datasets.Features({"image": datasets.Image(decode=False),
                                  "file_name": datasets.Value("string")})
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": None, "path": str(p)} for p in image_files],
         "file_name": [str(p.relative_to(path)) for p in image_files]},
        features=features)


def open_input(args) -> InputSource:
    """Open INPUT without decoding a single image: Arrow memory-maps it, rows are read lazily."""
    import datasets

    local = Path(args.input).expanduser()
    if local.exists():
        ds = _load_local_dataset(local, args)
        description = str(local.resolve())
    elif REPO_ID.match(args.input):
        ds = datasets.load_dataset(args.input, args.config, split=args.split,
                                   revision=args.revision, token=args.hf_token or None)
        description = args.input
    else:
        fail(f"INPUT {args.input!r} is neither an existing path nor a Hub dataset id.")
    if args.image_column not in ds.column_names:
        image_like = [name for name, feature in ds.features.items()
                      if isinstance(feature, datasets.Image)]
        hint = f"; image-typed: {', '.join(image_like)}" if image_like else ""
        fail(f"image column {args.image_column!r} not found. Columns: "
             f"{', '.join(ds.column_names)}{hint}. Pass --image-column NAME.")
    if isinstance(ds.features[args.image_column], datasets.Image):
        ds = ds.cast_column(args.image_column, datasets.Image(decode=False))
    if args.shuffle:
        ds = ds.shuffle(seed=args.seed)
    if args.max_samples is not None:
        ds = ds.select(range(min(args.max_samples, len(ds))))
    if not 0 <= args.shard_index < args.num_shards:
        fail(f"--shard-index must be in [0, {args.num_shards}), got {args.shard_index}")
    n = len(ds)
    lo, hi = n * args.shard_index // args.num_shards, n * (args.shard_index + 1) // args.num_shards
    return InputSource(ds, args.image_column, description, lo, hi)


def check_output_columns(source: InputSource, args) -> list[str]:
    """The result columns; a clash with an input column fails before any inference."""
    names = result_column_names(args.output_column)
    clash = [c for c in names if c in source.dataset.column_names]
    if clash and not args.overwrite:
        fail(f"input already has column(s) {', '.join(clash)}; pass --overwrite to replace "
             f"them or --output-column NAME to write elsewhere.")
    return names


def result_column_names(column: str) -> list[str]:
    return [column, f"{column}_error", f"{column}_finish_reason", f"{column}_prompt_tokens",
            f"{column}_completion_tokens"] + [f"{column}_{suffix}" for suffix in EXTRA_COLUMNS]


# ---- page images --------------------------------------------------------------------------

@dataclass
class PreparedPage:
    data: bytes
    mime: str
    width: int
    height: int
    passthrough: bool


def read_cell_bytes(cell) -> bytes:
    if cell is None:
        raise PageError("missing image (empty cell)")
    if isinstance(cell, dict):
        data, path = cell.get("bytes"), cell.get("path")
        if data is None and path:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise PageError(f"cannot read image file {path}: {exc}") from None
        if data is None:
            raise PageError("missing image (cell has neither bytes nor path)")
        cell = data
    elif isinstance(cell, str):
        try:
            cell = Path(cell).read_bytes()
        except OSError as exc:
            raise PageError(f"cannot read image file {cell}: {exc}") from None
    if not isinstance(cell, (bytes, bytearray, memoryview)):
        raise PageError(f"unsupported image cell of type {type(cell).__name__}")
    if len(cell) == 0:
        raise PageError("empty image bytes")
    return bytes(cell)


def _rescale_to_8bit(img):
    """16-bit and float scans to 8-bit by their real bit depth, so a 16-bit page stays grey."""
    import numpy as np
    from PIL import Image

    arr = np.asarray(img)
    if arr.dtype.kind == "f":
        top = 1.0 if float(np.nanmax(arr)) <= 1.0 else 65535.0
    else:
        peak = int(arr.max()) if arr.size else 0
        top = 255 if peak <= 255 else 4095 if peak <= 4095 else 65535
    scaled = np.clip(np.nan_to_num(arr.astype(np.float32)) * (255.0 / top), 0, 255)
    return Image.fromarray(scaled.round().astype(np.uint8), mode="L")


def to_rgb(img):
    """Any PIL mode to RGB: alpha flattened on white, palettes expanded, 16-bit rescaled."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return _rescale_to_8bit(img).convert("RGB")
    if img.mode == "P" and "transparency" in img.info or img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def prepare_page(cell, decode: bool = True) -> PreparedPage | None:
    """Encoded bytes to send for one cell; raises PageError for anything that is not a page.

    A page that needs no change (a JPEG or PNG in RGB, upright, one frame, within bounds) is
    sent byte for byte: no new artifacts, no encoding cost. A complete JPEG (its end-of-image
    marker last) is not decoded at all: damage inside one is left to the server's decoder. Others
    are decoded once (a JPEG that must shrink is decoded at reduced scale first), turned
    upright, converted to RGB, downscaled only when above the bound, and encoded once in
    PAGE_FORMAT: "png" (lossless, for models trained on PNG renders) or "jpeg" (quality 95, as
    the seed's recipes send). With decode=False, None instead of any pixel work.
    """
    from PIL import Image, ImageOps

    raw = read_cell_bytes(cell)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img = Image.open(io.BytesIO(raw))
            width, height = img.size
            if width * height > MAX_DECODE_PIXELS:
                raise PageError(f"image of {width}x{height} pixels exceeds the decode limit of "
                                f"{MAX_DECODE_PIXELS:,} (decompression bomb?)")
            # PNG keeps EXIF (rare) after the pixels: reading it there would decode the page
            has_exif = img.format != "PNG" or "exif" in img.info
            orientation = img.getexif().get(0x0112, 1) if has_exif else 1
            upright = orientation in (None, 1)
            if not upright and orientation in (5, 6, 7, 8):
                width, height = height, width
            target = target_size(width, height)
            same_size = target == (width, height)
            frames = getattr(img, "n_frames", 1)
            if same_size and upright and img.mode == "RGB" and frames == 1:
                if img.format == "JPEG":
                    if raw.rstrip(b"\0").endswith(b"\xff\xd9"):  # complete: send as it is
                        return PreparedPage(raw, "image/jpeg", width, height, True)
                    if not decode:
                        return None
                    img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                    img.load()  # trailing bytes or truncated? A 1/8-scale decode reads it all
                    return PreparedPage(raw, "image/jpeg", width, height, True)
                if img.format == "PNG" and (decode or len(raw) <= 1 << 20):
                    # every chunk's checksum, no decompression: catches truncation
                    Image.open(io.BytesIO(raw)).verify()
                    return PreparedPage(raw, "image/png", width, height, True)
            if not decode:
                return None
            source_format = img.format
            if frames > 1:
                img.seek(0)
            if not same_size and source_format == "JPEG":
                draft_size = target if upright or orientation not in (5, 6, 7, 8) else target[::-1]
                img.draft(img.mode if img.mode in ("RGB", "L") else None, draft_size)
            img.load()
            if not upright:
                img = ImageOps.exif_transpose(img)
            img = to_rgb(img)
            if img.size != target:  # the cheapest filter that does not alias (Pillow's bilinear
                # widens with the scale), after a box reduce for large factors
                img = img.resize(target, Image.Resampling.BILINEAR, reducing_gap=2.0)
            out = io.BytesIO()
            if PAGE_FORMAT == "png":
                img.save(out, format="PNG", compress_level=1)
                mime = "image/png"
            else:
                img.save(out, format="JPEG", quality=95)
                mime = "image/jpeg"
            return PreparedPage(out.getvalue(), mime, target[0], target[1], False)
    except PageError:
        raise
    except Image.DecompressionBombError as exc:
        raise PageError(f"decompression bomb: {exc}") from None
    except Exception as exc:  # undecodable, truncated, unsupported: one row fails, not the run
        raise PageError(f"cannot decode image: {type(exc).__name__}: {exc}") from None


# ---- text checks ----------------------------------------------------------------------------

def repeated_tail(text: str, max_period: int = 200) -> tuple[int, int]:
    """(period, repeats) of the longest run of one unit repeated at the end of text."""
    best = (0, 0)
    for period in range(1, min(max_period, len(text) // 2) + 1):
        unit = text[-period:]
        repeats, end = 1, len(text) - period
        while end >= period and text[end - period:end] == unit:
            repeats += 1
            end -= period
        if repeats >= 2 and repeats * period > best[0] * best[1]:
            best = (period, repeats)
    return best


def trim_repeated_tail(text: str, min_length: int = 8000) -> str:
    """Keep one copy of a degenerate repeated tail (>= 100 chars, >= 5 repeats, period <= 200)."""
    if len(text) < min_length:
        return text
    period, repeats = repeated_tail(text)
    if repeats >= 5 and period * repeats >= 100:
        return text[: len(text) - period * (repeats - 1)]
    return text


def looks_degenerate(text: str | None) -> bool:
    """Empty, one character over and over, or mostly a repetition loop."""
    if not text or not text.strip():
        return True
    visible = [c for c in text if not c.isspace()]
    if len(visible) >= 8 and len(set(visible)) <= 2:
        return True
    if len(text) >= 40:
        period, repeats = repeated_tail(text)
        if repeats >= 5 and period * repeats >= len(text) * 0.5:
            return True
    if len(text) >= 200 and len(zlib.compress(text.encode())) < len(text.encode()) * 0.05:
        return True
    return False


class DegenerateCheck:
    """Stops the run when the first completed pages are all degenerate: a wrong model/image
    pair looks like normal load from outside (full GPU, no errors)."""

    def __init__(self, enabled: bool, pages: int, expected: int):
        self.enabled = enabled and expected > 0
        self.pages = max(1, min(pages, expected))
        self.seen: list[bool] = []
        self.tripped = False
        self.done = not self.enabled

    def settled(self) -> bool:
        return self.done

    def observe(self, text: str | None) -> None:
        if self.done:
            return
        self.seen.append(looks_degenerate(text))
        if len(self.seen) >= self.pages:
            self.finish()

    def finish(self) -> None:
        """Decide on what was seen (fewer pages than asked when the run is short)."""
        if self.done:
            return
        self.done = True
        if self.seen and all(self.seen):
            self.tripped = True
            raise RunAborted(
                f"the first {len(self.seen)} pages all came back degenerate (empty, one "
                f"character repeated, or a repetition loop). That is what a wrong model / engine "
                f"pair looks like: this script was validated with {MODEL_ID} on "
                f"{JOB_IMAGE}. Check --model and the image; pass "
                f"--no-sanity-check to write such output anyway.", code=3)


# ---- results, parts and the output store -----------------------------------------------------

@dataclass
class RowResult:
    text: str | None = None
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    extras: dict = field(default_factory=dict)


def part_name(start: int, stop: int) -> str:
    return f"part-{start:09d}-{stop:09d}.parquet"


def ranges_from_names(names) -> list[tuple[int, int]]:
    out = []
    for name in names:
        match = PART_NAME.match(Path(name).name)
        if match:
            out.append((int(match.group(1)), int(match.group(2))))
    return sorted(out)


def output_features(source: InputSource, args):
    import datasets

    features = datasets.Features(
        {k: v for k, v in source.dataset.features.items()
         if k not in result_column_names(args.output_column) and k != "inference_info"})
    if isinstance(features.get(source.image_column), datasets.Image):
        features[source.image_column] = datasets.Image()  # decoded on load, shown by the viewer
    column = args.output_column
    features[column] = datasets.Value("string")
    features[f"{column}_error"] = datasets.Value("string")
    features[f"{column}_finish_reason"] = datasets.Value("string")
    features[f"{column}_prompt_tokens"] = datasets.Value("int32")
    features[f"{column}_completion_tokens"] = datasets.Value("int32")
    for suffix, kind in EXTRA_COLUMNS.items():
        features[f"{column}_{suffix}"] = extra_feature(kind)
    features["inference_info"] = datasets.Value("string")
    return features


def extra_feature(kind: str):
    """Model-specific columns: "blocks" is layout (label, box as x1 y1 x2 y2, text), one entry
    per block in reading order; "string" is plain text (e.g. the raw model output)."""
    import datasets

    if kind == "blocks":
        return [{"label": datasets.Value("string"), "box": [datasets.Value("int32")],
                 "text": datasets.Value("string")}]
    return datasets.Value("string")


def write_part(path: Path, source: InputSource, start: int, results: list, features,
               info_entry: dict, args) -> None:
    """Write rows [start, start+len(results)) with their results; atomic (tmp, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = args.output_column
    schema = features.arrow_schema
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(str(tmp), schema) as writer:
        for offset in range(0, len(results), 32):
            chunk = results[offset:offset + 32]
            rows = source.dataset.select(range(start + offset, start + offset + len(chunk)))
            batch = rows.to_dict()
            for name in list(batch):
                if name not in features:
                    del batch[name]
            image_cells = batch.get(source.image_column) or []
            for i, cell in enumerate(image_cells):  # embed image files that were only paths
                if isinstance(cell, dict) and cell.get("bytes") is None and cell.get("path"):
                    try:
                        image_cells[i] = {"bytes": Path(cell["path"]).read_bytes(),
                                          "path": Path(cell["path"]).name}
                    except OSError:
                        pass  # unreadable: the row's error says so; keep the path
            old_info = rows["inference_info"] if "inference_info" in rows.column_names else [None] * len(chunk)
            batch[column] = [r.text for r in chunk]
            batch[f"{column}_error"] = [r.error for r in chunk]
            batch[f"{column}_finish_reason"] = [r.finish_reason for r in chunk]
            batch[f"{column}_prompt_tokens"] = [r.prompt_tokens for r in chunk]
            batch[f"{column}_completion_tokens"] = [r.completion_tokens for r in chunk]
            for suffix in EXTRA_COLUMNS:
                batch[f"{column}_{suffix}"] = [r.extras.get(suffix) for r in chunk]
            batch["inference_info"] = [append_info(old, info_entry) for old in old_info]
            table = pa.Table.from_pydict(features.encode_batch(batch), schema=schema)
            writer.write_table(table)
    os.replace(tmp, path)


def append_info(old, entry: dict) -> str:
    history = []
    if old:
        try:
            history = json.loads(old) if isinstance(old, str) else list(old)
        except (ValueError, TypeError):
            history = [{"unparsed": str(old)}]
        if not isinstance(history, list):
            history = [history]
    return json.dumps(history + [entry], ensure_ascii=False)


class OutputStore:
    """Parts under data/ of a local folder, or of a staging folder uploaded to a Hub repo as
    each part completes. A failed upload leaves the part on disk and says how to send it."""

    def __init__(self, target: str, args, hub_api=None):
        self.kind, self.target = resolve_output(target)
        self.args = args
        self.api = None
        self.upload_failures: list[str] = []
        self._uploads: list[threading.Thread] = []
        if self.kind == "local":
            self.root = Path(self.target)
        else:
            if hub_api is None:
                from huggingface_hub import HfApi
                hub_api = HfApi(token=args.hf_token or None)
            self.api = hub_api
            base = Path(args.work_dir).expanduser() if args.work_dir else \
                Path.home() / ".cache" / "ocr-vllm-scripts" / "outputs"
            self.root = base / self.target.replace("/", "__")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.remote_names: set[str] = set()
        if self.api is not None:
            self.api.create_repo(self.target, repo_type="dataset", private=args.private or None,
                                 exist_ok=True)
            files = self.api.list_repo_files(self.target, repo_type="dataset")
            self.remote_names = {Path(f).name for f in files if f.startswith("data/")}

    def done_ranges(self) -> list[tuple[int, int]]:
        local = {p.name for p in (self.root / "data").glob("part-*.parquet")}
        return ranges_from_names(local | self.remote_names)

    def resend_local_parts(self) -> None:
        """Parts a killed or offline run left on disk but never uploaded."""
        if self.api is None:
            return
        for path in sorted((self.root / "data").glob("part-*.parquet")):
            if path.name not in self.remote_names:
                self.publish(path)

    def publish(self, path: Path) -> None:
        if self.api is None:
            return
        thread = threading.Thread(target=self._upload, args=(path, f"data/{path.name}"), daemon=True)
        thread.start()
        self._uploads.append(thread)

    def _upload(self, path: Path, path_in_repo: str) -> None:
        for attempt in range(UPLOAD_ATTEMPTS):
            try:
                self.api.upload_file(path_or_fileobj=str(path), path_in_repo=path_in_repo,
                                     repo_id=self.target, repo_type="dataset",
                                     commit_message=f"Add {path_in_repo}")
                self.remote_names.add(Path(path_in_repo).name)
                return
            except Exception as exc:  # network, rate limit: back off, then leave it on disk
                log(f"upload of {path_in_repo} failed ({type(exc).__name__}: {exc}); "
                    f"attempt {attempt + 1}/{UPLOAD_ATTEMPTS}")
                time.sleep(min(60.0, UPLOAD_BACKOFF_S * 2 ** attempt) * random.uniform(0.5, 1.0))
        self.upload_failures.append(path_in_repo)

    def finish(self, card: str) -> None:
        (self.root / "README.md").write_text(card, encoding="utf-8")
        for thread in self._uploads:
            thread.join()
        if self.api is not None:
            self._upload(self.root / "README.md", "README.md")
        if self.upload_failures:
            log(f"{len(self.upload_failures)} file(s) did not reach the Hub; they are safe in "
                f"{self.root}. Send them with:\n  hf upload {self.target} {self.root} . "
                f"--repo-type dataset\nor rerun the same command (it resumes and uploads them).")

    def location(self) -> str:
        return str(self.root) if self.kind == "local" else f"https://huggingface.co/datasets/{self.target}"


class OrderedWriter:
    """Collects results by row index and writes contiguous runs of finished rows as parts, in
    input order. Rows are flushed every `part_rows` rows or `part_seconds` seconds, and any
    finished run is flushed on abort, so a crash loses at most the rows still in flight."""

    def __init__(self, store: OutputStore, source: InputSource, pending: list[int], features,
                 info_entry: dict, args):
        self.store, self.source, self.pending = store, source, pending
        self.features, self.info_entry, self.args = features, info_entry, args
        self.results: dict[int, RowResult] = {}
        self.next_pos = 0  # position in pending of the first row not yet written
        self.ready_pos = 0  # position of the first row not yet finished, from next_pos on
        self.last_flush = time.monotonic()
        self.parts_written = 0

    def add(self, index: int, result: RowResult) -> None:
        self.results[index] = result

    def due(self) -> bool:
        pos = max(self.ready_pos, self.next_pos)  # resumes where the last call stopped
        while pos < len(self.pending) and self.pending[pos] in self.results:
            pos += 1
        self.ready_pos = pos
        ready = pos - self.next_pos
        if ready == 0:
            return False
        return ready >= self.args.part_rows or time.monotonic() - self.last_flush >= self.args.part_seconds \
            or pos == len(self.pending)

    def flush(self, everything: bool = False) -> int:
        """Write finished rows; with everything, also runs after a gap (abort). Returns rows written."""
        written = 0
        pos = self.next_pos
        while pos < len(self.pending):
            run = []
            while pos < len(self.pending) and self.pending[pos] in self.results:
                index = self.pending[pos]
                if run and index != run[-1] + 1:
                    break  # rows already written by an earlier run sit between: new part
                run.append(index)
                pos += 1
            if run:
                self._write(run)
                written += len(run)
                if pos - len(run) == self.next_pos:
                    self.next_pos = pos
                continue
            if not everything:
                break
            pos += 1  # a row still missing: skip it, keep writing finished runs after it
        self.last_flush = time.monotonic()
        return written

    def _write(self, run: list[int]) -> None:
        """One part per --part-rows rows of a contiguous run."""
        for offset in range(0, len(run), self.args.part_rows):
            chunk = run[offset:offset + self.args.part_rows]
            start, stop = chunk[0], chunk[-1] + 1
            path = self.store.root / "data" / part_name(start, stop)
            results = [self.results.pop(i) for i in chunk]
            write_part(path, self.source, start, results, self.features, self.info_entry, self.args)
            self.parts_written += 1
            self.store.publish(path)


def pending_rows(source: InputSource, done: list[tuple[int, int]]) -> list[int]:
    covered = bytearray(source.hi - source.lo)
    for a, b in done:
        for i in range(max(a, source.lo), min(b, source.hi)):
            covered[i - source.lo] = 1
    return [source.lo + i for i, flag in enumerate(covered) if not flag]


def iter_image_cells(source: InputSource, indices: list[int], batch: int = 64):
    """(index, cell) in order, reading only the image column, a batch at a time."""
    column_only = source.dataset.select_columns([source.image_column])
    for offset in range(0, len(indices), batch):
        chunk = indices[offset:offset + batch]
        cells = column_only.select(chunk)[source.image_column]
        yield from zip(chunk, cells)


# ---- stats and the card ----------------------------------------------------------------------

def peak_rss_bytes() -> int:
    """This program's peak resident memory: /proc's VmHWM. (ru_maxrss also counts the memory
    the parent process had when it started this one.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RunStats:
    def __init__(self, rows_total: int, rows_skipped: int):
        self.started = time.monotonic()
        self.rows_total, self.rows_skipped = rows_total, rows_skipped
        self.rows_ok = self.rows_failed = 0
        self.latencies: list[float] = []
        self.finished_at: list[float] = []
        self.first_started: float | None = None  # the first page entered the pipeline
        self.tokens: list[int] = []
        self.in_flight = self.peak_in_flight = 0
        self.server_startup_s = None
        self.vllm_version = None
        self.extra: dict = {}

    def record(self, result: RowResult, latency: float | None) -> None:
        if result.error is None:
            self.rows_ok += 1
        else:
            self.rows_failed += 1
        if latency is not None:
            self.latencies.append(latency)
        self.finished_at.append(time.monotonic())
        self.tokens.append(result.completion_tokens or 0)

    def enter(self) -> None:
        self.first_started = self.first_started or time.monotonic()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1

    def as_dict(self) -> dict:
        elapsed = time.monotonic() - self.started
        active = self.finished_at[-1] - self.first_started \
            if self.finished_at and self.first_started else None
        done = len(self.finished_at)
        steady_rate = steady_tokens = None
        if done >= 10:  # leave out start-up and tail: the middle 80% of completions
            a, b = done // 10, done - done // 10 - 1
            span = self.finished_at[b] - self.finished_at[a]
            if span > 0:
                steady_rate = (b - a) / span
                steady_tokens = sum(self.tokens[a + 1:b + 1]) / span
        elif done >= 2 and self.finished_at[-1] > self.finished_at[0]:
            span = self.finished_at[-1] - self.finished_at[0]
            steady_rate, steady_tokens = (done - 1) / span, sum(self.tokens[1:]) / span

        def quantile(q):
            if not self.latencies:
                return None
            ordered = sorted(self.latencies)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

        return {
            "rows_total": self.rows_total, "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed, "rows_skipped": self.rows_skipped,
            "elapsed_s": round(elapsed, 3),
            "active_s": round(active, 3) if active else None,
            "pages_per_s": round(done / elapsed, 4) if elapsed > 0 else None,
            "pages_per_s_steady": round(steady_rate, 4) if steady_rate else None,
            "completion_tokens_per_s": round(steady_tokens, 2) if steady_tokens else None,
            "latency_p50_s": quantile(0.5), "latency_p95_s": quantile(0.95),
            # Little's law: how full the driver kept the server, whatever the server's speed
            "mean_in_flight": round(sum(self.latencies) / active, 2)
            if self.latencies and active else None,
            "peak_in_flight": self.peak_in_flight,
            "peak_rss_bytes": peak_rss_bytes(),
            "server_startup_s": self.server_startup_s,
            "vllm_version": self.vllm_version,
            **self.extra,
        }


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secrets replaced, for logs and cards."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        if arg in ("--hf-token", "--api-key"):
            hide = True
        elif arg.startswith(("--hf-token=", "--api-key=")):
            arg = arg.split("=", 1)[0] + "=***"
        out.append(arg)
    return out


def reproduce_command(argv: list[str]) -> str:
    """The Hugging Face Jobs command for this run (secrets redacted)."""
    script = Path(sys.argv[0]).name
    flavor = os.environ.get("JOB_FLAVOR") or os.environ.get("ACCELERATOR") or DEFAULT_FLAVOR
    args = " ".join(shlex.quote(a) for a in redact_argv(argv))
    if IMAGE_HAS_UV:
        return (f"hf jobs uv run --image {JOB_IMAGE} --flavor {flavor} --secrets HF_TOKEN "
                f"{script} {args}")
    # an image without uv: install it first, and fetch the script by its URL
    inner = f"pip install -q uv && uv run $SCRIPT_URL {args}"
    return (f"SCRIPT_URL=<raw URL of {script}>; hf jobs run --flavor {flavor} --secrets HF_TOKEN "
            f"{JOB_IMAGE} -- bash -lc {shlex.quote(inner)}")


def build_card(source: InputSource, store: OutputStore, args, stats: dict, info_entry: dict,
               argv: list[str]) -> str:
    column = args.output_column
    settings = json.dumps(inference_settings(args), indent=2, ensure_ascii=False)
    serve = info_entry.get("serve_args")
    on_jobs = os.environ.get("JOB_ID") or os.environ.get("HF_JOB_ID")
    provenance = f"Hugging Face Job {on_jobs}" if on_jobs else "a local run"
    return f"""---
tags:
- ocr
- vllm
- uv-script
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*.parquet
---

# OCR of `{source.description}` with {MODEL_ID}

Each row of the input with its page transcribed into the `{column}` column by
[{MODEL_ID}](https://huggingface.co/{MODEL_ID}) on vLLM (`{JOB_IMAGE}`),
with `{Path(sys.argv[0]).name}` ({SCRIPT_SHAPE} shape), from {provenance}.

| column | meaning |
| --- | --- |
| `{column}` | the page as Markdown; null when the row failed |
| `{column}_error` | why the row failed; null on success |
| `{column}_finish_reason` | `stop`, or `length` when the token budget ran out |
| `{column}_prompt_tokens`, `{column}_completion_tokens` | token counts of the request |
| `inference_info` | JSON list, one entry per model run over this dataset |

## This run

```json
{json.dumps(stats, indent=2)}
```

Settings:

```json
{settings}
```

Serve flags: `{' '.join(shlex.quote(a) for a in serve) if serve else 'offline engine'}`

Reproduce:

```
{reproduce_command(argv)}
```
"""


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="Hub dataset id, or a local folder of images, .parquet "
                        "file/folder, or save_to_disk folder")
    parser.add_argument("output", help="Hub dataset id (namespace/name), or a local folder "
                        "(write ./name or an absolute path)")
    group = parser.add_argument_group("input")
    group.add_argument("--config", help="dataset config (subset) of a Hub INPUT")
    group.add_argument("--split", default="train", help="split to read (default: train)")
    group.add_argument("--revision", help="Hub INPUT revision (branch, tag or commit)")
    group.add_argument("--image-column", default="image", help="column holding the page image")
    group.add_argument("--max-samples", type=int, help="only the first N rows (after --shuffle)")
    group.add_argument("--shuffle", action="store_true", help="shuffle rows before --max-samples")
    group.add_argument("--seed", type=int, default=42, help="shuffle seed (default: 42)")
    group.add_argument("--num-shards", type=int, default=1,
                       help="split the input into N contiguous ranges (one per Job)")
    group.add_argument("--shard-index", type=int, default=0, help="which range this run does")
    group = parser.add_argument_group("output")
    group.add_argument("--output-column", default="markdown",
                       help="column for the text; diagnostics are named after it (default: markdown)")
    group.add_argument("--overwrite", action="store_true",
                       help="replace result columns that the input already has")
    group.add_argument("--private", action="store_true", help="create the Hub repo private")
    group.add_argument("--hf-token", help="Hub token (default: HF_TOKEN or your login)")
    group.add_argument("--work-dir", help="staging folder for Hub output "
                       "(default: ~/.cache/ocr-vllm-scripts/outputs)")
    group.add_argument("--part-rows", type=int, default=250,
                       help="rows per parquet part; a part is also written every --part-seconds")
    group.add_argument("--part-seconds", type=float, default=300.0,
                       help="write finished rows at least this often (resume granularity)")
    group.add_argument("--stats-json", help="write the run's stats as JSON to this path")
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=MODEL_ID,
                       help=f"model id or local path (default: {MODEL_ID}); a fine-tune or mirror")
    group.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                       help=f"generation budget per page (default: {DEFAULT_MAX_TOKENS})")
    group.add_argument("--no-sanity-check", action="store_true",
                       help="do not stop when the first pages all come back degenerate")
    group.add_argument("--sanity-pages", type=int, default=8,
                       help="pages the degenerate-output check looks at (default: 8)")


def write_stats(stats: dict, args) -> None:
    if args.stats_json:
        Path(args.stats_json).expanduser().parent.mkdir(parents=True, exist_ok=True)
        Path(args.stats_json).expanduser().write_text(json.dumps(stats, indent=2))


def keep_finished_rows(writer: OrderedWriter, check: DegenerateCheck) -> None:
    """After an abort or interrupt: write every finished row (a rerun resumes after them),
    unless the pages seen so far are all degenerate."""
    try:
        check.finish()
    except RunAborted:
        pass
    if check.tripped:
        log("the pages finished so far are all degenerate: not writing them")
        return
    writer.flush(everything=True)


def install_sigterm_handler() -> None:
    """SIGTERM (a cancelled Job) unwinds like Ctrl-C: finished rows are written, servers stopped."""
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
# ==== END COMMON HELPERS ====


# ==== BEGIN OFFLINE HELPERS (identical in every offline script; edit one copy, run tools/sync_helpers.py) ====
# vllm.LLM in fixed batches. The model section provides LLM_KWARGS, CHAT_KWARGS,
# build_messages(), sampling_kwargs(), VLLM_REQUIREMENT; the common block provides the rest.
import base64
import shutil
import site
import subprocess
from concurrent.futures import ThreadPoolExecutor

for _extra_site in filter(None, os.environ.get("OCR_SCRIPT_EXTRA_SITE", "").split(os.pathsep)):
    if _extra_site not in sys.path:
        # appended after the image's own packages (its torch and vllm win), with the folder's
        # .pth files read: uv's layered environments link their packages through one
        site.addsitedir(_extra_site)


def _python_has_vllm(python: str) -> bool:
    try:
        probe = subprocess.run(
            [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def import_vllm(argv: list[str]):
    """vllm, from this environment, else from the machine's own Python (the vLLM image: no
    second install of vllm and torch), else installed by uv on the fly."""
    # bare CUDA images have no compiler for these JIT paths (MODEL-FACTS); set before import
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_USE_DEEP_GEMM", "0")
    try:
        import vllm
        return vllm
    except ImportError:
        pass
    if os.environ.get("OCR_SCRIPT_REEXEC"):
        fail(f"vllm cannot be imported. Run this script in the vLLM image (hf jobs uv run --image "
             f"{JOB_IMAGE} ...) or on a GPU machine with `pip install vllm`.")

    env = {**os.environ, "OCR_SCRIPT_REEXEC": "1"}
    script = str(Path(sys.argv[0]).resolve())
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/opt/conda/bin/python3"):
        if Path(candidate).exists() and _python_has_vllm(candidate):
            env["OCR_SCRIPT_EXTRA_SITE"] = os.pathsep.join(site.getsitepackages())
            log(f"using the vllm installed for {candidate} (nothing heavy is installed)")
            os.execve(candidate, [candidate, script, *argv], env)
    uv = shutil.which("uv")
    if uv:
        log(f"vllm is not installed here; asking uv for vllm{VLLM_REQUIREMENT} (several GB once)")
        os.execve(uv, [uv, "run", "--with", f"vllm{VLLM_REQUIREMENT}", script, *argv], env)
    fail("vllm is not installed and uv is not on PATH to install it: `pip install vllm`, or run "
         f"on Hugging Face Jobs with --image {JOB_IMAGE}.")


def effective_llm_kwargs(args) -> dict:
    """LLM_KWARGS with --llm-kwargs merged over them (a null value removes a key)."""
    merged = dict(LLM_KWARGS)
    for key, value in json.loads(args.llm_kwargs or "{}").items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def data_url(page: PreparedPage) -> str:
    return f"data:{page.mime};base64,{base64.b64encode(page.data).decode()}"


def generate_batch(llm, sampling, items: list, args) -> list[RowResult]:
    """Results for [(index, page)]; a batch that raises is split until the bad row is alone."""
    try:
        outputs = llm.chat([build_messages(data_url(page), args) for _, page in items], sampling,
                           use_tqdm=False, **CHAT_KWARGS)
    except Exception as exc:
        if "EngineDead" in type(exc).__name__ or "dead" in str(exc).lower():
            raise RunAborted(f"the vLLM engine died: {exc}; finished rows are saved, rerun to "
                             f"resume") from exc
        if len(items) == 1:
            return [RowResult(error=f"generation failed: {type(exc).__name__}: {str(exc)[:500]}")]
        half = len(items) // 2
        return generate_batch(llm, sampling, items[:half], args) + \
            generate_batch(llm, sampling, items[half:], args)
    results = []
    for output in outputs:
        completion = output.outputs[0]
        results.append(RowResult(text=completion.text, finish_reason=completion.finish_reason,
                                 prompt_tokens=len(output.prompt_token_ids or []),
                                 completion_tokens=len(completion.token_ids)))
    return results


def prepare_or_error(cell):
    try:
        return prepare_page(cell)
    except PageError as exc:
        return exc


def run_offline(source: InputSource, pending: list[int], writer: OrderedWriter, stats: RunStats,
                args, check: DegenerateCheck, llm, sampling) -> None:
    """Fixed batches; the next batch's pages are prepared while the engine runs this one."""
    from tqdm import tqdm

    pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                              thread_name_prefix="prepare")
    cells = iter_image_cells(source, pending)

    def submit_next():
        batch = []
        for index, cell in cells:
            batch.append((index, pool.submit(prepare_or_error, cell)))
            if len(batch) == args.batch_size:
                break
        return batch

    bar = tqdm(total=len(pending), unit="page", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 10.0)
    try:
        upcoming = submit_next()
        while upcoming:
            batch, upcoming = upcoming, None
            prepared = [(index, future.result()) for index, future in batch]
            upcoming = submit_next()
            results: dict[int, RowResult] = {}
            valid = []
            for index, page in prepared:
                if isinstance(page, PageError):
                    results[index] = RowResult(error=str(page))
                else:
                    valid.append((index, page))
            stats.in_flight = len(valid)
            stats.peak_in_flight = max(stats.peak_in_flight, len(valid))
            stats.first_started = stats.first_started or time.monotonic()
            started = time.monotonic()
            if valid:
                for (index, _), result in zip(valid, generate_batch(llm, sampling, valid, args)):
                    results[index] = result
            latency = time.monotonic() - started
            for index, _ in prepared:
                result = results[index]
                if result.error is None:
                    result.text, result.extras = postprocess(result.text, args)
                    check.observe(result.text)
                writer.add(index, result)
                stats.record(result, latency if result.error is None else None)
            bar.update(len(prepared))
            bar.set_postfix(errors=stats.rows_failed, refresh=False)
            if check.settled() and writer.due():
                writer.flush()
        check.finish()
        writer.flush(everything=True)
    finally:
        bar.close()
        pool.shutdown(wait=False, cancel_futures=True)


def add_offline_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument("--batch-size", type=int, default=16,
                       help="pages per generate call (default: 16, the seed's setting)")
    group.add_argument("--llm-kwargs", default="",
                       help="JSON merged over the script's vllm.LLM arguments, e.g. "
                            "'{\"max_model_len\": 16384, \"tensor_parallel_size\": 2}'; "
                            "null removes one")
def info_entry_for(args, llm_kwargs) -> dict:
    return {
        "model": args.model,
        "model_revision": MODEL_REVISION,
        "script": Path(sys.argv[0]).name,
        "shape": SCRIPT_SHAPE,
        "image": JOB_IMAGE,
        "llm_kwargs": llm_kwargs,
        "column": args.output_column,
        "settings": inference_settings(args),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_offline_script(doc: str, argv: list[str] | None = None, hub_api=None) -> int:
    """The whole run: arguments, input, engine, output. `main()` calls it with the docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    add_offline_arguments(parser)
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    install_sigterm_handler()
    resolve_output(args.output)
    llm_kwargs = effective_llm_kwargs(args)
    need = image_token_budget() + args.max_tokens
    if need > int(llm_kwargs.get("max_model_len") or MAX_MODEL_LEN):
        fail(f"--max-tokens {args.max_tokens} plus up to {image_token_budget()} prompt tokens is "
             f"{need}, over max_model_len {llm_kwargs.get('max_model_len')}: every page would "
             f"fail. Lower --max-tokens or raise max_model_len through --llm-kwargs.")

    source = open_input(args)
    check_output_columns(source, args)
    store = OutputStore(args.output, args, hub_api)
    store.resend_local_parts()
    pending = pending_rows(source, store.done_ranges())
    stats = RunStats(rows_total=source.hi - source.lo,
                     rows_skipped=source.hi - source.lo - len(pending))
    info_entry = info_entry_for(args, llm_kwargs)
    writer = OrderedWriter(store, source, pending, output_features(source, args), info_entry, args)
    check = DegenerateCheck(not args.no_sanity_check, args.sanity_pages, len(pending))
    log(f"{len(pending)} of {stats.rows_total} rows to do ({stats.rows_skipped} already done) "
        f"-> {store.location()}")
    code = 0
    try:
        if pending:
            vllm = import_vllm(argv)
            stats.vllm_version = getattr(vllm, "__version__", None)
            info_entry["vllm_version"] = stats.vllm_version
            started = time.monotonic()
            kwargs = dict(llm_kwargs)
            if MODEL_REVISION and args.model == MODEL_ID:
                kwargs.setdefault("revision", MODEL_REVISION)
            llm = vllm.LLM(model=args.model, **kwargs)
            stats.server_startup_s = round(time.monotonic() - started, 2)
            sampling = vllm.SamplingParams(**sampling_kwargs(args))
            run_offline(source, pending, writer, stats, args, check, llm, sampling)
    except RunAborted as exc:
        log(f"error: {exc}")
        code = exc.code
    except KeyboardInterrupt:
        log("interrupted: finished rows are saved; rerun the same command to resume")
        code = 130
    except Exception:  # a bug or an unforeseen failure: keep what is finished, then say what
        import traceback
        traceback.print_exc()
        log("error: the run failed; finished rows are saved, rerun the same command to resume")
        code = 1
    if code:
        keep_finished_rows(writer, check)
    result = stats.as_dict()
    write_stats(result, args)
    if not check.tripped and (writer.parts_written or store.done_ranges()):
        store.finish(build_card(source, store, args, result, info_entry, argv))
    log(f"done: {result['rows_ok']} ok, {result['rows_failed']} failed, "
        f"{result['rows_skipped']} skipped in {result['elapsed_s']:.1f} s "
        f"({result['pages_per_s'] or 0:.2f} pages/s) -> {store.location()}")
    return code
# ==== END OFFLINE HELPERS ====


# ============================================================================================
# main
# ============================================================================================

def main(argv: list[str] | None = None, hub_api=None) -> int:
    return run_offline_script(__doc__, argv, hub_api)


if __name__ == "__main__":
    sys.exit(main())
