"""The DeepSeek-OCR model section shared by deepseek-ocr-server.py and deepseek-ocr2-server.py:
serve flags, request, the context budget and the grounding clean-up, which the two models share
(DeepSeek-OCR-2 keeps its predecessor's output format, n-gram logits processor and context).
Each script sets, above the block, what is its model's own: the prompts, the worst-case image
tokens and the n-gram arguments.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it. Its functions may call the grounding block's helpers
(imported below), which the script defines before they run.
"""

import re

from blocks.common.arguments import option, was_given
from blocks.grounding import block_box

# Set by each script above the block (placeholders here, for ruff and for tests that import it)
PROMPTS: dict[str, str] = {"document": "<|grounding|>Convert the document to markdown."}
DEFAULT_PROMPT_MODE = "document"
IMAGE_TOKENS_MAX = 0  # the model's worst-case image tokens
NGRAM_XARGS: dict = {}  # the n-gram logits processor's per-request arguments (vllm_xargs)

# ==== BEGIN DEEPSEEK-OCR MODEL (source: blocks/deepseek_ocr.py) ====
# Shared by the two DeepSeek-OCR scripts (edit the source, then run tools/sync_helpers.py). In a
# copy for a new model, delete this comment and the BEGIN and END lines: the part is its own.
# Each script sets PROMPTS, DEFAULT_PROMPT_MODE, IMAGE_TOKENS_MAX and NGRAM_XARGS above it.
MAX_MODEL_LEN = 8192
TEMPERATURE = 0.0
PROMPT_TEXT_TOKENS = 64
PAGE_FORMAT = "jpeg"  # pages that must be converted or resized: JPEG quality 95 (others go as is)
PREFIX_CACHING = False
LOGITS_PROCESSOR = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
# --repetition-detection (P, C): the n-gram processor already bars a repeated n-gram within its
# window (NGRAM_XARGS), so only its whitelisted <td></td> can loop at a period P covers
REPETITION_DETECTION = (4, 64)

SERVE_ARGS = [
    "--trust-remote-code",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--enable-prefix-caching" if PREFIX_CACHING else "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
    "--limit-mm-per-prompt", '{"image": 1}',
    "--logits-processors", LOGITS_PROCESSOR,  # last: it takes a list
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"


def spawn_args(args) -> list[str]:
    """Serve arguments known only when this script starts the server itself (none here)."""
    return []


def image_token_budget(args=None) -> int:
    """The largest page (IMAGE_TOKENS_MAX image tokens) and the text around it; a custom --prompt
    longer than the built-in ones adds its UTF-8 bytes (each token is at least one byte: an
    upper bound)."""
    extra = 0
    if args is not None and args.prompt:
        extra = max(0, len(args.prompt.encode()) - max(len(p.encode()) for p in PROMPTS.values()))
    return IMAGE_TOKENS_MAX + PROMPT_TEXT_TOKENS + extra


# The authors' scripts let a page run to the context (max_tokens 8192 on the V0 engine, which
# caps the output at the context); on V1 a request over the context is refused, so the default
# is the most that fits beside the largest page: 8192 - IMAGE_TOKENS_MAX - 64.
DEFAULT_MAX_TOKENS = MAX_MODEL_LEN - image_token_budget()
PDF_DPI = 144  # the authors' render DPI (pdf_to_images_high_quality(pdf_path, dpi=144))


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """No client-side resize: the model tiles the page itself."""
    return width, height


def model_argument_problems(args) -> list[str]:
    if args.prompt is not None and not args.prompt.strip():  # else the default ran unsaid
        return ["--prompt is empty: give the prompt's text, or leave --prompt out for "
                f"--prompt-mode's (default: {DEFAULT_PROMPT_MODE})"]
    if args.prompt is not None and was_given("prompt_mode"):  # else the mode was dropped unsaid
        return [f"--prompt and --prompt-mode {args.prompt_mode} both given: --prompt replaces "
                "the mode's prompt, so give one of them"]
    return []


def add_model_arguments(parser) -> None:
    option(parser, "--prompt-mode", choices=sorted(PROMPTS), default=DEFAULT_PROMPT_MODE,
           identity=True, help=f"which of the model's prompts (default: {DEFAULT_PROMPT_MODE})")
    option(parser, "--prompt", identity=True, help="a custom prompt instead of --prompt-mode's "
           "(not with it; without the <image> prefix); one longer than the built-in ones needs a "
           "lower --max-tokens, which the start-up check names")
    option(parser, "--keep-raw", identity=True, action="store_true",
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


# Spans are bounded (a label, a list of boxes), so a degenerate output cannot make them scan
# the whole text once per delimiter, and hold no other tag: a span whose closing tag is missing
# (cut off at max_tokens, or a slip) must not swallow the text up to the next span's. A label is
# one line; one that runs straight into its boxes counts as closed; unclosed boxes end with
# the box list: the text after it may begin with digits too.
LABEL = r"[^<\n]{0,500}?"
GROUNDED_SPAN = re.compile(rf"<\|ref\|>({LABEL})(?:<\|/ref\|>\s*)?<\|det\|>"
                           rf"((?:(?!<\|).){{0,5000}}?)<\|/det\|>", re.S)
REF_SPAN = re.compile(rf"<\|ref\|>{LABEL}(?:<\|/ref\|>|(?=<\|det\|>)|\Z)")
DET_SPAN = re.compile(r"<\|det\|>(?:(?:(?!<\|).){0,5000}?<\|/det\|>"
                      r"|\[[ \t]*(?:\[[-\d.,\s]*(?:\][ \t,]*)?)*\]?)", re.S)
STRAY_TAGS = re.compile(r"<\|/?(?:ref|det|grounding)\|>|<｜end▁of▁sentence｜>|<\|end▁of▁sentence\|>")


# The official post-processing's LaTeX mappings (github.com/deepseek-ai/DeepSeek-OCR and -OCR-2).
COLON_EQUALS = ((re.compile(r"\\coloneqq(?![A-Za-z])"), ":="), (re.compile(r"\\eqqcolon(?![A-Za-z])"), "=:"))


def official_latex(text: str) -> str:
    for pattern, replacement in COLON_EQUALS:
        text = pattern.sub(replacement, text)
    return text


def parse_grounded_blocks(raw: str) -> list[dict]:
    """Blocks from `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>text` spans: one
    block per box (0-999 space; a box out of range or incomplete is null); the text up to the
    next span belongs to the first box. Never raises."""
    blocks = []
    spans = list(GROUNDED_SPAN.finditer(raw))
    for i, span in enumerate(spans):
        end = spans[i + 1].start() if i + 1 < len(spans) else len(raw)
        text = clean_markdown(raw[span.end():end])  # a cut-off span after it is no text
        boxes = [block_box(inner.split(","), 999)  # one [x1, y1, x2, y2] each; else null
                 for inner in re.findall(r"\[([^\[\]]*)\]", span.group(2))] or [None]
        for k, box in enumerate(boxes):
            blocks.append({"label": span.group(1).strip(), "box": box, "text": text if k == 0 else ""})
    return blocks


def figure_placeholders(raw: str) -> str:
    """Each `image` span becomes `![](images/N.jpg)` and a newline, N counting the page's
    figures from 0, as the authors' clean-up does it (github.com/deepseek-ai/DeepSeek-OCR,
    DeepSeek-OCR-master/DeepSeek-OCR-vllm/run_dpsk_ocr_image.py; DeepSeek-OCR-2's scripts
    alike): the figure's place stays in the Markdown, and its box is in the blocks column."""
    import itertools

    figures = itertools.count()
    return GROUNDED_SPAN.sub(lambda span: f"![](images/{next(figures)}.jpg)\n"
                             if span.group(1) == "image" else span.group(), raw)


def clean_markdown(raw: str) -> str:
    """Figure spans to placeholders, then whole ref spans, then det spans, then stray
    delimiters: removing only the delimiters would leave the labels behind as fake words."""
    text = REF_SPAN.sub("", figure_placeholders(raw))
    text = DET_SPAN.sub("", text)
    text = STRAY_TAGS.sub("", text)
    return official_latex(re.sub(r"\n{3,}", "\n\n", text).strip())


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
# ==== END DEEPSEEK-OCR MODEL ====
