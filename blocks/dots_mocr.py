"""The dots.mocr model section of dots-mocr-server.py: its prompt, serve flags, request, image
bound and context budget, and the parsing of its JSON layout answer into Markdown and blocks.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the script that carries it. Its functions may call the helpers of the blocks
the script carries (imported below), which the script defines before they run.
"""

import argparse
import json
import re

from blocks.common.arguments import option
from blocks.grounding import block_box
from blocks.patch_grid import max_patch_grid_tokens, patch_grid_tokens, snap_to_patch_grid

# ==== BEGIN DOTS-MOCR MODEL (source: blocks/dots_mocr.py) ====
# The model section of dots-mocr-server.py (edit the source, then run tools/sync_helpers.py). In
# a copy for a new model, delete this comment and the BEGIN and END lines: the part is its own.
# prompt_layout_all_en, character for character (dots_mocr/utils/prompts.py; ends with "\n").
PROMPT = (
    "Please output the layout information from the PDF image, including each layout element's "
    "bbox, its category, and the corresponding text content within the bbox.\n\n"
    "1. Bbox format: [x1, y1, x2, y2]\n\n"
    "2. Layout Categories: The possible categories are ['Caption', 'Footnote', 'Formula', "
    "'List-item', 'Page-footer', 'Page-header', 'Picture', 'Section-header', 'Table', 'Text', "
    "'Title'].\n\n"
    "3. Text Extraction & Formatting Rules:\n"
    "    - Picture: For the 'Picture' category, the text field should be omitted.\n"
    "    - Formula: Format its text as LaTeX.\n"
    "    - Table: Format its text as HTML.\n"
    "    - All Others (Text, Title, etc.): Format their text as Markdown.\n\n"
    "4. Constraints:\n"
    "    - The output text must be the original text from the image, with no translation.\n"
    "    - All layout elements must be sorted according to human reading order.\n\n"
    "5. Final Output: The entire output must be a single JSON object.\n"
)
# The authors' client puts the image placeholder in the text itself, else vLLM adds a "\n"
IMAGE_PLACEHOLDER = "<|img|><|imgpad|><|endofimg|>"
TEMPERATURE, TOP_P = 0.1, 1.0  # the authors' parser (DotsMOCRParser); see the docstring
MAX_MODEL_LEN = 24000  # the one context a source ran the model with; see the docstring
PATCH_FACTOR = 28  # 14 px patches merged 2x2
# The processor's bounds (dots_mocr consts). vLLM serves the model with Qwen2-VL's processor,
# whose bounds apply to the image itself, one frame (GLM-OCR's count two frames)
MIN_PIXELS, SERVER_MAX_PIXELS = 3136, 11289600
MAX_PIXELS = 8000 * PATCH_FACTOR ** 2  # 6,272,000: the client's cap, 8,000 image tokens
PROMPT_TEXT_TOKENS = len((IMAGE_PLACEHOLDER + PROMPT).encode()) + 64  # >= 1 byte a token, + template
PAGE_FORMAT = "png"  # pages that must be converted or resized: PNG, as the authors' client sends
PDF_DPI = 200  # the authors' parser renders PDF pages at 200 DPI
PREFIX_CACHING = False
POSTPROCESS_GETS_SIZE = True  # boxes are in the pixels of the image the server resized
MARGIN_LABELS = frozenset({"Page-header", "Page-footer"})  # the authors' *_nohf.md leaves out
MODEL_CARD_NOTE = (
    "**Licence.** dots.mocr is MIT-licensed together with the *dots.mocr LICENSE AGREEMENT* "
    "(github.com/rednote-hilab/dots.mocr, file `dots.mocr LICENSE AGREEMENT`), whose clause "
    "3.3(c) reads: \"Licensees shall not use the tool for unauthorized digitization of "
    "publications/document scanning or bulk scraping of content. Any use involving "
    "publications or other copyright-protected materials must first obtain relevant "
    "permissions.\"")

SERVE_ARGS = [
    "--trust-remote-code",
    "--chat-template-content-format", "string",  # without it the model answers ~1 token, then EOS
    "--max-model-len", str(MAX_MODEL_LEN),
    "--gpu-memory-utilization", "0.9",
    "--enable-prefix-caching" if PREFIX_CACHING else "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
    "--limit-mm-per-prompt", '{"image": 1}',
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"


def spawn_args(args) -> list[str]:
    """Serve arguments known only when this script starts the server itself (none here)."""
    return []


def image_token_budget(args=None) -> int:
    """The largest page under the client's cap (8,000 image tokens; with --max-pixels, that
    cap's) and the placeholder, prompt and chat template around it."""
    cap = getattr(args, "max_pixels", None) or MAX_PIXELS
    return max_patch_grid_tokens(cap, PATCH_FACTOR) + PROMPT_TEXT_TOKENS


DEFAULT_MAX_TOKENS = MAX_MODEL_LEN - image_token_budget()  # 24000 - 8000 - 981 = 15019
FULL_BOUND = argparse.Namespace(max_pixels=SERVER_MAX_PIXELS)  # the authors': 24000 - 14400 - 981


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """As it is when the server's own resize keeps it under the cap; else downscaled to the
    processor's grid under the cap, so that the server does not resample it again."""
    cap = getattr(args, "max_pixels", None) or MAX_PIXELS
    served = snap_to_patch_grid(width, height, PATCH_FACTOR, MIN_PIXELS, SERVER_MAX_PIXELS)
    if patch_grid_tokens(*served, PATCH_FACTOR) <= max_patch_grid_tokens(cap, PATCH_FACTOR):
        return width, height
    return snap_to_patch_grid(width, height, PATCH_FACTOR, MIN_PIXELS, cap)


def pixel_cap(text: str) -> int:
    """--max-pixels: a whole number inside the processor's bounds (the authors' parser asserts it)."""
    if not text.strip().isdigit() or not MIN_PIXELS <= int(text) <= SERVER_MAX_PIXELS:
        raise argparse.ArgumentTypeError(f"must be a whole number of pixels from {MIN_PIXELS:,} "
                                          f"to {SERVER_MAX_PIXELS:,}, got {text!r}")
    return int(text)


def model_argument_problems(args) -> list[str]:
    return []  # no option of this model's depends on another


def add_model_arguments(parser) -> None:
    option(parser, "--max-pixels", identity=True, type=pixel_cap, default=None, metavar="N",
           help=f"downscale pages above N pixels (default: {MAX_PIXELS:,}, 8,000 "
                f"image tokens; the authors' bound {SERVER_MAX_PIXELS:,} needs "
                f"--max-tokens {MAX_MODEL_LEN - image_token_budget(FULL_BOUND)} or less)")
    option(parser, "--drop-margins", identity=True, action="store_true",
           help="leave Page-header and Page-footer cells out of the Markdown (the "
                "blocks column keeps them), as the authors' olmOCR-Bench runs did")
    option(parser, "--keep-raw", identity=True, action="store_true",
           help="also keep the model's raw JSON answer in <column>_raw")


def build_request(image_url: str, args) -> dict:
    """The authors' request: the image, then the placeholder and the layout prompt as text."""
    return {
        "messages": [{
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": IMAGE_PLACEHOLDER + PROMPT},
            ],
        }],
        "temperature": TEMPERATURE,
        "top_p": TOP_P,
        "max_tokens": args.max_tokens,
    }


# The answer: a JSON list of cells {"bbox": [x1, y1, x2, y2], "category": ..., "text": ...}
# (no text for Picture), boxes in the pixels of the image as the server resized it.
CELL_START = re.compile(r"\{\s*\"(?:bbox|category|text)\"")
PREAMBLE = re.compile(r"\\(?:documentclass|usepackage)\s*(?:\[[^\]\n]*\])?\s*\{[^}\n]*\}"
                      r"|\\(?:begin|end)\s*\{document\}")
TICKED_MATH = re.compile(r"`(\$[^`\n]*\$)`")


def answer_cells(raw: str) -> list | None:
    """The cells of a whole answer; of one cut short or broken, every complete cell before and
    after the break, duplicates once (the authors' cleaner). None: no JSON cell at all."""
    decoder = json.JSONDecoder()
    try:
        whole = json.loads(raw)
        if isinstance(whole, dict):
            return [whole]
        if isinstance(whole, list) and (not whole or any(isinstance(c, dict) for c in whole)):
            return whole  # a list with no cell in it is no layout answer: its text is kept
    except (ValueError, RecursionError):
        pass
    cells, seen, at = [], set(), 0
    while (start := CELL_START.search(raw, at)) is not None:
        try:
            cell, at = decoder.raw_decode(raw, start.start())
        except (ValueError, RecursionError):
            at = start.end()  # a broken or cut cell: the next one may be whole
            continue
        key = json.dumps(cell, sort_keys=True)
        if key not in seen:
            seen.add(key)
            cells.append(cell)
    return cells or None


def page_box(bbox, served: tuple | None) -> list[int] | None:
    """A box in the served image's pixels as 0-1000 of the page: mapped back to the page by
    page/served per axis (the authors' scale), then over the page's size, which is bbox/served."""
    try:
        x1, y1, x2, y2 = (float(v) for v in bbox)
        width, height = served
        return block_box([x1 * 1000 / width, y1 * 1000 / height,
                          x2 * 1000 / width, y2 * 1000 / height], 1000)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None


def formula_markdown(text: str) -> str:
    """The authors' formula rule: $$...$$ and inline $...$ kept, \\[...\\] and bare LaTeX as a
    display block, document preamble commands removed."""
    text = PREAMBLE.sub("", text).strip()
    if not text or text.startswith("$") and text.endswith("$") and len(text) > 1:
        return text
    if text.startswith("\\[") and text.endswith("\\]"):
        text = text[2:-2].strip()
    return f"$$\n{text}\n$$"


def cell_markdown(label: str, text: str, figures) -> str:
    """A cell's Markdown; `figures` counts the page's pictures from 0."""
    if label == "Picture":
        return f"![](images/{next(figures)}.jpg)"
    if label == "Formula":
        return formula_markdown(text)
    return TICKED_MATH.sub(r"\1", text.strip())


def parse_cells(cells: list, sent_size) -> list[dict]:
    """One block per cell (a non-cell item is skipped): its category, its box as 0-1000 of the
    page (null when missing, out of the image or not a box), its Markdown."""
    served = sent_size and snap_to_patch_grid(*sent_size, PATCH_FACTOR, MIN_PIXELS,
                                              SERVER_MAX_PIXELS)
    import itertools

    blocks, figures = [], itertools.count()
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        label = cell.get("category") if isinstance(cell.get("category"), str) else ""
        text = cell.get("text") if isinstance(cell.get("text"), str) else ""
        blocks.append({"label": label, "box": page_box(cell.get("bbox"), served),
                       "text": cell_markdown(label, text, figures)})
    return blocks


def postprocess(text: str, args, sent_size=None) -> tuple[str, dict]:
    """Markdown of the cells in order, joined by blank lines; an answer with no JSON cell keeps
    its text as it is (the blocks column empty). Never raises."""
    extras = {"raw": text} if args.keep_raw else {}
    cells = answer_cells(text)
    if cells is None:
        extras["blocks"] = []
        return text.strip(), extras
    extras["blocks"] = blocks = parse_cells(cells, sent_size)
    drop = MARGIN_LABELS if args.drop_margins else frozenset()
    return "\n\n".join(b["text"] for b in blocks if b["text"] and b["label"] not in drop), extras


EXTRA_COLUMNS = {"blocks": "blocks", "raw": "string"}  # column suffix -> "blocks" or "string"


def inference_settings(args) -> dict:
    return {"prompt": PROMPT, "prompt_name": "prompt_layout_all_en", "temperature": TEMPERATURE,
            "top_p": TOP_P, "max_tokens": args.max_tokens,
            "max_pixels": args.max_pixels or MAX_PIXELS, "drop_margins": args.drop_margins,
            "image_format": PAGE_FORMAT}
# ==== END DOTS-MOCR MODEL ====
