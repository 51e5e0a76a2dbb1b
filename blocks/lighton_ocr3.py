"""The LightOnOCR-3 model section shared by lighton-ocr3.py and lighton-ocr3-saturate.py: the
model's settings, options and output parsing; each script adds its serve or vllm.LLM part.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it. Its functions may call the common block's helpers
(imported below), which the script defines before they run.
"""

import argparse
import math
import re

from blocks.common.arguments import option
from blocks.grounding import block_box

# ==== BEGIN LIGHTONOCR-3 MODEL (source: blocks/lighton_ocr3.py) ====
# Shared by the two LightOnOCR-3 scripts (edit the source, then run tools/sync_helpers.py). In a
# copy for a new model, delete this comment and the BEGIN and END lines: the part is its own.
MODES = ("plain", "grounding")  # the two trained modes; other instructions are untrained
MAX_MODEL_LEN = 18000
DEFAULT_MAX_TOKENS = 12288  # the authors' benchmark output budget
TEMPERATURE = 0.2  # the measured runs' setting (and the authors' client); see the docstring
TOP_P = 1.0
LONGEST_EDGE = 2048  # the training render size: the model does no further resizing
PATCH_GRID = 32  # Qwen3.5 vision: 16 px patches merged 2x2
PROMPT_TEXT_TOKENS = 64
PAGE_FORMAT = "png"  # pages that must be resized or converted: PNG, as the model was trained
RESIZE_FILTER = "lanczos"  # the authors render and downscale with LANCZOS
PREFIX_CACHING = False
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


def image_token_budget(args=None) -> int:
    """A square page at the longest edge is the worst case: (2048/32)^2 = 4096 image tokens;
    with --max-pixels, the cap's area over a 32x32 token (5 MP: 4,882)."""
    max_pixels = getattr(args, "max_pixels", None)
    area = max_pixels if max_pixels else LONGEST_EDGE ** 2
    return area // PATCH_GRID ** 2 + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """Downscale only, both sides on the processor's 32 px grid: longest edge to 2048, or with
    --max-pixels (the authors' benchmark setting) the area to at most that many pixels."""
    max_pixels = getattr(args, "max_pixels", None)
    if max_pixels:
        if width * height <= max_pixels:
            return width, height
        scale = math.sqrt(max_pixels / (width * height))
        return (max(PATCH_GRID, math.floor(width * scale / PATCH_GRID) * PATCH_GRID),
                max(PATCH_GRID, math.floor(height * scale / PATCH_GRID) * PATCH_GRID))
    if max(width, height) <= LONGEST_EDGE:
        return width, height
    scale = LONGEST_EDGE / max(width, height)
    snap = lambda v: max(PATCH_GRID, min(LONGEST_EDGE, round(v * scale / PATCH_GRID) * PATCH_GRID))  # noqa: E731
    return snap(width), snap(height)


def pixel_count(text: str) -> int:
    """--max-pixels: a whole number of pixels, at least one 32x32 grid cell."""
    if not text.strip().isdigit() or int(text) < PATCH_GRID ** 2:
        raise argparse.ArgumentTypeError(f"must be a whole number of pixels, at least "
                                         f"{PATCH_GRID ** 2} (one {PATCH_GRID} px cell), got "
                                         f"{text!r}; e.g. 5000000 for 5 MP")
    return int(text)


def model_argument_problems(args) -> list[str]:
    """--drop-margins works on grounding mode's blocks: plain mode has none to drop."""
    if args.drop_margins and args.mode != "grounding":
        return ["--drop-margins leaves margin blocks out of grounding mode's Markdown, and "
                "plain mode has no blocks: add --mode grounding, or leave --drop-margins out"]
    return []


def add_model_arguments(parser) -> None:
    option(parser, "--mode", identity=True, choices=MODES, default="plain",
           help="plain: Markdown; grounding: Markdown plus a box per block, parsed "
                "into the <column>_blocks column (default: plain)")
    option(parser, "--temperature", identity=True, type=float, default=TEMPERATURE,
           help=f"sampling temperature (default: {TEMPERATURE}; the model card says 0.1)")
    option(parser, "--max-pixels", identity=True, type=pixel_count, default=None, metavar="N",
           help="downscale pages to at most N pixels instead of a 2048 px longest "
                "edge (the authors' olmOCR-Bench setting: 5000000 at --pdf-dpi 400)")
    option(parser, "--drop-margins", identity=True, action="store_true",
           help="grounding mode: leave header, footer and page-number blocks out "
                "of the Markdown (the blocks column keeps them), as the authors' "
                "olmOCR-Bench runs did")
    option(parser, "--keep-raw", identity=True, action="store_true",
           help="also keep the raw output (grounding markers and all) in <column>_raw")


def message_content(image_url: str, args) -> list[dict]:
    """Plain mode is the image alone; grounding mode adds the one word it was trained on."""
    content = [{"type": "image_url", "image_url": {"url": image_url}}]
    if args.mode == "grounding":
        content.append({"type": "text", "text": "grounding"})
    return content


# Grounding output (the model card's example, huggingface.co/lightonai/LightOnOCR-3-0.8B): one
# block per `![label](x1,y1,x2,y2)` marker, its text right after the marker on the same line and
# running on, over several lines if need be, until the next marker. Coordinates 0 to 1000.
BLOCK_MARKER = re.compile(
    r"!\[([^\]\n]{0,200})\]\(\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,"
    r"\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\)")
CUT_MARKER = re.compile(r"!\[[^\]\n]{0,200}(?:\]\([\d.,\s-]*)?\Z")
PROTECTED = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`|<?(?:https?|ftp)://[^\s<>()]+", re.S)
ESCAPED_DOLLAR = re.compile(r"\\\$(?:\\\$)?")  # `\$`, or `\$\$` around display math
LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
MATH_SIGN = re.compile(r"[\^_=<>{}+]")
PROSE = re.compile(r"(?<![A-Za-z])[A-Za-z]{2,}\s+[A-Za-z]{2,}")  # from a word's start: linear


def reads_as_math(inner: str) -> bool:
    """Whether the text between an escaped pair `\\$...\\$` reads as math (the model
    card's post-processing). The authors' exact test is not stated, only its examples
    (prices, code and URLs keep their escapes): this is this script's reading of them."""
    if not inner.strip() or inner != inner.strip():
        return False  # "\$5 and \$10": TeX math does not begin or end on a space
    if LATEX_COMMAND.search(inner):
        return True
    if PROSE.search(inner) or inner[-1] in "+-=<>^_":
        return False  # words between two dollar signs; "\$5+ \$10" ends on an operator
    if MATH_SIGN.search(inner):
        return True  # x^2, a_i, E = mc^2, 2x + 1
    return re.fullmatch(r"[A-Za-z](?:\([^()]*\))?'*", inner) is not None  # x, f(x), y'


def repair_math_escapes(text: str) -> str:
    """`\\$...\\$` becomes `$...$` only when the pair encloses math; prices, code spans, fenced
    code and URLs keep their escapes, so "\\$5 and \\$10" still reads as money in a viewer."""
    out, last = [], 0
    for protected in PROTECTED.finditer(text):
        out.append(_repair_span(text[last:protected.start()]))
        out.append(protected.group(0))
        last = protected.end()
    out.append(_repair_span(text[last:]))
    return "".join(out)


def _repair_span(text: str) -> str:
    tokens = list(ESCAPED_DOLLAR.finditer(text))
    out, last, i = [], 0, 0
    while i + 1 < len(tokens):
        opening, closing = tokens[i], tokens[i + 1]
        inner = text[opening.end():closing.start()]
        display = len(opening.group(0)) == 4
        if opening.group(0) == closing.group(0) and "\n\n" not in inner and \
                reads_as_math(inner.strip() if display else inner):
            dollars = "$$" if display else "$"
            out.append(text[last:opening.start()] + dollars + inner + dollars)
            last = closing.end()
            i += 2
        else:
            i += 1  # this escape stays; the next one may open a pair
    out.append(text[last:])
    return "".join(out)


# Page margins, the authors' omit_margins set (github.com/lightonai/LightOnOCR, benchmarks/
# ocr_bench/providers/loocr_grounding.py): footnotes are content and stay.
MARGIN_LABELS = frozenset({"header", "footer", "page_number", "page_header", "page_footer",
                           "header_image", "footer_image", "aside_text"})


def parse_grounding(raw: str, drop: frozenset = frozenset()) -> tuple[str, list[dict]]:
    """The blocks, and the Markdown without markers. A label ending in `+` continues the
    previous block: it stays a block of its own (label kept, box its own, often in the next
    column), and in the Markdown its text joins the previous block's with a space. A marker
    with a coordinate outside 0-1000 still starts a block, with no box. Text before the first
    marker is kept. Blocks whose label (less its `+`) is in `drop` stay out of the Markdown
    only. Never raises."""
    blocks: list[dict] = []
    raw = CUT_MARKER.sub("", raw)  # an answer cut off at max_tokens inside its last marker
    markers = list(BLOCK_MARKER.finditer(raw))
    lead = repair_math_escapes(raw[: markers[0].start()].strip() if markers else raw.strip())
    parts = [lead] if lead else []
    for i, marker in enumerate(markers):
        end = markers[i + 1].start() if i + 1 < len(markers) else len(raw)
        text = repair_math_escapes(raw[marker.end():end].strip())
        label = marker.group(1).strip()
        blocks.append({"label": label, "box": block_box(marker.groups()[1:], 1000), "text": text})
        if not text or label.lower().rstrip("+") in drop:
            continue
        if label.endswith("+") and parts:
            parts[-1] = parts[-1] + " " + text
        else:
            parts.append(text)
    return "\n\n".join(parts), blocks


def postprocess(text: str, args) -> tuple[str, dict]:
    extras = {"raw": text} if args.keep_raw else {}
    if args.mode == "grounding":
        drop = MARGIN_LABELS if getattr(args, "drop_margins", False) else frozenset()
        markdown, blocks = parse_grounding(text, drop)
        extras["blocks"] = blocks
        return markdown, extras
    return repair_math_escapes(text).strip(), extras


EXTRA_COLUMNS = {"blocks": "blocks", "raw": "string"}  # column suffix -> "blocks" or "string"


def inference_settings(args) -> dict:
    return {"mode": args.mode, "prompt": "grounding" if args.mode == "grounding" else None,
            "temperature": args.temperature, "top_p": TOP_P, "max_tokens": args.max_tokens,
            "longest_edge": None if args.max_pixels else LONGEST_EDGE,
            "max_pixels": args.max_pixels, "drop_margins": args.drop_margins,
            "image_format": PAGE_FORMAT,
            "chat_template_kwargs": CHAT_TEMPLATE_KWARGS}
# ==== END LIGHTONOCR-3 MODEL ====
