# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "datasets>=3.0",
#     "huggingface_hub>=0.34",
#     "pillow>=10.4",
#     "httpx>=0.27",
#     "tqdm>=4.66",
# ]
#
# [tool.hf-jobs]
# image = "vllm/vllm-openai:v0.26.0"
# flavor = "a10g-small"
# secrets = ["HF_TOKEN"]
# ///
"""OCR a dataset of page images with deepseek-ai/DeepSeek-OCR through a vLLM server.

Every page becomes clean Markdown in a new column, and with a grounding prompt (the default)
a blocks column gives the layout: label, box (0-999 on both axes) and text of every block.
The driver has no torch or vllm dependency: it keeps `--concurrency` pages in flight against
a vLLM OpenAI-compatible server, which it starts itself when none answers.

Run it
    hf jobs uv run --image vllm/vllm-openai:v0.26.0 --flavor a10g-small --secrets HF_TOKEN \\
        deepseek-ocr-server.py user/scans user/scans-ocr
    uv run deepseek-ocr-server.py ./scans ./scans-ocr                 # GPU machine with vllm
    uv run deepseek-ocr-server.py user/scans ./out --server http://gpu-box:8000

Prompt modes (`--prompt-mode`, or `--prompt TEXT` for your own)
    document  <|grounding|>Convert the document to markdown.   (default)
    image     <|grounding|>OCR this image.
    free      Free OCR.
    figure    Parse the figure.
    describe  Describe this image in detail.
    The default is `document`: it is the model's own conversion prompt, and its grounding
    spans give the page layout for free; the Markdown column is cleaned of them, so it is as
    readable as `free`, which gives text only (no blocks column content).

Where the settings come from (vLLM's DeepSeek-OCR recipe)
    Serve: remote code on; context 8192 (the model's hard ceiling); no prefix caching and no
    multimodal processor cache (OCR never reuses an image); one image per prompt; and the
    model's n-gram logits processor, which must come last on the command line since it takes
    a list. Per request: temperature 0, `skip_special_tokens: false` (the grounding tags are
    special tokens), and the processor's arguments in `vllm_xargs`: n-gram 30, window 90,
    whitelist [128821, 128822] (the `<td>` and `</td>` tokens, which tables repeat).
    max_tokens 4096 (as in a 2,165-page run; the recipe uses 2048). The image tokens (at most
    1,156 in the default "Gundam" tiling) plus max_tokens must fit 8192: the script refuses a
    budget that would make every request fail with 400.
    Images are sent as RGB at their own size: the model tiles them itself.
    Image tag v0.26.0: the model ran 2,165 pages at scale on it; another collection pins
    v0.29.0 because v0.30 broke its vision encoder kernel, and vLLM's newer model runner
    rejects old-style logits processors like this one, so a newer tag is not assumed to work.
"""

import re

# ============================================================================================
# Model section: the only part that differs between scripts. To adapt this script to another
# model, edit this section (and models.json); leave the helper blocks below untouched.
# ============================================================================================

MODEL_ID = "deepseek-ai/DeepSeek-OCR"
MODEL_REVISION = None  # a commit sha pins the weights; None takes the repo's main branch
IMAGE_TAG = "v0.26.0"  # vllm/vllm-openai:<tag> this script was run with
JOB_IMAGE = f"vllm/vllm-openai:{IMAGE_TAG}"
IMAGE_HAS_UV = True  # the vLLM images have uv: `hf jobs uv run` works
DEFAULT_FLAVOR = "a10g-small"
SCRIPT_SHAPE = "server"

PROMPTS = {
    "document": "<|grounding|>Convert the document to markdown.",
    "image": "<|grounding|>OCR this image.",
    "free": "Free OCR.",
    "figure": "Parse the figure.",
    "describe": "Describe this image in detail.",
}
DEFAULT_PROMPT_MODE = "document"

MAX_MODEL_LEN = 8192
DEFAULT_MAX_TOKENS = 4096
TEMPERATURE = 0.0
IMAGE_TOKENS_MAX = 9 * 100 + 256  # "Gundam" tiling: n*100 + 256 tokens, n <= 9 crops
PROMPT_TEXT_TOKENS = 64
PAGE_FORMAT = "jpeg"  # pages that must be converted or resized: JPEG quality 95 (others go as is)
PREFIX_CACHING = False
NGRAM_XARGS = {"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}
LOGITS_PROCESSOR = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"

SERVE_ARGS = [
    "--trust-remote-code",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
    "--limit-mm-per-prompt", '{"image": 1}',
    "--logits-processors", LOGITS_PROCESSOR,  # last: it takes a list
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"


def spawn_args(args) -> list[str]:
    """Serve arguments known only when this script starts the server itself (none here)."""
    return []


def image_token_budget() -> int:
    return IMAGE_TOKENS_MAX + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int) -> tuple[int, int]:
    """No client-side resize: the model tiles the page itself."""
    return width, height


def add_model_arguments(parser) -> None:
    parser.add_argument("--prompt-mode", choices=sorted(PROMPTS), default=DEFAULT_PROMPT_MODE,
                        help=f"which of the model's prompts (default: {DEFAULT_PROMPT_MODE})")
    parser.add_argument("--prompt", help="a custom prompt instead (without the <image> prefix)")
    parser.add_argument("--keep-raw", action="store_true",
                        help="also keep the raw output, grounding tags and all, in <column>_raw")


def prompt_text(args) -> str:
    return args.prompt if args.prompt else PROMPTS[args.prompt_mode]


def build_request(image_url: str, args) -> dict:
    """Chat form of the recipe's raw prompt: the image first, then the text without <image>."""
    return {
        "messages": [{
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": prompt_text(args)},
            ],
        }],
        "temperature": TEMPERATURE,
        "max_tokens": args.max_tokens,
        "skip_special_tokens": False,
        "vllm_xargs": NGRAM_XARGS,
    }


GROUNDED_SPAN = re.compile(r"<\|ref\|>(.*?)<\|/ref\|>\s*<\|det\|>(.*?)<\|/det\|>", re.S)
REF_SPAN = re.compile(r"<\|ref\|>.*?<\|/ref\|>", re.S)
DET_SPAN = re.compile(r"<\|det\|>.*?<\|/det\|>", re.S)
STRAY_TAGS = re.compile(r"<\|/?(?:ref|det|grounding)\|>|<｜end▁of▁sentence｜>|<\|end▁of▁sentence\|>")


def parse_grounded_blocks(raw: str) -> list[dict]:
    """Blocks from `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>text` spans: one
    block per box (0-999 space); the text up to the next span belongs to the first box."""
    blocks = []
    spans = list(GROUNDED_SPAN.finditer(raw))
    for i, span in enumerate(spans):
        end = spans[i + 1].start() if i + 1 < len(spans) else len(raw)
        text = STRAY_TAGS.sub("", raw[span.end():end]).strip()
        numbers = [int(float(n)) for n in re.findall(r"-?\d+(?:\.\d+)?", span.group(2))]
        boxes = [numbers[j:j + 4] for j in range(0, len(numbers) - 3, 4)] or [[]]
        for k, box in enumerate(boxes):
            blocks.append({"label": span.group(1).strip(), "box": box, "text": text if k == 0 else ""})
    return blocks


def clean_markdown(raw: str) -> str:
    """Whole ref spans first, then det spans, then stray delimiters: removing only the
    delimiters would leave the labels behind as fake words."""
    text = REF_SPAN.sub("", raw)
    text = DET_SPAN.sub("", text)
    text = STRAY_TAGS.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def postprocess(text: str, args) -> tuple[str, dict]:
    extras = {"blocks": parse_grounded_blocks(text)}
    if args.keep_raw:
        extras["raw"] = text
    return clean_markdown(text), extras


EXTRA_COLUMNS = {"blocks": "blocks", "raw": "string"}  # column suffix -> "blocks" or "string"


def inference_settings(args) -> dict:
    return {"prompt": prompt_text(args), "prompt_mode": None if args.prompt else args.prompt_mode,
            "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
            "skip_special_tokens": False, "vllm_xargs": NGRAM_XARGS}


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


# ==== BEGIN SERVER HELPERS (identical in every server script; edit one copy, run tools/sync_helpers.py) ====
# The vLLM server's life cycle and the request loop. The model section provides SERVE_ARGS,
# SERVE_ENV, DEFAULT_SERVER, spawn_args(), build_request(), image_token_budget(); the common
# block provides the rest.
import asyncio
import base64
import math
import shutil
import socket
import subprocess
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import httpx

IMAGE_URL_PLACEHOLDER = "@@PAGE_IMAGE_URL@@"
RETRY_STATUS = {408, 429, 500, 502, 503, 504}


def effective_serve_args(args) -> list[str]:
    """SERVE_ARGS, then --serve-args; --logits-processors moved last, since it takes a list
    and would swallow any bare value after it."""
    argv = list(SERVE_ARGS) + shlex.split(args.serve_args or "")
    tail, out, i = [], [], 0
    while i < len(argv):
        if argv[i] in ("--logits-processors", "--logits_processors"):
            tail.append(argv[i])
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                tail.append(argv[i])
                i += 1
        else:
            out.append(argv[i])
            i += 1
    return out + tail


def serve_arg_value(argv: list[str], name: str, default=None):
    """The last value given for a flag (--name value or --name=value)."""
    value = default
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def served_model_name(args) -> str:
    return serve_arg_value(effective_serve_args(args), "--served-model-name") or args.model


def check_context_budget(max_model_len: int, args) -> None:
    """Image tokens + max_tokens must fit the context, or the server answers 400 to every page."""
    need = image_token_budget() + args.max_tokens
    if need > max_model_len:
        fail(f"--max-tokens {args.max_tokens} plus up to {image_token_budget()} prompt tokens "
             f"(the largest page) is {need}, over the server's max_model_len {max_model_len}: "
             f"every request would be refused. Lower --max-tokens to at most "
             f"{max_model_len - image_token_budget()}, or raise --max-model-len.")


class ServerManager:
    """Reuse a server, wait for one that is booting, or start `vllm serve` and own it."""

    def __init__(self, args, argv: list[str], log_dir: Path):
        self.args, self.argv = args, argv
        parsed = urllib.parse.urlparse(args.server if "//" in args.server else "http://" + args.server)
        self.base = f"{parsed.scheme}://{parsed.netloc}"
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.local = self.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.log_path = log_dir / f"vllm-serve-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.model_name = served_model_name(args)
        self.max_model_len: int | None = None
        self.version: str | None = None
        self._lock = asyncio.Lock()

    # -- probes --
    async def healthy(self, client) -> bool:
        try:
            response = await client.get(f"{self.base}/health", headers=self.headers, timeout=5)
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    async def served_models(self, client) -> list[dict]:
        response = await client.get(f"{self.base}/v1/models", headers=self.headers, timeout=10)
        response.raise_for_status()
        return response.json().get("data", [])

    async def ready(self, client) -> bool:
        if not await self.healthy(client):
            return False
        try:
            models = await self.served_models(client)
        except (httpx.HTTPError, ValueError):
            return False
        for entry in models:
            if entry.get("id") == self.model_name:
                self.max_model_len = entry.get("max_model_len") or self.max_model_len
                return True
        names = ", ".join(m.get("id", "?") for m in models)
        fail(f"the server at {self.base} serves {names or 'no model'}, not {self.model_name}. "
             f"Pass --model with the served name, or point --server elsewhere.")

    def port_in_use(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def vllm_booting_here(self) -> bool:
        """A `vllm serve` on this port started a moment ago (not yet listening)."""
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv if a]
            is_serve = any(w.endswith("vllm") for w in words[:3]) and "serve" in words[:4]
            is_api = any("vllm.entrypoints.openai.api_server" in w for w in words[:4])
            if (is_serve or is_api) and int(serve_arg_value(words, "--port", 8000)) == self.port:
                if self.process is None or int(proc.name) != self.process.pid:
                    return True
        return False

    # -- life cycle --
    async def start(self, client, stats: RunStats) -> None:
        started = time.monotonic()
        if await self.ready(client):
            log(f"using the vLLM server at {self.base} ({self.model_name})")
        elif not self.local or self.args.no_spawn:
            log(f"waiting for the server at {self.base} (up to {self.args.server_timeout:.0f} s)")
            await self.wait_ready(client, self.args.server_timeout)
        elif self.port_in_use() or self.vllm_booting_here():
            log(f"a server is starting on port {self.port}; waiting for it instead of starting another")
            await self.wait_ready(client, self.args.server_timeout)
        else:
            if shutil.which("vllm") is None:
                self.explain_missing_vllm()
            max_len = serve_arg_value(effective_serve_args(self.args), "--max-model-len")
            if max_len:
                check_context_budget(int(max_len), self.args)
            self.spawn()
            await self.wait_ready(client, self.args.server_timeout)
            stats.server_startup_s = round(time.monotonic() - started, 2)
        if self.max_model_len:
            check_context_budget(int(self.max_model_len), self.args)
        try:
            response = await client.get(f"{self.base}/version", headers=self.headers, timeout=5)
            self.version = response.json().get("version")
        except (httpx.HTTPError, ValueError):
            self.version = None
        stats.vllm_version = self.version

    def explain_missing_vllm(self) -> "NoReturn":  # noqa: F821
        log(f"error: nothing answers at {self.base} and there is no `vllm` command here to start "
            f"a server.\n\nRun it on Hugging Face Jobs, whose vLLM image provides `vllm`:\n  "
            f"{reproduce_command(self.argv)}\n\nor locally:\n"
            f"  * install vLLM on a machine with a GPU (`uv pip install vllm` or `pip install vllm`),"
            f" then rerun the same command: the script starts `vllm serve` itself;\n"
            f"  * or pass --server URL to use a vLLM server that is already running.")
        raise SystemExit(2)

    def serve_command(self) -> list[str]:
        command = ["vllm", "serve", self.args.model, "--host", self.host, "--port", str(self.port)]
        if MODEL_REVISION and self.args.model == MODEL_ID:
            command += ["--revision", MODEL_REVISION]
        if self.api_key:
            command += ["--api-key", self.api_key]
        serve_args = effective_serve_args(self.args)
        if SCRIPT_SHAPE == "saturate" and serve_arg_value(serve_args, "--api-server-count") is None:
            count = self.args.api_server_count or default_api_server_count()
            if count > 1:
                command += ["--api-server-count", str(count)]
        return command + serve_args  # --logits-processors stays last

    def spawn(self) -> None:
        command = self.serve_command() + spawn_args(self.args)
        log(f"starting: {' '.join(shlex.quote(a) for a in redact_argv(command))}\n"
            f"  (server log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env={**os.environ, **SERVE_ENV})
        log_file.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join("  | " + line for line in text[-lines:])

    async def wait_ready(self, client, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RunAborted(f"vllm serve exited with code {self.process.returncode} before "
                                 f"it was ready. Last lines of {self.log_path}:\n{self.log_tail()}")
            if await self.ready(client):
                return
            await asyncio.sleep(1.0)
        tail = f"\nLast lines of {self.log_path}:\n{self.log_tail()}" if self.process else ""
        raise RunAborted(f"the server at {self.base} was not ready after {timeout:.0f} s{tail}")

    async def recover(self, client) -> None:
        """After a connection error: return once the server answers again, restarting a spawned
        one that died (bounded), or raise RunAborted."""
        async with self._lock:
            if await self.healthy(client):
                return
            if self.process is not None and self.process.poll() is not None:
                if self.restarts >= self.args.max_restarts:
                    raise RunAborted(f"vllm serve died {self.restarts + 1} times; giving up. Last "
                                     f"lines of {self.log_path}:\n{self.log_tail()}")
                self.restarts += 1
                log(f"vllm serve died (exit {self.process.returncode}); restart "
                    f"{self.restarts}/{self.args.max_restarts}; its pages are sent again")
                self.stop()
                self.spawn()
                await self.wait_ready(client, self.args.server_timeout)
                return
            deadline = time.monotonic() + self.args.server_down_timeout
            while time.monotonic() < deadline:
                if await self.healthy(client):
                    return
                if self.process is not None and self.process.poll() is not None:
                    break
                await asyncio.sleep(2.0)
            else:
                raise RunAborted(f"the server at {self.base} stopped answering for "
                                 f"{self.args.server_down_timeout:.0f} s; finished rows are saved, "
                                 f"rerun the same command to resume.")
        await self.recover(client)  # the spawned server died while we waited: restart it

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.process = None if self.process is None else self.process
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def prepare_page_inline(cell) -> PreparedPage | None:
    """The page, when its bytes are in memory and it goes out as it is: a header read, cheaper
    on the event loop than a hop to the pool and back (CPU that a server on the same machine
    can use). None: the page needs the pool."""
    held = cell.get("bytes") if isinstance(cell, dict) else cell
    if not isinstance(held, (bytes, bytearray, memoryview)):
        return None
    return prepare_page(cell, decode=False)


def request_body(page: PreparedPage, model_name: str, args) -> bytes:
    """The JSON body with the page's base64 spliced in as bytes: one copy, no escaping needed."""
    request = build_request(IMAGE_URL_PLACEHOLDER, args)
    request["model"] = model_name
    head, tail = json.dumps(request, ensure_ascii=False).split(IMAGE_URL_PLACEHOLDER)
    return b"".join((head.encode(), b"data:", page.mime.encode(), b";base64,",
                     base64.b64encode(page.data), tail.encode()))


async def send_page(client, server: ServerManager, body: bytes, args) -> RowResult:
    """POST one page; retry what may pass next time, record what will not."""
    url = f"{server.base}/v1/chat/completions"
    headers = {"Content-Type": "application/json", **server.headers}
    attempt, outages, last_error = 0, 0, ""
    while attempt <= args.max_retries:
        try:
            response = await client.post(url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                httpx.WriteError) as exc:
            outages += 1
            if outages > args.max_restarts + 5:
                return RowResult(error=f"connection failed {outages} times: {exc}")
            await server.recover(client)  # raises RunAborted when the server is gone for good
            continue
        except httpx.TimeoutException:
            last_error = f"timed out after {args.request_timeout:g} s"
        else:
            if response.status_code == 200:
                try:
                    payload = response.json()
                    choice = payload["choices"][0]
                    usage = payload.get("usage") or {}
                    return RowResult(text=choice["message"].get("content") or "",
                                     finish_reason=choice.get("finish_reason"),
                                     prompt_tokens=usage.get("prompt_tokens"),
                                     completion_tokens=usage.get("completion_tokens"))
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return RowResult(error=f"unreadable response: {exc}: {response.text[:300]}")
            last_error = f"HTTP {response.status_code}: {response.text[:500]}"
            if response.status_code not in RETRY_STATUS:
                return RowResult(error=last_error)
        attempt += 1
        if attempt <= args.max_retries:
            await asyncio.sleep(min(30.0, 2 ** attempt) * random.uniform(0.5, 1.0))
    return RowResult(error=f"gave up after {args.max_retries + 1} attempts: {last_error}")


class ClientGroup:
    """httpx clients behind one `post`/`get`, each holding at most POOL_SIZE requests. httpx
    scans every connection of its pool on each request, and its idle check is quadratic: one
    pool for 256 pages in flight cost 14-16 ms of driver CPU per page here, against 4-5 ms at
    32. Small pools keep the cost per page flat however wide the window grows."""

    POOL_SIZE = 16

    def __init__(self, **client_kwargs):
        self.client_kwargs = client_kwargs
        self.clients: list[httpx.AsyncClient] = []
        self.busy: list[int] = []

    async def __aenter__(self) -> "ClientGroup":
        return self

    async def __aexit__(self, *exc) -> None:
        for client in self.clients:
            await client.aclose()

    def least_busy(self) -> int:
        index = min(range(len(self.busy)), key=self.busy.__getitem__, default=-1)
        if index < 0 or self.busy[index] >= self.POOL_SIZE:
            self.clients.append(httpx.AsyncClient(**self.client_kwargs))
            self.busy.append(0)
            index = len(self.clients) - 1
        return index

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        index = self.least_busy()
        self.busy[index] += 1
        try:
            return await self.clients[index].request(method, url, **kwargs)
        finally:
            self.busy[index] -= 1

    async def post(self, url: str, **kwargs) -> httpx.Response:
        return await self.request("POST", url, **kwargs)

    async def get(self, url: str, **kwargs) -> httpx.Response:
        return await self.request("GET", url, **kwargs)


class Window:
    """Pages in flight: acquired before a page is prepared, released when its answer is in.
    Its limit can move (the saturate scripts adapt it)."""

    def __init__(self, limit: int):
        self.limit, self.used = max(1, limit), 0
        self._changed = asyncio.Condition()

    async def acquire(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < self.limit)
            self.used += 1

    async def release(self) -> None:
        async with self._changed:
            self.used -= 1
            self._changed.notify_all()

    async def resize(self, limit: int) -> None:
        async with self._changed:
            self.limit = max(1, limit)
            self._changed.notify_all()


def available_memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def parse_metrics(text: str) -> dict:
    """The vLLM gauges the window needs, summed over label sets; missing ones are absent."""
    wanted = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
              "vllm:kv_cache_usage_perc": "kv", "vllm:gpu_cache_usage_perc": "kv",
              "vllm:prefix_cache_hits_total": "prefix_hits",
              "vllm:prefix_cache_queries_total": "prefix_queries"}
    out: dict = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            key = wanted[name]
            out[key] = out.get(key, 0.0) + value if key != "kv" else max(out.get(key, 0.0), value)
    return out


class WindowController:
    """Adapts the window of a saturate script: it grows while the engine has no queue and
    delivered tokens/s still rise, holds or shrinks when requests wait or the KV cache is near
    full, never widens a window nothing has come back through, and never lets the pages in
    flight outgrow the host-memory budget (measured bytes per page). Without the engine's
    gauges (some vLLM versions drop them with --api-server-count > 1) it goes by delivered
    throughput alone. Every tick is written to a telemetry file."""

    def __init__(self, window: Window, stats: RunStats, args, telemetry_path: Path | None,
                 adaptive: bool):
        self.window, self.stats, self.args, self.adaptive = window, stats, args, adaptive
        self.budget = int(args.max_inflight_memory * (1 << 20)) if args.max_inflight_memory \
            else available_memory_bytes() // 4
        self.telemetry = open(telemetry_path, "a") if telemetry_path else None
        self.page_bytes: list[int] = []
        self.tokens = self.pages = 0
        self.preparing = 0
        self.completions_since_change = 0
        self.best_rate = 0.0
        self.samples: list[str] = []
        self.metrics_seen = False
        self.prefix_hit_rate = None
        self.input_done = False
        self.last_sample = time.monotonic()

    def note_body(self, size: int) -> None:
        self.page_bytes.append(size)
        if len(self.page_bytes) > 256:
            del self.page_bytes[:128]

    def on_result(self, result: RowResult, latency) -> None:
        self.tokens += result.completion_tokens or 0
        self.pages += 1
        self.completions_since_change += 1

    def memory_cap(self) -> int:
        """Pages the budget holds: each in flight keeps its request body, plus a margin."""
        if not self.page_bytes:
            return max(1, self.args.min_window)
        per_page = statistics.mean(self.page_bytes) * 1.5 + (64 << 10)
        return max(1, int(self.budget // per_page))

    async def read_metrics(self, client, server: ServerManager) -> dict:
        try:
            response = await client.get(f"{server.base}/metrics", headers=server.headers, timeout=5)
            if response.status_code == 200:
                metrics = parse_metrics(response.text)
                self.metrics_seen = self.metrics_seen or bool(metrics)
                return metrics
        except httpx.HTTPError:
            pass
        return {}

    async def run(self, client, server: ServerManager) -> None:
        while True:
            await asyncio.sleep(self.args.adapt_interval)
            await self.sample(client, server)

    async def sample(self, client, server: ServerManager) -> None:
        """Read the gauges, decide, write a telemetry row; also once at the end, so that a run
        shorter than one interval has its row and the prefix-cache counters are the final ones."""
        now = time.monotonic()
        dt, self.last_sample = max(1e-3, now - self.last_sample), now
        metrics = await self.read_metrics(client, server)
        if metrics.get("prefix_queries"):
            self.prefix_hit_rate = round(metrics.get("prefix_hits", 0.0) / metrics["prefix_queries"], 4)
        rate, page_rate = self.tokens / dt, self.pages / dt
        self.tokens = self.pages = 0
        await self.tick(metrics, rate)
        if self.telemetry:
            self.telemetry.write(json.dumps({
                "t": round(now - self.stats.started, 2), "window": self.window.limit,
                "in_flight": self.stats.in_flight, "preparing": self.preparing,
                "running": metrics.get("running"), "waiting": metrics.get("waiting"),
                "kv_cache": metrics.get("kv"), "tokens_per_s": round(rate, 1),
                "pages_per_s": round(page_rate, 3), "memory_cap": self.memory_cap(),
                "bound_by": self.samples[-1] if self.samples else None}) + "\n")
            self.telemetry.flush()

    async def tick(self, metrics: dict, rate: float) -> None:
        """One decision. Continuous batching always keeps a few requests waiting for their
        prefill; a queue is "long" only when as many wait as run."""
        limit, cap = self.window.limit, self.memory_cap()
        waiting, running, kv = metrics.get("waiting"), metrics.get("running") or 0, metrics.get("kv")
        long_queue = waiting is not None and waiting > max(4, running)
        some_queue = waiting is not None and waiting > max(2, running / 4)
        full = self.stats.in_flight >= limit * 0.9
        if self.input_done:
            verdict = "tail"  # the last pages draining: says nothing about the steady state
        elif not self.stats.finished_at:
            verdict = "start"  # the first pages still on their way: nor does the filling
        elif some_queue or (kv or 0) > 0.9:
            verdict = "engine"
        elif full and limit >= cap:
            verdict = "memory"
        elif self.preparing >= max(2, self.stats.in_flight // 2):
            verdict = "preprocessing"
        elif not full:
            verdict = "input"
        else:
            verdict = "engine" if waiting is None and rate < self.best_rate * 1.02 else "window"
        self.samples.append(verdict)
        if not self.adaptive:
            return
        new = limit
        if limit > cap:
            new = cap  # the host-memory budget comes first
        elif long_queue or (kv or 0) > 0.95:
            new = max(self.args.min_window, int(limit * 0.85))  # over-full: give some back
        elif some_queue or (kv or 0) > 0.9:
            new = limit  # the engine has its queue: more pages in flight would only wait
        elif not full or self.completions_since_change < max(2, limit // 4):
            new = limit  # never widen a window nothing has come back through
        elif self.best_rate and rate < self.best_rate * 0.95:
            new = limit  # delivered tokens/s stopped rising: this is the plateau
        else:
            new = min(cap, self.args.max_window, int(math.ceil(limit * 1.5)))
        self.best_rate = max(self.best_rate, rate)
        if new != limit:
            self.completions_since_change = 0
            await self.window.resize(new)

    def bound_by(self) -> str | None:
        """The most frequent verdict of the steady state; "window" (full, no queue, still
        growing) counts as the engine only when nothing else was seen."""
        steady = [s for s in self.samples if s not in ("start", "tail")]
        if not steady:
            return "input" if self.samples else None
        bounded = [s for s in steady if s != "window"] or ["engine"]
        return max(set(bounded), key=bounded.count)

    def close(self) -> None:
        if self.telemetry:
            self.telemetry.close()


async def run_server_pipeline(source: InputSource, pending: list[int], writer: OrderedWriter,
                              stats: RunStats, args, server: ServerManager, window: Window,
                              check: DegenerateCheck,
                              controller: WindowController | None = None) -> None:
    """Start or reuse the server, then keep the window full until every pending row is done.
    On abort or interrupt, finished rows stay in `writer` for the caller to flush."""
    from tqdm import tqdm

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    prep_pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                   thread_name_prefix="prepare")
    write_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")
    loop = asyncio.get_running_loop()
    write_lock = asyncio.Lock()
    failure: list[BaseException] = []
    bar = adapting = None
    async with ClientGroup(limits=limits, timeout=timeout) as client:
        try:
            await server.start(client, stats)
            writer.info_entry["vllm_version"] = server.version
            adapting = asyncio.create_task(controller.run(client, server)) if controller else None
            bar = tqdm(total=len(pending), unit="page", dynamic_ncols=True, smoothing=0.1,
                       mininterval=0.5 if sys.stderr.isatty() else 10.0)

            async def flush_if_due(final: bool = False) -> None:
                if not check.settled() and not final:
                    return  # degenerate rows must not reach disk before the check has spoken
                if final or writer.due():
                    async with write_lock:
                        await loop.run_in_executor(write_pool, writer.flush, final)

            async def one(index: int, cell) -> None:
                latency = None
                try:
                    if controller:
                        controller.preparing += 1
                    try:
                        page = prepare_page_inline(cell) or \
                            await loop.run_in_executor(prep_pool, prepare_page, cell)
                    finally:
                        if controller:
                            controller.preparing -= 1
                    body = request_body(page, server.model_name, args)
                    del page, cell
                    if controller:
                        controller.note_body(len(body))
                    sent = time.monotonic()
                    result = await send_page(client, server, body, args)
                    del body
                    latency = time.monotonic() - sent
                except PageError as exc:
                    result = RowResult(error=str(exc))
                except RunAborted as exc:
                    failure.append(exc)
                    return
                finally:
                    stats.leave()
                    await window.release()  # the answer is in: the next page may go
                if result.error is None:
                    result.text, result.extras = postprocess(result.text, args)
                    try:
                        check.observe(result.text)
                    except RunAborted as exc:
                        failure.append(exc)
                        return
                writer.add(index, result)
                stats.record(result, latency)
                bar.update(1)
                if result.error is not None:
                    bar.set_postfix(errors=stats.rows_failed, refresh=False)
                if controller is not None:
                    controller.on_result(result, latency)
                await flush_if_due()

            tasks: set[asyncio.Task] = set()
            for index, cell in iter_image_cells(source, pending):
                await window.acquire()
                if failure:
                    await window.release()
                    break
                stats.enter()
                task = asyncio.create_task(one(index, cell))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if controller:
                controller.input_done = True
            while tasks and not failure:
                await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
            if failure:
                for task in list(tasks):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise failure[0]
            if adapting is not None:  # one last sample: the final state, the final counters
                adapting.cancel()
                await asyncio.gather(adapting, return_exceptions=True)
                await controller.sample(client, server)
            check.finish()
            await flush_if_due(final=True)
        finally:
            if controller is not None:
                if adapting is not None:
                    adapting.cancel()
                controller.close()
            if bar is not None:
                bar.close()
            prep_pool.shutdown(wait=False, cancel_futures=True)
            write_pool.shutdown(wait=True)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--server", default=DEFAULT_SERVER,
                       help="vLLM server URL; reused when it answers, else (local URL) "
                            "`vllm serve` is started on its host and port (default: %(default)s)")
    group.add_argument("--api-key", help="server API key (default: VLLM_API_KEY)")
    group.add_argument("--serve-args", default="",
                       help="extra `vllm serve` arguments, appended after the script's own so "
                            "they override them, e.g. \"--max-model-len 16384\"")
    group.add_argument("--no-spawn", action="store_true",
                       help="never start a server: wait for --server (up to --server-timeout)")
    group.add_argument("--server-timeout", type=float, default=1800.0,
                       help="seconds to wait for a server to be ready (default: 1800: a cold "
                            "start downloads the weights)")
    group.add_argument("--server-down-timeout", type=float, default=300.0,
                       help="seconds a server may stop answering mid-run before the run ends "
                            "(finished rows are kept; rerun to resume)")
    group.add_argument("--max-restarts", type=int, default=3,
                       help="restarts of a spawned server that dies mid-run (default: 3)")
    group.add_argument("--request-timeout", type=float, default=900.0,
                       help="seconds for one page's answer (default: 900)")
    group.add_argument("--max-retries", type=int, default=4,
                       help="retries of a page after a timeout, 429 or 5xx (default: 4)")
    if SCRIPT_SHAPE != "saturate":
        group.add_argument("--concurrency", type=int, default=32,
                           help="pages in flight at once (default: 32, the seed's setting)")
        return
    group = parser.add_argument_group("saturation (the window adapts to keep the engine busy)")
    group.add_argument("--concurrency", type=int, default=None,
                       help="a fixed window of N pages instead of the adaptive one")
    group.add_argument("--max-inflight-memory", type=float, default=None,
                       help="MiB of host memory that pages in flight may hold (default: a "
                            "quarter of the memory available at start)")
    group.add_argument("--min-window", type=int, default=32,
                       help="smallest window, and the one it starts from (default: 32, the "
                            "server scripts' fixed window; starting lower cost 96-page runs here "
                            "a fifth of their throughput while the window grew)")
    group.add_argument("--max-window", type=int, default=1024, help="largest window (default: 1024)")
    group.add_argument("--adapt-interval", type=float, default=2.0,
                       help="seconds between window decisions (default: 2)")
    group.add_argument("--api-server-count", type=int, default=None,
                       help="API server processes of a spawned server (default: 4 on machines "
                            "with 12 or more cores, else 1; see the docstring)")


def default_api_server_count() -> int:
    """One API server preprocesses images on one core: on big flavors (12+ vCPUs, fast GPUs)
    it becomes the limit, and 4 gave +9% to +16% in the seed's runs; on small flavors host
    memory binds first, and extra servers only cost memory."""
    return 4 if (os.cpu_count() or 1) >= 12 else 1
def info_entry_for(args, server_args) -> dict:
    return {
        "model": args.model,
        "model_revision": MODEL_REVISION,
        "script": Path(sys.argv[0]).name,
        "shape": SCRIPT_SHAPE,
        "image": JOB_IMAGE,
        "serve_args": server_args,
        "column": args.output_column,
        "settings": inference_settings(args),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def server_argument_parser(doc: str) -> argparse.ArgumentParser:
    """Every option of a server script: input/output, server, then the model's own."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    add_server_arguments(parser)
    add_model_arguments(parser)
    return parser


def run_server_script(doc: str, argv: list[str] | None = None, hub_api=None) -> int:
    """The whole run: arguments, input, engine, output. `main()` calls it with the docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = server_argument_parser(doc).parse_args(argv)
    install_sigterm_handler()
    resolve_output(args.output)  # a bad OUTPUT fails before any data is touched

    source = open_input(args)
    check_output_columns(source, args)
    store = OutputStore(args.output, args, hub_api)
    store.resend_local_parts()
    pending = pending_rows(source, store.done_ranges())
    stats = RunStats(rows_total=source.hi - source.lo,
                     rows_skipped=source.hi - source.lo - len(pending))
    info_entry = info_entry_for(args, effective_serve_args(args))
    writer = OrderedWriter(store, source, pending, output_features(source, args), info_entry, args)
    server = ServerManager(args, argv, store.root / "logs")
    check = DegenerateCheck(not args.no_sanity_check, args.sanity_pages, len(pending))
    controller = None
    if SCRIPT_SHAPE == "saturate":
        window = Window(args.concurrency or args.min_window)
        telemetry = Path(args.stats_json).expanduser().with_suffix(".telemetry.jsonl") \
            if args.stats_json else store.root / "logs" / "telemetry.jsonl"
        telemetry.parent.mkdir(parents=True, exist_ok=True)
        controller = WindowController(window, stats, args, telemetry, adaptive=not args.concurrency)
    else:
        window = Window(args.concurrency)
    log(f"{len(pending)} of {stats.rows_total} rows to do ({stats.rows_skipped} already done) "
        f"-> {store.location()}")
    code = 0
    try:
        if pending:
            asyncio.run(run_server_pipeline(source, pending, writer, stats, args, server,
                                            window, check, controller))
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
    finally:
        server.stop()
    if code:
        keep_finished_rows(writer, check)
    if controller is not None:
        stats.extra.update({"bound_by": controller.bound_by(), "window_final": window.limit,
                            "memory_budget_bytes": controller.budget,
                            "prefix_cache_hit_rate": controller.prefix_hit_rate})
    result = stats.as_dict()
    write_stats(result, args)
    if not check.tripped and (writer.parts_written or store.done_ranges()):
        store.finish(build_card(source, store, args, result, info_entry, argv))
    log(f"done: {result['rows_ok']} ok, {result['rows_failed']} failed, "
        f"{result['rows_skipped']} skipped in {result['elapsed_s']:.1f} s "
        f"({result['pages_per_s'] or 0:.2f} pages/s) -> {store.location()}")
    return code
# ==== END SERVER HELPERS ====


# ============================================================================================
# main
# ============================================================================================

def main(argv: list[str] | None = None, hub_api=None) -> int:
    return run_server_script(__doc__, argv, hub_api)


if __name__ == "__main__":
    sys.exit(main())
