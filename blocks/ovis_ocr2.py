"""The OvisOCR2 model section shared by ovis-ocr2.py and ovis-ocr2-server.py: the model's
prompt, settings and clean-up; each script adds its serve or vllm.LLM part.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it. Its functions may call the common block's helpers
(imported below), which the script defines before they run.
"""

import math

from blocks.common.arguments import option
from blocks.common.loops import repeated_tail

# ==== BEGIN OVISOCR2 MODEL (source: blocks/ovis_ocr2.py) ====
# Shared by the two OvisOCR2 scripts (edit the source, then run tools/sync_helpers.py). In a
# copy for a new model, delete this comment and the BEGIN and END lines: the part is its own.
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
# On in both scripts: at their 32 requests in flight (16 a batch offline) vLLM's check costs
# under 2% of a decode step, and a loop of up to 32 tokens ends after 2,048 of 16,384 tokens
REPETITION_DETECTION_ON = True
TEMPERATURE = 0.0
MIN_PIXELS = 448 * 448  # 200,704: the processor upscales below this; the client never does
MAX_PIXELS = 2880 * 2880  # 8,294,400: the client downscales above this, to the processor's grid
PATCH_GRID = 32  # Qwen3.5 vision: 16 px patches merged 2x2, so sizes snap to multiples of 32
PROMPT_TEXT_TOKENS = 256  # generous bound on the chat template and prompt text around the image
PAGE_FORMAT = "jpeg"  # pages that must be converted or resized: JPEG quality 95 (others go as is)
PREFIX_CACHING = False


def image_token_budget(args=None) -> int:
    """Worst-case prompt tokens of one page: the largest image plus the text around it."""
    return MAX_PIXELS // (PATCH_GRID * PATCH_GRID) + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """The size to send: unchanged unless above MAX_PIXELS, then the processor's own choice.

    Qwen-style processors snap both sides to the patch grid and scale the area under
    max_pixels; resizing to exactly that size means the server does not resample again.
    """
    if width * height <= MAX_PIXELS:
        return width, height
    scale = math.sqrt(width * height / MAX_PIXELS)
    new_w = max(PATCH_GRID, math.floor(width / scale / PATCH_GRID) * PATCH_GRID)
    new_h = max(PATCH_GRID, math.floor(height / scale / PATCH_GRID) * PATCH_GRID)
    return new_w, new_h


def model_argument_problems(args) -> list[str]:
    return []  # no option of this model's depends on another


def add_model_arguments(parser) -> None:
    option(
        parser, "--keep-image-tags", identity=True, action="store_true",
        help="keep the <img src=\"images/bbox_...\"> figure placeholders in the Markdown "
             "(the card's clean-up drops them)")


def postprocess(text: str, args) -> tuple[str, dict]:
    """The card's clean-up, byte for byte (huggingface.co/ATH-MaaS/OvisOCR2): strip the text,
    split it on exactly two newlines, drop the blocks that, once stripped, start with a figure
    placeholder, join with two newlines, trim a degenerate repeated tail. Other spacing is the
    model's own."""
    blocks = text.strip().split("\n\n")
    if not args.keep_image_tags:
        blocks = [b for b in blocks if not b.strip().startswith('<img src="images/bbox_')]
    return trim_repeated_tail("\n\n".join(blocks)), {}


def trim_repeated_tail(text: str, min_length: int = 8000) -> str:
    """Keep one copy of a degenerate repeated tail (>= 100 chars, >= 5 repeats, period <= 200)."""
    if len(text) < min_length:
        return text
    period, repeats = repeated_tail(text)
    if repeats >= 5 and period * repeats >= 100:
        return text[: len(text) - period * (repeats - 1)]
    return text


EXTRA_COLUMNS: dict = {}  # column suffix -> "blocks" or "string": model-specific output columns


def inference_settings(args) -> dict:
    """What the inference_info entry and the card record about this model's settings."""
    return {"prompt": PROMPT, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
            "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
            "chat_template_kwargs": {"enable_thinking": False}}
# ==== END OVISOCR2 MODEL ====
