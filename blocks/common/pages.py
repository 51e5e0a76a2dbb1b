"""A page image: read from its cell, flattened, resized, encoded to send."""

import contextlib
import hashlib
import io
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from blocks.blank_page import is_blank
from blocks.common.errors import PageError
from blocks.common.inputs import _HUB_FILES, _PATH_BASE
from blocks.common.model_options import RESIZE_FILTER
from blocks.model import PAGE_FORMAT, target_size

# Pillow's 16 MiB blocks stay in each thread's malloc arena once freed; 64 MiB ones are given back
os.environ.setdefault("PILLOW_BLOCK_SIZE", "64m")
PDF_MAX_PIXELS = 12_000_000  # above any model's input here: a poster-sized page shrinks to it
PDF_MAX_SIDE = 16384  # pixels: above it, no encoder (JPEG stops at 65,535) or processor will do


@dataclass
class PreparedPage:
    data: bytes
    mime: str
    width: int
    height: int
    passthrough: bool
    text_layer: str | None = None  # a PDF page's embedded text, when asked for
    skipped: bool = False  # not to be sent: its text layer has enough text (--skip-text-pages)
    digest: str | None = None  # of the input it was made from: input_digest()
    blank: bool = False  # not to be sent: no ink on it (BLANK PAGE HELPERS), unless --send-blank


BLANK_REASON = "blank page: no ink found (--send-blank sends such pages)"


def judges_blank(args) -> bool:
    """Whether pages are judged for ink before they are sent (not with --send-blank)."""
    return args is not None and not getattr(args, "send_blank", True)


def input_digest(data: bytes) -> str:
    """What a row was made from (a PDF page: its document): a rerun reuses a row for the same."""
    return hashlib.sha256(data).hexdigest()[:20]


def hub_download_folder(repo: str) -> Path:
    """Where huggingface_hub keeps a dataset repo's files (its path cells name them)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return Path(os.path.realpath(HF_HUB_CACHE)) / f"datasets--{repo.replace('/', '--')}"


def _resolve_image_path(value: str) -> Path:
    """The file a path cell names; a Hub INPUT's: only its downloads (no file of this machine)."""
    if _HUB_FILES:
        real = Path(os.path.realpath(value))  # relative: to no folder of the dataset's
        if _HUB_FILES[0] not in real.parents:
            raise PageError(f"image path {value!r} of the Hub dataset is not read: a Hub cell is "
                            f"read from its bytes, or from a file datasets downloaded for it")
        return real
    path = Path(value).expanduser()
    based = _PATH_BASE[0] / path if _PATH_BASE else path  # an absolute path stays itself
    return based if not path.exists() and based.exists() else path


def cell_source(cell) -> tuple:
    """(bytes, else the file, else None; the cell's path) of an image or PDF cell (PageError)."""
    data, path = (cell.get("bytes"), cell.get("path")) if isinstance(cell, dict) else (cell, None)
    if isinstance(data, str):
        data, path = None, data
    if data is None and isinstance(path, str) and path:
        data = str(_resolve_image_path(path))  # PageError: a path that must not be read
    return bytes(data) if isinstance(data, (bytearray, memoryview)) else data, path or None


def read_cell_bytes(cell) -> bytes:
    data, shown = cell_source(cell)
    try:
        data = Path(data).read_bytes() if isinstance(data, str) else data
    except OSError as exc:
        raise PageError(f"cannot read image file {shown}: {exc}") from None
    if data is None:
        raise PageError("missing image (empty cell)")
    if not isinstance(data, bytes):
        raise PageError(f"unsupported image cell of type {type(data).__name__}")
    if not data:
        raise PageError("empty image bytes")
    return data


def flatten(img):
    """Any PIL mode as grey or RGB, by strips; 16-bit and float rescaled, alpha on white."""
    import numpy as np
    from PIL import Image

    wide = img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
    if not (wide or img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or
            img.mode == "P" and "transparency" in img.info):
        return img if img.mode in ("L", "RGB") else img.convert("RGB")
    rows = max(1, (1 << 20) // max(1, img.width))  # strips of a million pixels, whole rows
    strips = [(0, y, img.width, min(img.height, y + rows)) for y in range(0, img.height, rows)]
    if wide:  # a 12-bit scan fills the range; an inf is not a pixel's value
        peak = max((float(np.max(a[np.isfinite(a)], initial=0))
                    for a in (np.asarray(img.crop(box)) for box in strips)), default=0.0)
        top = next((top for top in (1.0, 255, 4095) if peak <= top), 65535)  # the bit depth
    flat = Image.new("L" if wide or img.mode in ("LA", "La") else "RGB", img.size, "white")
    for box in strips:
        if wide:
            strip = np.asarray(img.crop(box), dtype=np.float32)
            strip = np.nan_to_num(strip, posinf=top, neginf=0) * (255.0 / top)
            flat.paste(Image.fromarray(np.clip(strip, 0, 255).round().astype(np.uint8)), box[:2])
        else:
            strip = img.crop(box).convert("RGBA")
            flat.paste(strip.convert(flat.mode), box[:2], strip.getchannel("A"))
    return flat


_GIANT_DECODE, _NO_LOCK = threading.Lock(), contextlib.nullcontext()  # giant scans: one at a time
warnings.filterwarnings("ignore", module="PIL")  # its size and EXIF notes: the page is read anyway


def prepare_page(cell, args=None, decode: bool = True) -> PreparedPage | None:
    """The bytes to send for one cell at the size args ask; a JPEG or PNG unchanged as it is."""
    from PIL import Image, ImageOps

    raw = read_cell_bytes(cell)
    try:
        img = Image.open(io.BytesIO(raw))
        # PNG keeps EXIF (rare) after the pixels: reading it there would decode the page
        exif = img.format != "PNG" or "exif" in img.info
        orientation = img.getexif().get(0x0112, 1) if exif else 1
        upright, turned = orientation in (None, 1), orientation in (5, 6, 7, 8)
        width, height = img.size[::-1] if turned else img.size
        target, jpeg = sent_size(width, height, args), img.format == "JPEG"
        if target == (width, height) and upright and img.mode == "RGB" and \
                getattr(img, "n_frames", 1) == 1 and img.format in ("JPEG", "PNG"):
            # a complete JPEG is not even decoded
            cheap = raw.rstrip(b"\0").endswith(b"\xff\xd9") if jpeg else len(raw) <= 1 << 20
            if not (decode or cheap and not judges_blank(args)):  # judging ink is pixel work
                return None
            if not jpeg:
                img.verify()  # every chunk's checksum: truncation
            elif not cheap:  # trailing bytes or truncated? A 1/8-scale decode reads all
                img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                img.load()
            blank = judges_blank(args) and is_blank(Image.open(io.BytesIO(raw)))
            return PreparedPage(raw, f"image/{img.format.lower()}", width, height, True,
                                digest=input_digest(raw), blank=blank)
        if not decode:
            return None
        if target != (width, height) and jpeg:
            # decoded at twice the target at least: the model's filter does the last step
            img.draft(img.mode if img.mode in ("RGB", "L") else None,
                      tuple(2 * side for side in (target[::-1] if turned else target)))
        with _GIANT_DECODE if img.width * img.height > 25_000_000 else _NO_LOCK:
            img.load()
            if not upright:
                img = ImageOps.exif_transpose(img)
            if img.size == (height, width) != (width, height):  # a TIFF: Pillow turned it
                target = sent_size(*img.size, args)  # as it loaded (and, by version, sized)
            # grey is resized as grey, and widened at the model's size
            flat = flatten(img)
            return PreparedPage(*encode_page(flat, target), False, digest=input_digest(raw),
                                blank=judges_blank(args) and is_blank(flat))
    except Exception as exc:  # undecodable, truncated, a bomb: one row fails, not the run
        reason = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc))  # no address
        if isinstance(exc, Image.DecompressionBombError):  # a real giant scan: the way out
            reason += " Scale it down below that (datasets would refuse it in the output too)."
        raise PageError(f"cannot decode image: {type(exc).__name__}: {reason}") from None


def sent_size(width: float, height: float, args, pixels: float = 0) -> tuple[int, int]:
    """The size an image or PDF page is sent at (encode_page resizes): the model's target_size."""
    if pixels:  # a PDF page at --pdf-dpi, first shrunk to at most `pixels`
        shrink = min(1.0, math.sqrt(pixels / (width * height)), PDF_MAX_SIDE / max(width, height))
        width, height = max(1, round(width * shrink)), max(1, round(height * shrink))
    return target_size(width, height, args)


def encode_page(img, size: tuple[int, int]) -> tuple:
    """(data, mime, width, height): resized by the model's filter, PNG or JPEG quality 95."""
    from PIL import Image

    if img.size != size:
        img = img.resize(size, getattr(Image.Resampling, RESIZE_FILTER.upper()))
    out, img = io.BytesIO(), img if img.mode == "RGB" else img.convert("RGB")
    img.save(out, **({"format": "PNG", "compress_level": 1} if PAGE_FORMAT == "png" else
                     {"format": "JPEG", "quality": 95}))
    return out.getvalue(), f"image/{PAGE_FORMAT}", *size
