"""The PaddleOCR-VL model section of paddleocr-vl-server.py: its task prompts, the pixel bounds
sent with each request, the serve flags, and the OTSL-to-HTML clean-up of its tables.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the script that carries it. Its functions call the PATCH GRID HELPERS block
(imported below), which the script carries too and defines before they run.
"""

import html
import re

from blocks.common.arguments import option
from blocks.patch_grid import max_patch_grid_tokens, snap_to_patch_grid

# ==== BEGIN PADDLEOCR-VL MODEL (source: blocks/paddleocr_vl.py) ====
# The model section of paddleocr-vl-server.py (edit the source, then run tools/sync_helpers.py).
# The task prompts, character for character (MODEL-FACTS, PaddleOCR-VL, "Prompts"; the image
# comes first, then the text, nothing else). `spotting` and `seal` are left out until their
# output format is documented here.
TASKS = {
    "ocr": "OCR:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
    "chart": "Chart Recognition:",
}
DEFAULT_TASK = "ocr"
KEPT_AS_WRITTEN = {"chart"}  # answers whose format is not documented here: no clean-up at all

MAX_MODEL_LEN = 16384  # the vendor's own server (the recipe sets none; config context 131,072)
DEFAULT_MAX_TOKENS = 8192  # the predictor's fallback: a whole page is many of the pipeline's blocks
TEMPERATURE = 0.0
# The pipeline's bounds for every task but spotting, sent with each request as it sends them
MIN_PIXELS = 112896  # 336 x 336
MAX_PIXELS = 1003520  # 1280 * 28 * 28: at most 1,280 image tokens
PATCH_GRID = 28  # 14 px patches merged 2 x 2: one image token per 28 x 28 px
PROMPT_TEXT_TOKENS = 64  # generous bound on the chat template and the task text around the image
PAGE_FORMAT = "jpeg"  # the pipeline sends JPEG data URLs
PREFIX_CACHING = False

# The recipe's serve command (identical for v1, 1.5 and 1.6), plus a context the check at
# start can count on and one image per prompt (the recurring OCR flags)
SERVE_ARGS = [
    "--trust-remote-code",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--max-num-batched-tokens", "16384",
    "--enable-prefix-caching" if PREFIX_CACHING else "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
    "--limit-mm-per-prompt", '{"image": 1}',
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"

MODEL_CARD_NOTE = (
    "**Layout stage not included.** This run sent each whole page to the VLM with one task "
    "prompt (the pipeline's layout-off mode). PaddleOCR-VL's published scores come from the "
    "PaddleX pipeline, which first detects and orders regions with PP-DocLayoutV3 and sends "
    "each crop with the prompt of its kind; vLLM's recipe warns: \"Typically, we also need to "
    "integrate the PP-DocLayoutV2 model to fully unleash the capabilities of the PaddleOCR-VL "
    "model\" (vllm-project/recipes, PaddlePaddle/PaddleOCR-VL.md). Licence: Apache-2.0 on the "
    "v1 model card; for 1.6 it is repeated only by third parties."
)


# vLLM 0.32 refuses per-request mm_processor_kwargs (HTTP 400 on every page) unless the server
# trusts them; 0.30.0, this script's image, has no such flag and would not start with it.
# (0.31 was not checked: it gets no flag.)
TRUST_REQUEST_BOUNDS = "--trust-request-mm-kwargs"
TRUST_REQUEST_BOUNDS_FROM = (0, 32)


def spawn_args(args) -> list[str]:
    """The flag that lets the per-request bounds through, where the local vLLM needs it."""
    if TRUST_REQUEST_BOUNDS in (args.serve_args or ""):
        return []
    version = local_vllm_version()
    return [TRUST_REQUEST_BOUNDS] if version and version >= TRUST_REQUEST_BOUNDS_FROM else []


def local_vllm_version() -> tuple[int, int] | None:
    """(major, minor) of the vllm that the `vllm` command runs, read from its package metadata
    by that command's own interpreter (its #! line; vllm is not imported); None if unknown."""
    import shutil
    import subprocess

    try:
        with open(shutil.which("vllm") or "", "rb") as command:
            first_line = command.readline(4096)
        if not first_line.startswith(b"#!") or b"python" not in first_line:
            return None
        probe = subprocess.run([*first_line[2:].decode().split(), "-c",
                                "import importlib.metadata as m; print(m.version('vllm'))"],
                               capture_output=True, text=True, timeout=120)
    except (OSError, UnicodeDecodeError, subprocess.SubprocessError):
        return None
    found = re.match(r"(\d+)\.(\d+)", probe.stdout.strip())
    return (int(found[1]), int(found[2])) if found else None


def image_token_budget(args=None) -> int:
    """Worst-case prompt tokens of one page: the largest image plus the text around it."""
    return max_patch_grid_tokens(MAX_PIXELS, PATCH_GRID) + PROMPT_TEXT_TOKENS


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """The processor's own size for the page under the bounds this script sends: the server
    then does not resample it again."""
    return snap_to_patch_grid(width, height, PATCH_GRID, MIN_PIXELS, MAX_PIXELS)


def model_argument_problems(args) -> list[str]:
    return []  # no option of this model's depends on another


def add_model_arguments(parser) -> None:
    option(
        parser, "--task", identity=True, choices=list(TASKS), default=DEFAULT_TASK,
        help=f"the model's task prompt for the whole page (default: {DEFAULT_TASK}): "
             + ", ".join(f"{k} '{v}'" for k, v in TASKS.items())
             + "; chart answers are kept as written (their format is not documented here); "
               "the model's spotting and seal tasks are left out until theirs is")
    option(parser, "--keep-raw", identity=True, action="store_true",
           help="also keep the model's answer as written (OTSL and all) in <column>_raw")


def build_request(image_url: str, args) -> dict:
    """The image, then the task prompt; greedy; the pixel bounds as the pipeline sends them
    (its `extra_body`, which the OpenAI client merges into the request body)."""
    return {
        "messages": [{
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": TASKS[args.task]},
            ],
        }],
        "temperature": TEMPERATURE,
        "max_tokens": args.max_tokens,
        "mm_processor_kwargs": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS},
    }


# OTSL, the model's table language (MODEL-FACTS, PaddleOCR-VL, "What the layout stage adds"):
# six tags; the meanings are OTSL's own (Lysak et al. 2023): a cell with text, an empty cell,
# a cell merged with the one on its left, with the one above, with both, and the end of a row.
OTSL_TAG = re.compile(r"<(fcel|ecel|lcel|ucel|xcel|nl)>")
ORIGINS = {"fcel", "ecel"}  # the cells that start a table cell; the other three extend one


def otsl_runs(text: str) -> list[tuple[int, int]]:
    """(start, end) of each table written in OTSL inside the text: tags with no blank line
    between them, from the first tag to the last row end (or, for a table cut short, to the
    end of the line its last cell is on). Text after a row end belongs to no cell: it ends the
    table."""
    runs, tags = [], list(OTSL_TAG.finditer(text))
    group: list = []
    for tag in tags + [None]:
        gap = text[group[-1].end():tag.start()] if group and tag else ""
        if group and (tag is None or "\n\n" in gap or group[-1].group(1) == "nl" and gap.strip()):
            runs.append((group[0].start(), run_end(text, group[-1])))
            group = []
        if tag is not None:
            group.append(tag)
    return runs


def run_end(text: str, last_tag) -> int:
    """A table ends with its last row end; one cut short, with the line of its last cell."""
    if last_tag.group(1) == "nl":
        return last_tag.end()
    line_end = text.find("\n", last_tag.end())
    return len(text) if line_end < 0 else line_end


def otsl_rows(otsl: str) -> list[list[tuple[str, str]]]:
    """Rows of (tag, text) cells; a cell's text runs to the next tag."""
    rows, row = [], []
    parts = OTSL_TAG.split(otsl)  # [before, tag, text, tag, text, ...]
    for tag, cell_text in zip(parts[1::2], parts[2::2]):
        if tag == "nl":
            rows.append(row)
            row = []
        else:
            row.append((tag, cell_text.strip()))
    if row:  # a table cut before its last row ended
        rows.append(row)
    return [r for r in rows if r]


def span_of(grid: list[list[str]], r: int, c: int) -> tuple[int, int]:
    """(rows, columns) of the cell that starts at r, c: left-merges to its right, up-merges
    below it."""
    cols = 1
    while c + cols < len(grid[r]) and grid[r][c + cols] == "lcel":
        cols += 1
    rows = 1
    while r + rows < len(grid) and c < len(grid[r + rows]) and grid[r + rows][c] == "ucel":
        rows += 1
    return rows, cols


def otsl_to_html(otsl: str) -> str:
    """One OTSL table as an HTML table ("" when it holds no cell). A merge with nothing to merge
    into (a malformed or cut table) becomes a cell of its own, so no text is lost."""
    rows = otsl_rows(otsl)
    grid = [[tag for tag, _ in row] for row in rows]
    covered: set = set()
    html_rows = []
    for r, row in enumerate(rows):
        cells = []
        for c, (tag, text) in enumerate(row):
            if (r, c) in covered:
                continue
            rowspan, colspan = span_of(grid, r, c) if tag in ORIGINS else (1, 1)
            covered.update((r + i, c + j) for i in range(rowspan) for j in range(colspan))
            attrs = (f' rowspan="{rowspan}"' if rowspan > 1 else "") + \
                (f' colspan="{colspan}"' if colspan > 1 else "")
            cells.append(f"<td{attrs}>{html.escape(text, quote=False)}</td>")
        html_rows.append("<tr>" + "".join(cells) + "</tr>")
    if not any(tag in ORIGINS for row in grid for tag in row):
        return ""
    return "<table>" + "".join(html_rows) + "</table>"


def convert_otsl(text: str) -> str:
    """Every OTSL table in the answer as HTML; one whose conversion yields nothing stays as
    the model wrote it."""
    pieces, done = [], 0
    for start, end in otsl_runs(text):
        html = otsl_to_html(text[start:end])
        pieces += [text[done:start], html or text[start:end]]
        done = end
    return "".join(pieces) + text[done:]


def postprocess(text: str, args) -> tuple[str, dict]:
    extras = {"raw": text} if args.keep_raw else {}
    if args.task in KEPT_AS_WRITTEN:
        return text, extras
    return convert_otsl(text).strip(), extras


EXTRA_COLUMNS = {"raw": "string"}  # column suffix -> "blocks" or "string"


def inference_settings(args) -> dict:
    return {"task": args.task, "prompt": TASKS[args.task], "temperature": TEMPERATURE,
            "max_tokens": args.max_tokens,
            "mm_processor_kwargs": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}}
# ==== END PADDLEOCR-VL MODEL ====
