"""The GLM-OCR model section of glm-ocr-server.py: the model's prompts, serve flags, sampling,
image bound and the authors' clean-up of an answer.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the script that carries it. Its functions call the PATCH GRID HELPERS block
(imported below), which the script defines before they run.
"""

import json
import re

from blocks.common.arguments import option
from blocks.patch_grid import (
    max_patch_grid_tokens, patch_grid_tokens, per_frame, snap_to_patch_grid,
)

# ==== BEGIN GLM-OCR MODEL (source: blocks/glm_ocr.py) ====
# The model section of glm-ocr-server.py (edit the source, then run tools/sync_helpers.py).
# The card's document-parsing prompts, character for character (MODEL-PROMPTS.json).
PROMPTS = {"text": "Text Recognition:", "table": "Table Recognition:",
           "formula": "Formula Recognition:"}
MAX_MODEL_LEN = 16384  # the largest page (6,144 image tokens) + 8,192 output tokens fit
DEFAULT_MAX_TOKENS = 8192  # the SDK's max_tokens
TEMPERATURE = 0.0  # the SDK's: greedy (see the docstring for its top_p and top_k)
REPETITION_PENALTY = 1.1  # the SDK's
SPECULATIVE_CONFIG = {"method": "mtp", "num_speculative_tokens": 3}  # the authors' current
# The processor (preprocessor_config.json, Glm46VImageProcessor): 14 px patches merged 2x2, and
# pixel bounds that count a still image as two frames
PATCH_GRID, TEMPORAL_PATCH_SIZE = 28, 2
PROCESSOR_MIN_PIXELS, PROCESSOR_MAX_PIXELS = 12544, 9633792  # size.shortest_edge, longest_edge
PROMPT_TEXT_TOKENS = 64  # chat template and prompt around the image (the prompts are 3-4 words)
PAGE_FORMAT = "jpeg"  # the SDK sends JPEG
PDF_DPI = 200  # the SDK's render DPI
PREFIX_CACHING = False
MODEL_CARD_NOTE = (
    "**This is GLM-OCR without its layout stage.** Each whole page went to the VLM with one "
    "prompt. The authors' scores (OmniDocBench v1.5: 94.62) come from their SDK's pipeline, "
    "in which PP-DocLayoutV3 finds the regions and their reading order and each region is "
    "read with the prompt of its kind (text, table, formula); the card recommends that SDK "
    "for document parsing. A third-party leaderboard lists GLM-OCR at 69.2 on the same "
    "benchmark (tables 37.4), its setup unstated, plausibly the VLM alone.")

SERVE_ARGS = [
    "--max-model-len", str(MAX_MODEL_LEN),
    "--limit-mm-per-prompt", '{"image": 1}',
    "--enable-prefix-caching" if PREFIX_CACHING else "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
    "--speculative-config", json.dumps(SPECULATIVE_CONFIG),
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"


def spawn_args(args) -> list[str]:
    """Serve arguments known only when this script starts the server itself (none here)."""
    return []


def frame_pixel_bounds() -> tuple[int, int]:
    """The processor's pixel bounds for one still image (6,272 and 4,816,896)."""
    return (per_frame(PROCESSOR_MIN_PIXELS, TEMPORAL_PATCH_SIZE),
            per_frame(PROCESSOR_MAX_PIXELS, TEMPORAL_PATCH_SIZE))


def image_token_budget(args=None) -> int:
    """The largest page the processor lets through (6,144 image tokens) and the text around it."""
    return max_patch_grid_tokens(frame_pixel_bounds()[1], PATCH_GRID) + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """Unchanged unless the processor would shrink the page (its area on the 28 px grid over
    the bound); then exactly the size the processor resizes it to, so the server does not
    resample it again. Never upscaled: the processor does that itself."""
    low, high = frame_pixel_bounds()
    bounded = snap_to_patch_grid(width, height, PATCH_GRID, low, high)
    on_grid = snap_to_patch_grid(width, height, PATCH_GRID)
    if patch_grid_tokens(*bounded, PATCH_GRID) < patch_grid_tokens(*on_grid, PATCH_GRID):
        return bounded
    return width, height


def model_argument_problems(args) -> list[str]:
    return []  # no option of this model's depends on another


def add_model_arguments(parser) -> None:
    option(parser, "--task", identity=True, choices=sorted(PROMPTS), default="text",
           help="which of the card's document-parsing prompts: text (whole pages, "
                "the default), table or formula (pages that are one table or "
                "one formula, as the SDK's layout stage crops them)")
    option(parser, "--keep-raw", identity=True, action="store_true",
           help="also keep the answer before the authors' clean-up in <column>_raw")


def build_request(image_url: str, args) -> dict:
    """One user turn: the image, then the prompt (the SDK's order); the SDK's sampling."""
    return {
        "messages": [{
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": PROMPTS[args.task]},
            ],
        }],
        "temperature": TEMPERATURE,
        "repetition_penalty": REPETITION_PENALTY,
        "max_tokens": args.max_tokens,
    }


# The SDK's clean-up of every region's answer (MODEL-FACTS, GLM-OCR, "Clean-up of every region")
EDGE_TABS = re.compile(r"\A(?:\\t|\t)+|(?:\\t|\t)+\Z")
LEADERS = [(re.compile(r"(?:\\_){4,}"), r"\\_\\_\\_"), (re.compile(r"\.{4,}"), "..."),
           (re.compile(r"·{4,}"), "···"), (re.compile(r"_{4,}"), "___")]
# `$ x $` inline (not `$$`, not `\$`); a closing `$` right before a digit is a price ("$5 and $6")
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)([^$\n]+?)(?<!\\)\$(?![$\d])")
LONG_ANSWER = 2048  # the repetition cuts apply to answers at least this long
MIN_UNIT, MIN_REPEATS = 10, 10


def true_runs(mask):
    """(starts, lengths) of the runs of True in a boolean array."""
    import numpy as np

    breaks = np.flatnonzero(~mask)
    starts = np.concatenate(([0], breaks + 1))
    return starts, np.concatenate((breaks, [len(mask)])) - starts


def first_repeated_unit(text: str) -> tuple[int, int] | None:
    """(start, length) of the first unit of >= 10 characters repeated >= 10 times in a row:
    the leftmost start, then the shortest unit. Per unit length L, text[i] == text[i + L] must
    hold 9L times in a row, so first at the 9 multiples of L such a run always spans (n / L
    comparisons), and at every position only where it does."""
    import numpy as np

    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    best = None
    for length in range(MIN_UNIT, len(codes) // MIN_REPEATS + 1):
        needed = (MIN_REPEATS - 1) * length
        end = len(codes) if best is None else min(len(codes), best[0] + needed + length)
        sampled = codes[0:end - length:length] == codes[length:end:length]
        if sampled.sum() < MIN_REPEATS - 1 or true_runs(sampled)[1].max() < MIN_REPEATS - 1:
            continue
        starts, runs = true_runs(codes[:end - length] == codes[length:end])
        found = np.flatnonzero(runs >= needed)
        if found.size and (best is None or starts[found[0]] < best[0]):
            best = (int(starts[found[0]]), length)
            if best[0] == 0:
                break
    return best


def cut_repeated_lines(text: str) -> str:
    """One line making >= 80% of >= 10 non-empty lines (>= 10 times): cut after its first run
    of 3 copies in a row (consecutive non-empty lines)."""
    lines = [(m.end(), m.group().strip()) for m in re.finditer(r"[^\n]+", text) if m.group().strip()]
    if len(lines) < 10:
        return text
    counts: dict = {}
    for _, line in lines:
        counts[line] = counts.get(line, 0) + 1
    top, count = max(counts.items(), key=lambda item: item[1])
    if count < 10 or count < 0.8 * len(lines):
        return text
    for i in range(2, len(lines)):
        if lines[i][1] == lines[i - 1][1] == lines[i - 2][1] == top:
            return text[:lines[i][0]]
    return text


def cut_repetition(text: str) -> str:
    """The SDK's two cuts of a long answer: a repeated unit, else a repeated line."""
    if len(text) < LONG_ANSWER:
        return text
    unit = first_repeated_unit(text)
    if unit is not None:
        return text[:unit[0] + unit[1]]
    return cut_repeated_lines(text)


def tidy_inline_math(text: str) -> str:
    """`$ x $` becomes `$x$`, with a space between it and a letter it touches."""
    def tidy(match) -> str:
        inner = match.group(1).strip()
        if not inner:
            return match.group()
        before = match.string[match.start() - 1:match.start()]
        after = match.string[match.end():match.end() + 1]
        return (" " if before.isalpha() else "") + f"${inner}$" + (" " if after.isalpha() else "")
    return INLINE_MATH.sub(tidy, text)


def clean_answer(text: str) -> str:
    """The SDK's clean-up, in its order: edge tabs, leader runs, repetition cuts, inline math."""
    text = EDGE_TABS.sub("", text)
    for pattern, replacement in LEADERS:
        text = pattern.sub(replacement, text)
    return tidy_inline_math(cut_repetition(text))


def postprocess(text: str, args) -> tuple[str, dict]:
    return clean_answer(text), ({"raw": text} if args.keep_raw else {})


EXTRA_COLUMNS = {"raw": "string"}  # column suffix -> "blocks" or "string"


def inference_settings(args) -> dict:
    """What the inference_info entry and the card record about this model's settings."""
    low, high = frame_pixel_bounds()
    return {"task": args.task, "prompt": PROMPTS[args.task], "temperature": TEMPERATURE,
            "repetition_penalty": REPETITION_PENALTY, "max_tokens": args.max_tokens,
            "min_pixels": low, "max_pixels": high, "speculative_config": SPECULATIVE_CONFIG}
# ==== END GLM-OCR MODEL ====
