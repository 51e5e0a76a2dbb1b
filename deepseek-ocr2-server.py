# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "datasets>=3.0",
#     "huggingface_hub>=0.34",
#     "pillow>=10.4",
#     "pypdfium2>=4.30",
#     "httpx>=0.27",
#     "tqdm>=4.66",
# ]
#
# [tool.hf-jobs]
# image = "vllm/vllm-openai:v0.26.0"
# flavor = "l4x1"
# timeout = "4h"
# secrets = ["HF_TOKEN"]
# ///
"""OCR a dataset of page images or PDFs with deepseek-ai/DeepSeek-OCR-2 through a vLLM server.

Every page becomes clean Markdown in a new column, and with the grounding prompt (the default)
a blocks column gives the layout: label, box (0-999 on both axes) and text of every block.
The driver has no torch or vllm dependency: it keeps `--concurrency` pages in flight against
a vLLM OpenAI-compatible server, which it starts itself when none answers. DeepSeek-OCR-2
(about 3B, Apache-2.0) replaces DeepSeek-OCR's vision encoder (DeepEncoder V2, Qwen2-based,
which reorders the visual tokens) and keeps its output format, its n-gram logits processor and
its 8192-token context: the serve flags, the request and the clean-up are the DEEPSEEK-OCR
MODEL part this script shares with deepseek-ocr-server.py.

Run it
    hf jobs uv run --image vllm/vllm-openai:v0.26.0 --flavor l4x1 --timeout 4h --secrets HF_TOKEN \\
        deepseek-ocr2-server.py user/scans user/scans-ocr
    # no page rate was measured for this model on Jobs: give a large input more time
    # (--timeout) or split it (--num-shards); Jobs stop a job after 30 min unless told
    uv run deepseek-ocr2-server.py ./scans ./scans-ocr                 # GPU machine with vllm
    uv run deepseek-ocr2-server.py user/scans ./out --server http://gpu-box:8000

Prompt modes (`--prompt-mode`, or `--prompt TEXT` for your own)
    document  <|grounding|>Convert the document to markdown.   (default)
    free      Free OCR.
    The model's README lists these two only (DeepSeek-OCR listed five). `document` is the
    default: its grounding spans give the page layout, and the Markdown column is cleaned of
    them; `free` gives text only (no blocks column content).
    No trailing space: the authors' vLLM config (DeepSeek-OCR2-vllm/config.py), the README's
    prompt list and the recipe's chat example end on the full stop; only the transformers
    example and the recipe's offline example add a space. A server is what this script talks
    to, so it follows the authors' vLLM scripts.

Where the settings come from (the authors' vLLM scripts, github.com/deepseek-ai/DeepSeek-OCR-2,
and vLLM's DeepSeek-OCR-2 recipe)
    Serve: as the recipe: the n-gram logits processor of DeepSeek-OCR's module (last on the
    line: it takes a list), no prefix caching, no multimodal processor cache, remote code on
    (the recipe's yaml); context 8192 (the authors' max_model_len); one image per prompt.
    Per request: temperature 0, `skip_special_tokens: false` (the grounding tags are special
    tokens), and the processor's arguments in `vllm_xargs`: n-gram 40, window 90, whitelist
    [128821, 128822] (`<td>`, `</td>`). The sources disagree on the n-gram: the authors'
    PDF script 20/50, their image script 20/90, their OmniDocBench script 40/90, the recipe
    30/90 (copied from DeepSeek-OCR's page). This script takes 40/90, the setting behind the
    published score (OmniDocBench v1.5 91.09): its output is the one those figures describe,
    and it bars only a 40-token repeat, so long tables and forms that legitimately repeat
    shorter runs are cut less often; a page that still loops runs into --repetition-detection
    and the loop retry.
    Image budget: one dynamic resolution mode (DeepSeek-OCR's Tiny to Gundam modes are gone):
    a 1024x1024 global view (256 tokens), plus, when either side exceeds 768 px, 2 to 6 local
    768x768 crops of 144 tokens each, and one separator: at most 256 + 6 x 144 + 1 = 1,121
    image tokens (vLLM's deepseek_ocr2.py counts it so; the paper says 256 to 1,120).
    max_tokens 7007, the most the context allows: the authors' scripts let a page run to the
    8192-token context (max_tokens 8192 on vLLM's V0 engine); on the V1 engine a request
    over the context is refused with 400, so the budget is 8192 minus the largest page's
    prompt (1,121 image tokens and 64 for the text; a longer `--prompt` needs a lower
    `--max-tokens`, which the start-up check names). The recipe's online example uses 2048.
    Post-processing, as the authors' clean-up does it: each `image` grounding span becomes a
    placeholder `![](images/N.jpg)` (N counting the page's figures from 0; the authors' PDF
    script also prefixes the page number, a row here is one page), so a figure's place stays
    in the Markdown, its box in the blocks column; the other spans are removed whole;
    `\\coloneqq` becomes `:=` and `\\eqqcolon` `=:`; three or more newlines become two. The
    authors drop a page that ends without its end-of-sentence token (`SKIP_REPEAT`); here it
    is kept, and its finish reason (`length`) says so. Boxes outside 0-999 are kept as null.
    Images are sent as RGB at their own size: the model tiles them itself. PDF pages are
    rendered at the authors' 144 DPI (`--pdf-dpi`).
    Image tag v0.26.0: its model registry has DeepseekOCR2ForCausalLM (checked in the
    release's own registry by the tests), with the same image-token count and the same
    n-gram processor; it is the tag deepseek-ocr-server.py ran 2,165 pages on, with the V1
    model runner that old-style logits processors like this one need. The first release
    that registers the model is not established (0.15.1 did not; 0.16.0 likely). Flavor
    l4x1: the recipe asks for 8 GB of GPU memory or more, and a reference run did 10 of 10
    pages on l4x1.
"""

# ==== MAP (written by tools/sync_helpers.py) ====
# Its parts (edit a block in its source, then run the assembler):
#   model section  L122
#   DEEPSEEK-OCR MODEL  blocks/deepseek_ocr.py  L144-313
#   SERVER MAIN  blocks/main_server.py  L316-344
#   main()  L317
#   COMMON HELPERS  blocks/common/  L347-3281
#     model_options.py L377  errors.py L393         secrets.py L428
#     inputs.py L526         pages.py L885          pdf.py L1064
#     loops.py L1343         rows.py L1454          plan.py L1547
#     store.py L1684         saving.py L2048        manifest.py L2350
#     stats.py L2516         jobs_command.py L2598  card.py L2719
#     arguments.py L2869     run.py L3035
#   BLANK PAGE HELPERS  blocks/blank_page.py  L3284-3355
#   GROUNDING HELPERS  blocks/grounding.py  L3358-3369
#   SERVER HELPERS  blocks/server/  L3372-4124
#     serve_args.py L3386  process.py L3463     requests.py L3757
#     pipeline.py L3870    arguments.py L4073
# A page's path, by the functions that take it:
#   cell           iter_image_cells L870
#   prepared page  read_page L1532, prepare_page L994
#   request        request_body L3775
#   answer         send_page L3823, read_completion L3803
#   finished row   finish_row L2082
#   journal        Journal.append L1573
#   part           write_part L2178
#   commit         OutputStore.publish L1943, OutputStore.commit L1962
#   card           build_card L2791
# ==== END MAP ====

import re

# ============================================================================================
# Model section: the only part that differs between scripts. To adapt this script to another
# model, edit this section (and models.json); leave the helper blocks below untouched.
# ============================================================================================

MODEL_ID = "deepseek-ai/DeepSeek-OCR-2"
IMAGE_TAG = "v0.26.0"  # its registry has DeepseekOCR2ForCausalLM (see the docstring)
JOB_IMAGE = f"vllm/vllm-openai:{IMAGE_TAG}"
IMAGE_HAS_UV = True  # the vLLM images have uv: ocr-jobs.py submits with run_uv_job
SCRIPT_SHAPE = "server"

PROMPTS = {  # the README's "Main Prompts" and config.py, without the <image> prefix
    "document": "<|grounding|>Convert the document to markdown.",
    "free": "Free OCR.",
}
DEFAULT_PROMPT_MODE = "document"

# One dynamic mode: a 1024 px global view (256 tokens), 0 or 2-6 crops of 768 px (144 each),
# one separator; vLLM's processor caps the crops at 6
IMAGE_TOKENS_MAX = 256 + 6 * 144 + 1
# the authors' OmniDocBench settings (run_dpsk_ocr2_eval_batch.py); see the docstring
NGRAM_XARGS = {"ngram_size": 40, "window_size": 90, "whitelist_token_ids": [128821, 128822]}

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


# ==== BEGIN SERVER MAIN (edit blocks/main_server.py, then run tools/sync_helpers.py) ====
def main(argv: list[str] | None = None, hub_api=None) -> int:
    """One run, step by step in the failure policy's order: every check before a side effect."""
    window_type = Window  # pages in flight: a fixed window (-saturate.py: AdaptiveWindow)
    args = parse_arguments(__doc__, argv, lambda parser: add_server_arguments(parser, window_type),
                           server_argument_problems)
    serve_args = effective_serve_args(args)
    server = ServerManager(args, Path("."), window_type)
    run = Run(args, serve_settings(serve_args),
              inference_info_entry(args, None, serve_args=redact_argv(serve_args)))
    with any_stop_said(run):  # what stops a step is said, and is the exit code
        if args.check_only:  # a Job's own server: its context checked, nothing asked
            check_context_budget(serve_max_model_len(args), args)
        else:  # a server to use or wait for, else `vllm` here to start one
            run_async(server.plan(), run.interrupts)
        open_output_and_input(run, hub_api)
        claim_run_output(run)
        if args.check_only:
            return report_check(run)
        plan_run(run)
        if run.plan.send:  # the server started if planned, then the window kept full
            run_async(run_server_pipeline(run, args, server, window_type(args, run)),
                      run.interrupts)
    if run.writer is None:  # stopped before the plan: no trace of this run is left
        return run.exit_code
    save_rows(run, stop_engine=server.stop)  # whatever stopped the run
    write_card(run)
    return finish_run(run)
# ==== END SERVER MAIN ====


# ==== BEGIN COMMON HELPERS (edit blocks/common/, then run tools/sync_helpers.py) ====
# The imports of all the block's modules (ruff checks them on every script).
import argparse
import contextlib
import ctypes
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import queue
import random
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path


# ---- model_options.py: The model section's optional names, with the defaults used where it sets none.
# The model section above provides what blocks/model.py lists, and may set these:
MODEL_REVISION = globals().get("MODEL_REVISION")  # a commit sha or tag pins the weights
RESIZE_FILTER = globals().get("RESIZE_FILTER", "bicubic")  # the model's own resampling filter
LOOP_TEMPERATURE = globals().get("LOOP_TEMPERATURE", 0.3)  # a looping page's second try
IMAGE_TAG_MOVING = globals().get("IMAGE_TAG_MOVING", False)  # True: JOB_IMAGE is no fixed build
PDF_DPI = globals().get("PDF_DPI", 400)  # a PDF page's render DPI, unless the model's bound is less
REPETITION_DETECTION = globals().get("REPETITION_DETECTION", (32, 64))  # --repetition-detection
REPETITION_DETECTION_ON = globals().get("REPETITION_DETECTION_ON", False)  # its default
REPETITION_DETECTION_NOTE = globals().get("REPETITION_DETECTION_NOTE", "")  # the card's, when on
MODEL_CARD_NOTE = globals().get("MODEL_CARD_NOTE", "")  # Markdown the card must say of the model
POSTPROCESS_GETS_SIZE = globals().get("POSTPROCESS_GETS_SIZE", False)  # postprocess(.., sent size)
IMAGE_HAS_UV = globals().get("IMAGE_HAS_UV", True)  # False: Jobs run it with `hf jobs run`
JOB_PAGES_PER_S = globals().get("JOB_PAGES_PER_S")  # pages/s measured on the header's flavor


# ---- errors.py: How the run speaks and stops: log lines, exit codes, page and run errors.
EXIT_USAGE, EXIT_DEGENERATE, EXIT_REFUSED, EXIT_NOT_WRITTEN, EXIT_NOT_UPLOADED = 2, 3, 4, 5, 6
EXIT_CODES = """exit codes (the first that applies):
  0    every pending row was written where OUTPUT says (error rows included)
  2    usage error, or a rerun that is refused
  3    degenerate output: the first pages all came back empty or looping (nothing written)
  4    the server or engine refused the run (API key, model gone, engine dead or out of
       memory, every page failing); finished rows kept, a rerun sends the rest
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM; finished rows saved first
  5    some rows were not written (see the log); rerun the same command to finish them
  6    every row is written locally, but some files did not reach the Hub"""


def log(message: str) -> None:
    """Every line this script prints, its secrets masked (redact_text)."""
    print(redact_text(message), file=sys.stderr, flush=True)


def fail(message: str, code: int = EXIT_USAGE) -> "NoReturn":  # noqa: F821
    log(f"error: {message}")
    raise SystemExit(code)


class PageError(Exception):
    """A row that cannot be OCR'd: it becomes an error row, the run goes on."""


class RunAborted(Exception):
    """The run cannot go on (degenerate output, server gone); finished rows are kept."""

    def __init__(self, message: str, code: int = EXIT_NOT_WRITTEN):
        super().__init__(message)
        self.code = code


# ---- secrets.py: Secrets: which values are secrets, and their masks in logs, argv and records.
# Hub tokens, OpenAI-style keys (not a name: "hf_overrides", "org/sk-model"); a URL's user
# information; a value under a name: name=value, or 'name': 'value' (JSON, a dict)
TOKEN_VALUE = re.compile(r"(?<!/)\b(?:hf_|api_org_|sk-)[A-Za-z0-9_-]{8,}(?![\w-]|['\"]\s*:|\s*=|/)")
URL_USERINFO = re.compile(r"(?<=://)[^/\s@?#]+@")
NAMED_VALUE = re.compile(r"""((?<![\w.-])(['"])?([\w.-]+)(?(2)\2\s*:\s*|=)(['"])?)"""
                         r"""((?(4)(?:\\.|(?!\4)[^\\\n])+|[^\s&#'",}]+))""")  # quoted: to its end
# names whose value is a secret: options (--hf-token, --a.b.secret-key), JSON keys, URL queries
SECRET_NAME = re.compile(r"(?:^|[-_.])(?:secret|password|passwd)(?:[-_.]|$)|(?:^|[-_.])(?:token|"
                         r"credentials?|signature|sig|authorization|(?:api|access|private)[-_]?key)"
                         r"$|^-*key$", re.I)
# a word of a command line that is a flag (--x, -x, --x=...), not a value (-1, -, "--x y")
FLAG = re.compile(r"^--?[A-Za-z][^\s=]*(?:=|$)")


def is_secret(name, value=None) -> bool:
    """Whether a value under this name (option, JSON key, URL query) is a secret: not if empty."""
    return bool(SECRET_NAME.search(str(name))) and value not in (True, False, "", [], {})


def redact_text(text: str, known=()) -> str:
    """Text with its secrets masked: those known, token-like values, a URL's user, named ones."""
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = URL_USERINFO.sub("***@", TOKEN_VALUE.sub("***", text))
    return NAMED_VALUE.sub(lambda m: m[1] + "***" if is_secret(m[3], m[5]) else m[0], text)


def redact_value(value, mask: str | None = "***"):
    """A JSON-like value (or JSON text) with its secrets masked at every depth, or dropped."""
    if isinstance(value, dict):
        return {k: mask if is_secret(k, v) else redact_value(v, mask) for k, v in value.items()
                if mask is not None or not is_secret(k, v)}
    if isinstance(value, list):
        return [redact_value(v, mask) for v in value]
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):  # JSON text: its named secrets too
            parsed = json.loads(value)
            redacted = redact_value(parsed, mask)
            return value if redacted == parsed else json.dumps(redacted)
    return redact_text(value) if isinstance(value, str) else value


def secret_literals(value, secret: bool = False) -> set[str]:
    """The secrets in a value (JSON at every depth): what a server's log must not show."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if isinstance(value, (dict, list)):  # a list's indexes are no secret's name
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        return set().union(*(secret_literals(v, secret or is_secret(k, v)) for k, v in pairs))
    text = str(value)
    return ({text} if secret and len(text) >= 4 else set()) | set(TOKEN_VALUE.findall(text))


def flag_items(argv: list[str]) -> list[tuple[str | None, list[str], bool]]:
    """A command line as (flag, values, joined) items; vLLM's lists take several values."""
    items = []
    for word in argv:
        flag, values, joined = items[-1] if items else (None, [], True)
        if flag and not joined and not FLAG.match(word) and not flag.startswith("--no-"):
            values.append(word)
        elif FLAG.match(word):
            name, eq, value = word.partition("=")
            items.append((name, [value] if eq else [], bool(eq)))
        else:
            items.append((None, [word], False))
    return items


def flag_words(items) -> list[str]:
    """flag_items' items back as a command line."""
    return [word for name, values, joined in items for word in (
        [f"{name}={values[0]}"] if joined else [name, *values] if name else values)]


def redact_argv(argv: list[str], mask: str | None = "***", left_out: list | None = None
                ) -> list[str]:
    """A command line with its secrets masked, or dropped (left_out: the options that held one)."""
    def redacted(name: str | None, value: str) -> str:
        if name == "--serve-args":
            with contextlib.suppress(ValueError):  # unbalanced quotes: redacted as text
                words = shlex.split(value)
                kept = redact_argv(words, mask)
                return value if kept == words else shlex.join(kept)
        return redact_value(value, mask)

    items = []
    for name, values, joined in flag_items(argv):
        secret = is_secret(name or "", values)
        kept = [mask] * len(values) if secret else [redacted(name, v) for v in values]
        if name and kept != values and left_out is not None:
            left_out.append(name)
        if not secret or mask is not None:
            items.append((name, kept, joined))
    return flag_words(items)


# ---- inputs.py: The input: which files or Hub rows are the pages, opened as one dataset.
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def script_name() -> str:
    """This script's file name, also as uv's temp copy for `uv run URL` (<stem> + 6 chars)."""
    path = Path(sys.argv[0])
    copy = path.resolve().parent == Path(tempfile.gettempdir()).resolve() and re.fullmatch(
        r".+(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{6}\.py", path.name)
    return path.name[:-9] + ".py" if copy else path.name


def is_local_target(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().is_dir()


def resolve_output(value: str) -> tuple[str, str]:
    """('local', path) or ('hub', repo_id); anything else exits 2 saying how to write a path."""
    if is_local_target(value):
        path = Path(value).expanduser().resolve()
        try:
            existing = next(p for p in (path, *path.parents) if p.exists())
        except OSError as exc:  # a name too long, a parent one may not enter
            fail(f"OUTPUT {value!r} cannot be used: {exc.strerror}: choose another folder")
        if not existing.is_dir():  # else found at the first write, after the server's start
            fail(f"OUTPUT {value!r}: {existing} is a file, and OUTPUT is a folder: choose a "
                 f"folder's path, e.g. {existing}-ocr")
        return "local", str(path)
    if REPO_ID.match(value):
        return "hub", value
    fail(f"OUTPUT {value!r} is neither a Hub dataset id (namespace/name) nor a local path: "
         f"write ./{value} for a local folder")


def requested_revision(args) -> str | None:
    """--model-revision, else the model section's pin (which applies to its own model only)."""
    return args.model_revision or (MODEL_REVISION if args.model == MODEL_ID else None)


def hub_commit_sha(model: str, revision: str | None, token: str | None) -> str | None:
    from huggingface_hub import HfApi

    return HfApi(token=token).model_info(model, revision=revision, timeout=10).sha


_RESOLVED_REVISIONS: dict = {}


def resolved_revision(args) -> str | None:
    """The commit sha of the weights loaded, asked once; None for a folder or an unreachable Hub."""
    requested = requested_revision(args)
    key = (args.model, requested)
    if key not in _RESOLVED_REVISIONS:
        sha = requested if requested and re.fullmatch(r"[0-9a-f]{40}", requested) else None
        if not sha and not Path(args.model).expanduser().exists():
            with contextlib.suppress(Exception):  # offline, gated, a typo: the run will say
                sha = hub_commit_sha(args.model, requested, getattr(args, "hf_token", None) or None)
        _RESOLVED_REVISIONS[key] = sha
    return _RESOLVED_REVISIONS[key]


@dataclass
class InputSource:
    dataset: object  # datasets.Dataset, image column not decoded, rows in run order
    image_column: str
    description: str
    lo: int  # this shard's output rows are [lo, hi): input rows, or PDF pages
    hi: int
    rows_full: int = 0  # before --shuffle and --max-samples
    pdf: object = None  # PdfPages: output row i is a page of input row pdf.doc[i]
    files: list | None = None  # a local INPUT's files that are read (the run's identity)


TABLE_EXTENSIONS = {".parquet", ".arrow"}  # a folder of these is read by `datasets` itself
METADATA_NAMES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")  # as imagefolder's
_PATH_BASE: list = []  # INPUT's folder, where relative path strings in the image column point
_HUB_FILES: list = []  # a Hub INPUT: the folder of the files `datasets` downloaded for it
_TEXT_LAYER_COLUMNS: list = []  # ["text_layer"] when this run writes a PDF page's text layer


def shown_path(path) -> str:
    """A path as valid text: a name that is not UTF-8 shows its bytes as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _by_datasets(what: str, read, *args, **kwargs):
    """What `datasets` reads, else its own message in one line (lists as words) and exit 2."""
    try:
        return read(*args, **kwargs)
    except Exception as exc:  # a typo, a missing split or config, gated, offline, unreadable
        said = str(exc).split("\nExample")[0] + (f" ({exc.__cause__})" if exc.__cause__ else "")
        said = re.sub(r"\[([^\]]*)\]", lambda m: m[1].replace("'", ""), said)
        fail(f"cannot read {what}: {type(exc).__name__}: {' '.join(said.split())}")


def _split_of(splits: dict, what: str, args, configs: bool = False):
    """splits[--split] (default: a lone split); an unhonoured --split or --config fails."""
    lone = next(iter(splits)) if len(splits) == 1 else None
    split = lone if lone and args.split == "train" else args.split
    if not configs and args.config not in (None, "", "default"):
        fail(f"INPUT {what} cannot honour --config {args.config} (it has no configs): leave it out")
    if split not in splits:
        fail(f"INPUT {what} cannot honour --split {split} " + (f"(its one split is {lone})" if lone
             else f"(it has: {', '.join(splits) or 'none'})"))
    return splits[split]


def check_output_outside_input(args) -> None:
    """Refused up front: a local OUTPUT and INPUT that hold each other, OUTPUT the Hub INPUT."""
    if args.output.lower() == args.input.lower() and not is_local_target(args.output):
        fail(f"OUTPUT must not be INPUT {args.output}: write to e.g. {args.output}-ocr")
    source = Path(args.input).expanduser()
    if not source.exists() or not is_local_target(args.output):
        return
    source, target = source.resolve(), Path(args.output).expanduser().resolve()
    if target in source.parents:  # load_dataset(OUTPUT) would read INPUT as output rows
        fail(f"INPUT must not be inside OUTPUT {target}: write to e.g. {target}-ocr")
    if source.is_dir() and (target == source or source in target.parents):
        fail(f"OUTPUT must not be INPUT or inside INPUT {source}: write to e.g. {source}-ocr")


def image_extensions() -> set[str]:
    """The image extensions `datasets`' imagefolder reads (.jfif, .ppm...), so none is left out."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return {extension.lower() for extension in ImageFolder.EXTENSIONS}


def _walk_folder(root: Path, args) -> list[Path]:
    """Every file under root, sorted: symlinks followed, each real folder once, no hidden names."""
    seen = {os.path.realpath(root), os.path.realpath(Path(args.output).expanduser())}
    files = []
    for folder, dirs, names in os.walk(root, followlinks=True, onerror=lambda exc: fail(
            f"cannot read the folder {exc.filename} of INPUT: {exc.strerror or exc}")):
        reals = [os.path.realpath(os.path.join(folder, name)) for name in dirs]
        dirs[:] = [name for name, real in sorted(zip(dirs, reals))  # set.add gives None: kept
                   if not (name.startswith(".") or real in seen or seen.add(real))]
        files += [Path(folder, name) for name in names if not name.startswith(".")]
    return sorted(files)


def _read_metadata(root: Path, metadata_files: list[Path], relative: list[str]):
    """imagefolder's metadata as one row per image (the first naming it counts; else empty)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    tables, keys, ours = [], [], ["image", "pdf", *PDF_COLUMNS]
    try:  # a file pyarrow cannot read, or whose columns do not match the others'
        for path in metadata_files:
            table = pads.dataset(str(path), format=path.suffix[1:].replace("jsonl", "json"))
            table = table.to_table()
            clash = [name for name in ours if name in table.column_names]
            if "file_name" not in table.column_names or clash:
                fail(f"the metadata file {path} needs a file_name column, and none this script "
                     f"writes itself ({', '.join(clash or ours)}; columns: "
                     f"{', '.join(table.column_names)}): rename, or move it out of INPUT")
            base = path.parent.relative_to(root).as_posix()
            keys += [name and os.path.normpath(f"{base}/{name}")
                     for name in table["file_name"].cast(pa.string()).to_pylist()]
            tables.append(table.drop_columns(["file_name"]))
        meta = pa.concat_tables(tables, promote_options="permissive")
    except Exception as exc:
        fail(f"cannot read or join the metadata file {path}: {type(exc).__name__}: {exc}")
    return meta.take(pc.index_in(pa.array(relative), value_set=pa.array(keys, pa.string())))


def _image_folder(root: Path, files: list[Path], metadata_files: list[Path]):
    """A folder of scans and PDFs: one row per file, `file_name` relative to INPUT, metadata."""
    import datasets

    if odd := [p for p in files if shown_path(p) != str(p)]:  # no valid text for Arrow
        fail(f"{len(odd)} file name(s) of INPUT are not UTF-8, e.g. {shown_path(odd[0])}: rename "
             f"them first (e.g. convmv -f latin1 -t utf8 -r --notest DIR)")
    pdf = [p.suffix.lower() == ".pdf" for p in files]
    cells = [{"bytes": None, "path": str(p)} for p in files]
    columns = {"image": [None if is_pdf else cell for cell, is_pdf in zip(cells, pdf)],
               "file_name": [p.relative_to(root).as_posix() for p in files],
               "pdf": [cell if is_pdf else None for cell, is_pdf in zip(cells, pdf)]}
    features = {"image": datasets.Image(decode=False), "file_name": datasets.Value("string"),
                "pdf": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}}
    for name in ["image"] * all(pdf) + ["pdf"] * (not any(pdf)):  # a column of files there are
        del columns[name], features[name]
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    if metadata_files:
        meta = _read_metadata(root, metadata_files, columns["file_name"])
        ds = datasets.concatenate_datasets([ds, datasets.Dataset(meta)], axis=1)
    return ds


def _load_tables(reader: str, data_files: dict, what: str, args, configs: bool = False):
    """The tables of --split (datasets fails on a parquet of no rows: those are left out)."""
    import datasets
    import pyarrow.parquet as pq

    chosen = []  # no file, no rows: open_input says there is nothing to do
    for path in _split_of(data_files, what, args, configs):
        try:
            if not str(path).endswith(".parquet") or pq.read_metadata(path).num_rows:
                chosen.append(str(path))
        except Exception as exc:  # pyarrow says what: 0 bytes, or no parquet at all
            fail(f"INPUT file {path} is not a readable parquet file ({exc}): remove or rewrite it")
    # the files named: datasets caches a README config by name, a changed folder stale
    return _by_datasets(what, datasets.load_dataset, reader, args.config if configs else None,
                        split=args.split, data_files={args.split: chosen}) if chosen else \
        datasets.Dataset.from_dict({})


def _load_local_dataset(path: Path, args):
    """A local INPUT as what it is (table, saved dataset, folder), with the files it reads."""
    import datasets

    if path.suffix.lower() == ".pdf" and path.is_file():
        return _image_folder(path.parent, [path], []), [path]  # a folder of one document
    if path.is_file():
        if path.suffix not in TABLE_EXTENSIONS:
            fail(f"INPUT file {path} is not a .parquet, .arrow or .pdf file: pass a folder of "
                 f"images or PDFs instead")
        return _load_tables(path.suffix[1:], {args.split: [path]}, str(path), args), [path]
    files = _walk_folder(path, args)
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        loaded = _by_datasets(f"the saved dataset {path}", datasets.load_from_disk, str(path))
        splits = loaded if isinstance(loaded, datasets.DatasetDict) else \
            {str(loaded.split or "train"): loaded}
        return _split_of(splits, str(path), args), files
    images = [p for p in files if p.suffix.lower() in image_extensions() | {".pdf"}]
    metadata = [p for p in files if p.name in METADATA_NAMES]
    tables = [p for p in files if p.suffix in TABLE_EXTENSIONS and p not in metadata]
    if images and tables:
        fail(f"INPUT {path} holds {len(images)} image(s) and table files ({tables[0]}, ...): "
             f"move the tables out (a metadata.parquet may stay), or pass them as INPUT")
    if images:
        _split_of({"train": None}, f"folder {path}", args)
        return _image_folder(path, images, metadata), sorted(images + metadata)
    # else a folder of tables, as `datasets.load_dataset(folder)` reads it (or finds none)
    builder = _by_datasets(f"{path}" + " (--config NAME picks a config)" * bool(files),
                           datasets.load_dataset_builder, str(path), args.config)
    return _load_tables(str(path), builder.config.data_files or {},
                        f"{path} (split {args.split})", args, configs=True), files


def _check_image_column(ds, column: str, lo: int, hi: int) -> None:
    """One refusal up front, from the column's type and first rows, not an error on each row."""
    import datasets

    feature = ds.features.get(column)
    advice = f"pass --image-column NAME of images (columns: {', '.join(ds.column_names)})"
    if feature is None:
        fail(f"image column {column!r} not found: {advice}, or --pdf-column NAME for PDFs")
    dtype = feature.dtype if isinstance(feature, datasets.Value) else None
    if not (isinstance(feature, datasets.Image) or isinstance(feature, dict) and "bytes" in feature
            or dtype in ("binary", "large_binary", "string", "large_string")):
        fail(f"image column {column!r} holds {feature}, not one image per row: flatten a list "
             f"of pages first, or {advice}")
    if dtype in ("binary", "large_binary") or hi <= lo:
        return
    sample = ds.select_columns([column]).select(range(lo, min(hi, lo + 16)))[column]
    paths = [p for p in (c if isinstance(c, str) else c.get("bytes") is None and c.get("path")
                         for c in sample if isinstance(c, (str, dict))) if p]
    if paths and not _HUB_FILES and not any(_resolve_image_path(p).is_file() for p in paths):
        fail(f"image column {column!r} holds paths that lead to no file, e.g. {paths[0]!r}: "
             f"write absolute paths, or paths relative to INPUT's folder; or {advice}")


def _load_hub_split(args):
    """The Hub dataset's split; one of no rows ("corresponds to no data") read as empty."""
    import datasets

    try:
        return datasets.load_dataset(args.input, args.config, split=args.split,
                                     revision=args.revision, token=args.hf_token or None)
    except ValueError as exc:
        if "corresponds to no data" not in str(exc):
            raise
        return datasets.Dataset.from_dict({})


def open_input(args) -> InputSource:
    """Open INPUT without decoding a single image: Arrow memory-maps it, rows are read lazily."""
    import datasets

    local, files, description = Path(args.input).expanduser(), None, args.input
    _PATH_BASE[:], _HUB_FILES[:] = [], []  # where path cells lead (PDF cells too)
    if local.exists():  # (OutputStore made sure that OUTPUT is not inside it)
        ds, files = _load_local_dataset(local, args)
        description = shown_path(local.resolve())
        _PATH_BASE.append(local.resolve() if local.is_dir() else local.resolve().parent)
    elif REPO_ID.match(args.input):
        ds = _by_datasets(f"the Hub dataset {args.input}", _load_hub_split, args)
        _HUB_FILES.append(hub_download_folder(args.input))
    else:
        fail(f"INPUT {args.input!r} is neither an existing path nor a Hub dataset id.")
    if len(ds) == 0:
        log(f"INPUT {description} has no rows: nothing to do (nothing written)")
        if args.check_only:  # the launcher reads the count, as after any check
            print(json.dumps({"rows": 0}))
        raise SystemExit(0)
    pdf_column = find_pdf_column(ds, args)
    if isinstance(ds.features.get(pdf_column), getattr(datasets, "Pdf", ())):
        ds = ds.cast_column(pdf_column, datasets.Pdf(decode=False))  # the bytes, opened here
    if isinstance(ds.features.get(args.image_column), datasets.Image):
        ds = ds.cast_column(args.image_column, datasets.Image(decode=False))
    rows_full = len(ds)
    if args.shuffle:
        ds = ds.shuffle(seed=args.seed)
    if args.max_samples is not None:
        ds = ds.select(range(min(args.max_samples, len(ds))))
    n = len(ds)
    lo, hi = n * args.shard_index // args.num_shards, n * (args.shard_index + 1) // args.num_shards
    _TEXT_LAYER_COLUMNS[:] = ["text_layer"] * bool(args.text_layer or args.skip_text_pages)
    if pdf_column is None:
        _check_image_column(ds, args.image_column, lo, hi)
        return InputSource(ds, args.image_column, description, lo, hi, rows_full, files=files)
    pages = count_pdf_pages(ds, pdf_column, args)
    pages.per_document = bool(args.per_document)
    # a document's name, not its bytes, goes out (added first: no columns would be no rows)
    named = "file_name" in ds.column_names
    shown = ds.add_column(" name", pages.names).remove_columns([pdf_column, *[" name"] * named])
    shown = shown if named else shown.rename_column(" name", pdf_column)
    if not pages.per_document:
        lo, hi = pages.first_row(lo), pages.first_row(hi)  # shards split documents
    return InputSource(shown, args.image_column, description, lo, hi, rows_full, pages, files)


def check_output_columns(source: InputSource, args) -> None:
    """A result column that clashes with an input column fails before any inference."""
    clash = [c for c in result_column_names(args.output_column) if c in source.dataset.column_names]
    if clash and not args.overwrite:
        fail(f"input already has column(s) {', '.join(clash)}: pass --overwrite to replace "
             f"them, or --output-column NAME")


# RowResult's result columns and types: `text` is the output column, the others <column>_<field>
RESULT_FIELDS = {"text": "string", "error": "string", "error_kind": "string",
                 "finish_reason": "string", "prompt_tokens": "int32", "completion_tokens": "int32",
                 "attempts": "int32", "skipped": "string"}
ROW_IDENTITY = "input_digest"  # row_identity()'s column; a stacked run keeps its input's


def result_column_names(column: str) -> list[str]:
    suffixes = [*RESULT_FIELDS, *EXTRA_COLUMNS, *_TEXT_LAYER_COLUMNS][1:]  # after `text`
    return [column] + [f"{column}_{suffix}" for suffix in suffixes]


def iter_image_cells(source: InputSource, indices: list[int], batch: int = 64):
    """(index, cell) in order, reading the image column only; a PDF page's cell is a PdfPage."""
    pdf, column = source.pdf, source.image_column
    images = source.dataset.select_columns([column]) \
        if column in source.dataset.column_names else None
    for offset in range(0, len(indices), batch):
        chunk = indices[offset:offset + batch]
        rows = chunk if pdf is None else [int(pdf.doc[i]) for i in chunk]
        cells = images.select(rows)[column] if images is not None else [None] * len(rows)
        if pdf is not None:
            cells = [pdf.page(i) if pdf.is_pdf(row) else cell
                     for i, row, cell in zip(chunk, rows, cells)]
        yield from zip(chunk, cells)


# ---- pages.py: A page image: read from its cell, flattened, resized, encoded to send.
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


# ---- pdf.py: PDF documents: a row per page, counted unrendered, rendered in their own process.
# In worker processes: PDFium is not thread-safe, and a page that hangs or crashes it must not
# take the run.
PDF_MIN_DPI, PDF_MAX_DPI = 72, 400
PDF_COLUMNS = {"page_number": "int32", "page_count": "int32"}


def find_pdf_column(ds, args) -> str | None:
    """--pdf-column; else a `datasets.Pdf` column, `pdf`, or the image column if it holds PDFs."""
    import datasets

    typed = [name for name, feature in ds.features.items()
             if isinstance(feature, getattr(datasets, "Pdf", ())) or  # or the folder reader's:
             name == "pdf" and isinstance(feature, dict) and set(feature) == {"bytes", "path"}]
    named = args.pdf_column
    if named and named not in ds.column_names:
        fail(f"--pdf-column {named!r} not found. Columns: {', '.join(ds.column_names)}")
    if not named and len(typed) > 1:
        fail(f"INPUT has several PDF columns ({', '.join(typed)}); pass --pdf-column NAME")
    column = named or (typed[0] if typed else args.image_column)
    if column in typed or column not in ds.features or \
            not named and isinstance(ds.features[column], datasets.Image):
        return column if column in typed else None  # its type says enough
    cells = ds.select_columns([column]).select(range(min(16, len(ds))))[column]
    if any(map(looks_like_pdf, cells)) or named and all(cell is None for cell in cells):
        return column
    if named:
        fail(f"--pdf-column {named!r} holds no PDFs in its first rows (PDF bytes start with "
             f"%PDF-; paths must lead to PDF files)")
    return None


def looks_like_pdf(cell) -> bool:
    try:
        data = cell_source(cell)[0]
    except PageError:  # a path not read is no PDF
        return False
    if isinstance(data, str):
        with contextlib.suppress(OSError), open(data, "rb") as handle:
            data = handle.read(5)
    return isinstance(data, bytes) and data.startswith(b"%PDF-")


def parse_pages(spec: str | None) -> list[tuple[int, int | None]]:
    """--pages "1-5,8,10-" as 1-based inclusive ranges (None: to the end); []: every page."""
    ranges = []
    for item in spec.replace(" ", "").split(",") if spec else []:
        match = re.fullmatch(r"(\d+)(-(\d*))?", item)
        first = int(match[1]) if match else 0
        last = first if not match or not match[2] else int(match[3]) if match[3] else None
        if first < 1 or last is not None and last < first:
            raise ValueError(f"--pages {spec!r}: {item!r} is not N, A-B or A- (1-based)")
        ranges.append((first, last))
    return ranges


@dataclass
class PdfPage:
    """A page to render: its document's row, its number (None: see PdfPages.errors)."""
    doc_row: int
    number: int | None


@dataclass
class PdfPages:
    """Output row i is page number[i] of input row doc[i] (0: an image, or see errors)."""
    docs: object  # the input, PDF column included
    column: str
    per_document: bool = False  # output rows are documents, their pages joined (--per-document)
    doc: object = None  # numpy int64 per output row, and number, count int32
    number: object = None
    count: object = None
    paths: dict = field(default_factory=dict)  # doc row -> its file, when it is one
    errors: dict = field(default_factory=dict)  # doc row -> why it has no page to render
    names: list = field(default_factory=list)  # doc row -> the document's path as its cell says
    digests: dict = field(default_factory=dict)  # doc row -> input_digest(): see digest()

    def fingerprint(self, docs: int | None = None) -> dict:
        """The first `docs` documents' pages, sizes and file_tail()s."""
        docs = len(self.names) if docs is None else min(docs, len(self.names))
        end = self.first_row(docs)
        digest = hashlib.sha256(self.doc[:end].tobytes() + self.number[:end].tobytes() +
                                self.count[:end].tobytes())
        for row, path in sorted(item for item in self.paths.items() if item[0] < docs):
            try:
                digest.update(f"{row} {os.path.getsize(path)}".encode() + file_tail(path))
            except OSError:
                digest.update(f"{row} missing".encode())
        return {"documents": docs, "digest": digest.hexdigest()[:20]}

    def digest(self, doc_row: int) -> str | None:
        """input_digest() of a document; a file's is read once per run (a tail misses edits)."""
        if doc_row not in self.digests and doc_row in self.paths:
            digest, self.digests[doc_row] = hashlib.sha256(), None  # None: unreadable
            with contextlib.suppress(OSError), open(self.paths[doc_row], "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):  # a MiB at a time
                    digest.update(chunk)
                self.digests[doc_row] = digest.hexdigest()[:20]
        return self.digests.get(doc_row)

    def first_row(self, doc_row: int) -> int:
        return int(self.doc.searchsorted(doc_row))

    def rows_of(self, doc_row: int) -> range:
        return range(self.first_row(doc_row), self.first_row(doc_row + 1))

    def is_pdf(self, doc_row: int) -> bool:
        return doc_row in self.errors or self.count[self.first_row(doc_row)] > 0

    def page(self, i: int) -> PdfPage:
        return PdfPage(int(self.doc[i]), int(self.number[i]) or None)


def file_tail(path) -> bytes:
    """A file's last 64 KiB (parquet's footer, a PDF's trailer: a rewrite shows there); OSError."""
    with open(path, "rb") as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
        return handle.read()


def count_pdf_pages(ds, column: str, args) -> PdfPages:
    """Every document's page count, unrendered: the output's row numbers, so every shard counts."""
    import numpy as np
    import pypdfium2 as pdfium
    from tqdm import tqdm

    ranges, pdf, rows = parse_pages(args.pages) or [(1, None)], PdfPages(ds, column), []
    cells = ds.select_columns([column])
    for row in tqdm(range(len(ds)), desc="counting PDF pages", unit="doc", disable=len(ds) < 50,
                    mininterval=0.5 if sys.stderr.isatty() else 10.0):
        try:
            data, shown = cell_source(cells[row][column])
        except PageError as exc:  # a path not read: its row says why
            data, shown, pdf.errors[row] = None, cells[row][column], str(exc)
            shown = shown.get("path") if isinstance(shown, dict) else shown
        pdf.names.append(shown)
        if isinstance(data, str):
            pdf.paths[row] = data  # read for its digest when a page of it is sent
        elif isinstance(data, bytes):
            pdf.digests[row] = input_digest(data)
        try:  # PDFium names the cause: a password, a format error
            total = 0 if data is None else len(pdfium.PdfDocument(data))
        except Exception as exc:
            total, pdf.errors[row] = 0, f"cannot open the PDF: {type(exc).__name__}: {exc}"
        pages = [n for n in range(1, total + 1)
                 if any(first <= n <= (last or n) for first, last in ranges)]
        if data is None and (column != "pdf" or "image" not in ds.column_names):
            pdf.errors.setdefault(row, "missing PDF (empty cell)")  # else: an image of the folder
        elif data is not None and not pages:
            pdf.errors.setdefault(row, f"none of --pages {args.pages} is in this {total}-page "
                                  "PDF" if total else "the PDF has no pages")
        rows += [(row, page, total) for page in pages or [0]]
    pdf.doc, pdf.number, pdf.count = (np.array(values, dtype) for values, dtype in
                                      zip(zip(*rows), (np.int64, np.int32, np.int32)))
    return pdf


def input_features(source: InputSource):
    """The input's columns as the output carries them (PDF input: the page's number and count)."""
    import datasets

    features = datasets.Features(source.dataset.features)
    if source.pdf is not None:
        features.update({name: datasets.Value(kind) for name, kind in PDF_COLUMNS.items()
                         if name == "page_count" or not source.pdf.per_document})
    return features


def input_rows(source: InputSource, indices: list[int]) -> dict:
    pdf = source.pdf
    pages = pdf is not None and not pdf.per_document
    rows = source.dataset.select([int(pdf.doc[i]) for i in indices] if pages else indices).to_dict()
    if pages:
        rows["page_number"] = [int(pdf.number[i]) or None for i in indices]
    if pdf is not None:
        rows["page_count"] = [int(pdf.count[i if pages else pdf.first_row(i)]) or None
                              for i in indices]
    return rows


def _render_pdf_page(page, args) -> PreparedPage:
    """The page encoded at the model's size, with its text layer; skipped if that is enough."""
    skip_chars = args.skip_text_pages
    layer = page.get_textpage().get_text_bounded().replace("\r\n", "\n").replace("\r", "\n") \
        if args.text_layer or skip_chars else None  # PDFium ends lines with \r\n
    if skip_chars and sum(not c.isspace() for c in layer) >= skip_chars:
        return PreparedPage(b"", "", 0, 0, False, text_layer=layer, skipped=True)
    width_pt, height_pt = page.get_size()
    if not (width_pt > 0 and height_pt > 0):
        raise PageError(f"the page has no area ({width_pt} x {height_pt} pt)")
    dots = args.pdf_dpi / 72  # pixels a point
    target = sent_size(width_pt * dots, height_pt * dots, args, PDF_MAX_PIXELS)
    img = page.render(scale=target[0] / width_pt, may_draw_forms=True).to_pil()
    return PreparedPage(*encode_page(img, target), False, text_layer=layer,
                        blank=judges_blank(args) and is_blank(img))


class PdfRenderer:
    """Render processes, thread-safe: a page that hangs or crashes one is its error row."""

    def __init__(self, pdf: PdfPages, args):
        self.pdf, self.args, self.idle, self.driver = pdf, args, queue.Queue(), os.getpid()
        self.busy, self.closed = set(), False  # close() kills a busy one too: no wait at exit
        for _ in range(max(1, args.pdf_workers)):
            self._start()

    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()  # forked: the child reads the input as it is
        process = multiprocessing.get_context("fork").Process(target=self._serve,
                                                              args=(theirs,), daemon=True)
        process.start()  # fork beside the driver's threads: the child runs none of their code
        theirs.close()
        self.idle.put((process, ours))

    def _serve(self, conn) -> None:
        """A render process: (row, page) in, page fields or an error out; dies with the driver."""
        import pypdfium2 as pdfium

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
        with contextlib.suppress(Exception):  # Linux; elsewhere the parent's pid is watched below
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        opened = None  # the row of the document kept open
        while True:
            try:
                while not conn.poll(1.0):
                    if os.getppid() != self.driver:
                        return
                doc_row, number = conn.recv()
            except (EOFError, OSError):  # the driver is gone
                return
            try:
                if opened != doc_row:  # the last document closes as it is let go
                    opened, document = None, pdfium.PdfDocument(
                        cell_source(self.pdf.docs[doc_row][self.pdf.column])[0])
                    document.init_forms()  # form fields drawn, as a viewer shows them
                    opened = doc_row
                reply = vars(_render_pdf_page(document[number - 1], self.args))
            except Exception as exc:  # the document opened when it was counted
                reply = str(exc) if isinstance(exc, PageError) else \
                    f"cannot render page {number}: {type(exc).__name__}: {exc}"
            conn.send(reply)

    def render(self, page: PdfPage) -> PreparedPage:
        if page.doc_row in self.pdf.errors:
            raise PageError(self.pdf.errors[page.doc_row])
        while True:  # a worker, unless the run is over (close: none comes back)
            with contextlib.suppress(queue.Empty):
                process, pipe = self.idle.get(timeout=1.0)
                break
            if self.closed:
                raise PageError("the run stopped before this page was rendered")
        self.busy.add(process)
        timeout, reply = self.args.pdf_page_timeout, None
        error = f"rendering page {page.number} took more than {timeout:g} s (--pdf-page-timeout)"
        with contextlib.suppress(EOFError, OSError):
            pipe.send((page.doc_row, page.number))
            if pipe.poll(timeout):
                error = f"the PDF renderer crashed on page {page.number}"
                reply = pipe.recv()
        self.busy.discard(process)
        if reply is None:  # hung or crashed: a new worker takes its place (start reaps this one)
            process.kill()
            pipe.close()
            if not self.closed:
                self._start()
            raise PageError(error)
        self.idle.put((process, pipe))
        if isinstance(reply, str):
            raise PageError(reply)
        return PreparedPage(**{**reply, "digest": self.pdf.digest(page.doc_row)})

    def close(self) -> None:  # a page still rendering (hung, say) is not waited for
        self.closed = True
        for process in list(self.busy):
            process.kill()
        while not self.idle.empty():
            self.idle.get()[0].kill()


# ---- loops.py: Loop checks: an answer repeating itself, cut or sent again; the first pages' check.
CUT = ("length", "repetition")  # an answer the engine ended: at max_tokens, or by its detection


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


def text_before_loop(text: str) -> int:
    """The characters before the repeating tail, with one copy of its unit."""
    period, repeats = repeated_tail(text, 1000)
    return len(text) - period * (repeats - 1) if repeats else len(text)


def cut_at_loop(text: str, finish_reason: str | None) -> str:
    """An answer that repetition detection ended keeps its text up to one copy of the loop."""
    return text[:text_before_loop(text)] if text and finish_reason == "repetition" else text


def looks_degenerate(text: str | None) -> bool:
    """Empty, one or two characters over and over, or mostly a repetition loop."""
    if not text or not text.strip():
        return True
    visible = [c for c in text if not c.isspace()]
    period, repeats = repeated_tail(text) if len(text) >= 40 else (0, 0)
    return len(visible) >= 8 and len(set(visible)) <= 2 or \
        repeats >= 5 and period * repeats >= len(text) * 0.5 or \
        len(text) >= 200 and len(zlib.compress(text.encode())) < len(text.encode()) * 0.05


def loops(text: str | None, finish_reason: str | None) -> bool:
    """An answer to send again: cut by the engine (detection, or max_tokens) in a loop."""
    if finish_reason not in CUT or not text or not text.strip():
        return False
    period, repeats = repeated_tail(text)
    return finish_reason == "repetition" or looks_degenerate(text) or \
        (repeats >= 5 and period * repeats >= 100)


def repetition_detection(args) -> dict | None:
    return dict(zip(("max_pattern_size", "min_count"), REPETITION_DETECTION)) \
        if getattr(args, "repetition_detection", False) else None  # a bare namespace: off


def loop_seed(index: int, attempt: int) -> int:
    """The same row and attempt, the same seed: a rerun repeats the retry."""
    return zlib.crc32(f"{index}:{attempt}".encode()) & 0x7FFFFFFF


def kept_attempt(kept: "RowResult", retry: "RowResult") -> "RowResult":
    """The retry if it has text and does not loop, or more text before its loop."""
    if retry.error is not None:
        return kept if retry.error_kind != SERVER else error_row(  # a rerun redoes it
            f"the answer looped, and sending it again failed: {retry.error}", SERVER)
    attempts = (kept.attempts or 1) + 1
    if (retry.text or "").strip() and not loops(retry.text, retry.finish_reason) or \
            text_before_loop(retry.text or "") > text_before_loop(kept.text):
        kept = retry  # never a page's text traded for nothing
    kept.attempts = attempts
    return kept


class DegenerateCheck:
    """Stops the run when the first pages (at least 3) all came back broken, resent or refused."""

    def __init__(self, enabled: bool, pages: int, send: list):
        self.pages, self.seen, self.broken, self.cut = max(3, pages), 0, 0, 0
        self.error = None  # the last refusal's (a 400, a post-processing failure)
        self.first = set(send[:self.pages])  # the rows sent first: a refusal counts among them
        self.done, self.tripped = not (enabled and send), False

    def passed(self) -> bool:
        return self.done and not self.tripped

    def observe(self, result: "RowResult", index: int | None = None) -> None:
        if self.done or result.error and index is not None and index not in self.first:
            return  # a refusal is back at once, before the answers of the pages sent with it
        visible = "".join((result.text or "").split())  # a complete blank form is not broken
        self.seen += 1
        self.error = result.error or self.error
        self.cut += result.finish_reason == "length"
        looped = (result.attempts or 1) - result.resent > 1  # a resend asked for is no loop
        self.broken += looped or result.finish_reason in CUT or \
            not visible or len(visible) >= 8 and len(set(visible)) == 1
        if self.seen >= self.pages:
            self.finish()

    def finish(self) -> None:
        if self.done or self.seen < 3 or self.broken < self.seen:
            self.done = True
            return
        self.done = self.tripped = True
        cut = f"; {self.cut} were cut at --max-tokens: raise it if the pages hold more text" \
            if self.cut else f"; the last refusal: {self.error[:300]}" if self.error else ""
        raise RunAborted(
            f"the first {self.seen} pages all came back degenerate (empty, looping, cut or "
            f"refused){cut}: a wrong model / engine pair looks like this (validated: {MODEL_ID} "
            f"on {JOB_IMAGE}). Check --model and the image, or pass --no-sanity-check to write "
            f"such output anyway.", code=EXIT_DEGENERATE)


# ---- rows.py: A page's result: its row, an error row with its cause, a document's pages joined.
PAGE, SERVER = "page", "server"  # an error row's kind: final, or one a rerun redoes


@dataclass
class RowResult:
    text: str | None = None
    error: str | None = None
    error_kind: str | None = None  # PAGE or SERVER when error is set
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    extras: dict = field(default_factory=dict)
    attempts: int | None = None  # generations the text took (loop retries)
    resent: int = 0  # of those, the sends the model section asked for (SEND_AGAIN): no loop
    text_layer: str | None = None  # a PDF page's embedded text
    skipped: str | None = None  # why the page was not sent
    digest: str | None = None  # input_digest() of what it was made from
    sent_size: tuple | None = None  # (width, height) of the image sent: a pixel box's space


def is_blank_row(result: RowResult) -> bool:
    """A page not sent because it holds no ink: an empty text, and why (BLANK_REASON)."""
    return result.text == "" and result.skipped is not None and result.error is None


def error_row(message: str, kind: str) -> RowResult:
    return RowResult(error=message, error_kind=kind)


def exception_row(exc: BaseException, kind: str, what: str = "") -> RowResult:
    return error_row(f"{what}{type(exc).__name__}: {str(exc)[:500]}", kind)


def joined_pages(pages: list[tuple[int, RowResult]]) -> RowResult:
    """A document's row (--per-document): its pages' texts, each after a line naming it."""
    if len(pages) == 1 and not pages[0][0]:
        return pages[0][1]  # an image, or a document whose pages could not be counted
    ok = [(n, r) for n, r in pages if r.error is None]
    failed = [(n, r) for n, r in pages if r.error is not None]

    def marked(values):
        return "\n\n".join(f"<!-- page {n} -->" + (f"\n\n{v}" if v else "")
                           for n, v in values if v is not None) or None

    texts = [(n, "" if r.error is not None else r.text if r.skipped is None or is_blank_row(r)
              else r.text_layer) for n, r in pages]
    blank = ", ".join(str(n) for n, r in pages if is_blank_row(r))
    skipped = ", ".join(str(n) for n, r in pages if r.skipped and not is_blank_row(r))
    digests = {r.digest for _, r in pages}
    return RowResult(
        text=marked(texts) if any(t for _, t in texts) else "" if len(blank) and all(
            map(is_blank_row, (r for _, r in pages))) else None,
        error="; ".join(f"page {n}: {r.error}" for n, r in failed) or None,
        error_kind=max((r.error_kind for _, r in failed), default=None),  # "server" over "page"
        finish_reason=max((r.finish_reason for _, r in ok if r.finish_reason),
                          key=lambda r: r in CUT, default=None),  # a cut one first
        prompt_tokens=sum(r.prompt_tokens or 0 for _, r in ok) or None,
        completion_tokens=sum(r.completion_tokens or 0 for _, r in ok) or None,
        attempts=max((r.attempts for _, r in ok if r.attempts is not None), default=None),
        extras={suffix: [b for _, r in ok for b in r.extras.get(suffix) or []]
                if kind == "blocks" else marked((n, r.extras.get(suffix)) for n, r in ok)
                if kind == "string" else shared_value(r.extras.get(suffix) for _, r in ok)
                for suffix, kind in EXTRA_COLUMNS.items()},
        text_layer=marked((n, r.text_layer) for n, r in pages),
        skipped="; ".join(reason for reason in (
            f"pages {skipped} not sent: their text layer (in the text too) was enough"
            if skipped else "", f"pages {blank} not sent: blank (no ink found)" if blank else "")
            if reason) or None,
        digest=digests.pop() if len(digests) == 1 else None)  # the document's, if all pages had it


def shared_value(values):
    """A scalar extra column of a document's row: its pages' one value, else null."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def read_page(cell, args, renderer=None, decode: bool = True) -> PreparedPage | RowResult | None:
    try:
        page = renderer.render(cell) if isinstance(cell, PdfPage) else \
            prepare_page(cell, args, decode)
    except Exception as exc:  # the row fails, not the run
        return error_row(str(exc), PAGE) if isinstance(exc, PageError) else exception_row(exc, PAGE)
    if page is not None and page.blank:  # written with an empty text: never sent
        return RowResult(text="", attempts=0, digest=page.digest, skipped=BLANK_REASON,
                         text_layer=page.text_layer)
    if page is None or not page.skipped:
        return page
    return RowResult(text_layer=page.text_layer, attempts=0, digest=page.digest, skipped=f"not "
                     f"sent: its text layer was enough (--skip-text-pages {args.skip_text_pages})")


# ---- plan.py: Which rows are done: the journal of written parts, the plan of the rows to send.
class Journal:
    """Finished rows, a JSON line each, in a file per run that goes once its rows are in parts."""

    def __init__(self, folder: Path):
        self.folder, self.file, self.current, self.failed = folder, None, None, False
        self.unwritten: dict[Path, set[int]] = {}  # each file's rows not yet in a part
        self.lock = threading.RLock()

    def replay(self, wanted) -> dict[int, RowResult]:
        """Rows earlier runs finished, oldest file first; `wanted(row)` says which to take."""
        rows: dict[int, RowResult] = {}
        for path in sorted(self.folder.glob("*.jsonl")):
            self.unwritten[path] = set()
            with open(path, encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    try:
                        entry = json.loads(line)
                        index, result = entry.pop("row"), RowResult(**entry)
                    except Exception:
                        continue  # the line a kill cut short
                    if wanted(index):
                        rows[index] = result
                        self.unwritten[path].add(index)
        return rows

    def append(self, index: int, result: RowResult) -> None:
        line = json.dumps({"row": index, **result.__dict__}) + "\n"  # ASCII: lone surrogates too
        with self.lock:
            try:
                if self.file is None:
                    self._open()
                self.file.write(line)
                self.file.flush()
                self.unwritten[self.current].add(index)
            except OSError as exc:  # a full disk: the rows are kept in memory
                self.failed or log(f"warning: cannot write the journal ({exc})")
                self.failed = True

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.current = self.folder / f"{time.time_ns():020d}-{os.getpid()}.jsonl"
        self.file = open(self.current, "a", encoding="utf-8")
        self.unwritten[self.current] = set()

    def written(self, indices) -> None:
        """These rows are in parts: a file that holds no other goes (not the open one)."""
        with self.lock:
            for path, rows in list(self.unwritten.items()):
                rows.difference_update(indices)
                if not rows and path != self.current:
                    path.unlink(missing_ok=True)
                    del self.unwritten[path]

    def close(self, discard: bool = False) -> None:
        with self.lock:
            for rows in self.unwritten.values() if discard else ():
                rows.clear()
            try:
                self.file and self.file.close()
            except OSError as exc:  # its rows are in parts, or not written
                log(f"warning: cannot write the journal ({exc})")
            self.file = self.current = None
            self.written(())


@dataclass
class RowPlan:
    """What this run does with its shard's rows."""
    pending: list[int]  # rows to send, in order
    recovered: dict  # row -> its result in the journal, in no part yet
    redo: dict  # row -> the part holding its error row
    skipped: int  # rows done before and not redone
    earlier_ok: int  # rows earlier runs wrote with text
    send: list[int]  # the pending rows, or (--per-document) their pages
    pages: dict  # --per-document: page -> its result in the journal


def rows_to_redo(note: dict, lo: int, hi: int, retry_errors: bool = False,
                 send_blank: bool = False) -> list[int]:
    """The rows in [lo, hi) a rerun sends again, from a part's note. ocr-jobs.py runs this very
    function, read from the script: it reads only its arguments and literal constants (SERVER)."""
    again = [int(row) for row, kind in note["errors"].items()
             if (kind == SERVER or retry_errors) and lo <= int(row) < hi]
    return again + ([row for row in note.get("blank", []) if lo <= row < hi] if send_blank else [])


def plan_rows(source: InputSource, store: "OutputStore", args) -> RowPlan:
    """Rows in no part and error rows to redo (SERVER; all: --retry-errors), less the journal's."""
    covered, redo, earlier_ok = bytearray(source.hi - source.lo), {}, 0
    for (start, stop), path in store.parts():
        lo, hi = max(start, source.lo), min(stop, source.hi)
        for i in range(lo, hi):
            covered[i - source.lo] = 1
        name = part_name(start, stop)
        note = part_note(path, args.output_column) if path else store.notes.get(name)
        if note is None:  # another shard's part, or one sent by hand (`hf upload`): as it is
            earlier_ok += stop - start
            continue
        again = rows_to_redo(note, lo, hi, args.retry_errors, args.send_blank)
        if again and path is None:  # only on the Hub (a Job's empty disk)
            path = store.fetch_part(name)
        earlier_ok += stop - start - len(note["errors"]) - \
            (len(note["blank"]) if args.send_blank else 0)
        redo.update((row, path) for row in again)
    store.keep_local.update(path.name for path in redo.values())  # rewritten later
    pdf = source.pdf if source.pdf is not None and source.pdf.per_document else None

    def wanted(i: int) -> bool:  # --per-document journals each page as -1 - page
        if i < 0:
            return pdf is not None and -i <= len(pdf.doc) and wanted(int(pdf.doc[-1 - i]))
        return i in redo or source.lo <= i < source.hi and not covered[i - source.lo]

    def input_row(i: int) -> int:  # whose input a journal entry was made from
        return -1 - i if i < 0 else pdf.first_row(i) if pdf else i

    # an error row a part holds already (or a redo that failed again before a kill): redone
    journaled = {i: r for i, r in store.journal.replay(wanted).items()
                 if not (i in redo and r.error is not None or args.send_blank and is_blank_row(r))}
    now = {}  # input_digest() of each journaled row's input now (a PDF's: its own)
    for row, cell in iter_image_cells(source, sorted({input_row(i) for i in journaled})):
        with contextlib.suppress(PageError):  # unreadable: done again
            now[row] = source.pdf.digest(cell.doc_row) if isinstance(cell, PdfPage) \
                else input_digest(read_cell_bytes(cell))
    same = {i: r for i, r in journaled.items() if r.digest and r.digest == now.get(input_row(i))}
    if len(same) < len(journaled):
        log(f"{len(journaled) - len(same)} row(s) of the journal are done again: their input "
            f"changed since, or the journal does not say which it was")
    recovered = {i: r for i, r in same.items() if i >= 0}
    pending = [i for i in range(source.lo, source.hi) if wanted(i) and i not in recovered]
    pages = {-1 - i: r for i, r in same.items() if i < 0 and int(pdf.doc[-1 - i]) not in recovered
             and (r.error is None or r.error_kind == PAGE and not args.retry_errors)}
    send = [i for doc in pending for i in pdf.rows_of(doc) if i not in pages] if pdf else pending
    return RowPlan(pending, recovered, redo, source.hi - source.lo - len(pending) - len(recovered),
                   earlier_ok, send, pages)


# ---- store.py: The output store: OUTPUT's folder or Hub repo, its lock, claim, uploads, commits.
UPLOAD_ATTEMPTS, UPLOAD_BACKOFF_S, UPLOAD_MAX_WAIT_S = 5, 2.0, 600.0


def lock_holder(handle) -> str | None:
    """Lock an open file until this process dies, else who holds it (lockf: not inherited)."""
    import fcntl

    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN, EACCES: another process holds it
        handle.seek(0)
        return handle.read().strip() or "another process"
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: some network and FUSE mounts
        log(f"warning: cannot lock {handle.name} ({exc.strerror or exc}): nothing stops a "
            f"second run writing to this OUTPUT")
    return None


def take_lock(path: Path, location: str, probe: bool = False):
    """The shard's lock, held until this process ends; `probe`: whether a run would get it."""
    if probe and not path.exists():
        return None
    handle = open(path, "a+")
    if holder := lock_holder(handle):
        fail(f"{holder} is writing this shard of {location}: wait for it to end, or write to "
             f"another OUTPUT")
    if probe:
        return handle.close()  # which lets the lock go
    handle.truncate(0)  # "a+" writes at the end, which is now the start
    print(f"pid {os.getpid()} on {os.uname().nodename}, since "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", file=handle, flush=True)
    return handle


class OutputStore:
    """Parts under data/ of a folder (or staged for a Hub repo); the rest under .ocr/."""

    def __init__(self, target: str, args, hub_api=None):
        self.kind, self.target = resolve_output(target)
        self.api, self.column, self.read_only = None, args.output_column, args.check_only
        if self.kind == "local":
            self.root = Path(self.target)
            data = self.root / "data"  # what `datasets` reads (not hidden names)
            self.refuse_foreign([f for f in ("README.md", ".ocr/manifest.json")
                                 if (self.root / f).exists()] + [
                p.relative_to(self.root).as_posix() for p in sorted(data.rglob("*"))
                if p.is_file() and not any(n.startswith(".") for n in p.relative_to(data).parts)])
        else:
            from huggingface_hub import HfApi

            self.api = hub_api or HfApi(token=args.hf_token or None)
            base = Path(args.work_dir or "~/.cache/ocr-vllm-scripts/outputs").expanduser()
            if self.read_only:  # a folder that goes at exit
                self.scratch = tempfile.TemporaryDirectory(prefix="ocr-check-")
                base = Path(self.scratch.name)
            self.root = base / self.target.replace("/", "__")
        self.meta = self.root / ".ocr"
        self.made_root = self.kind == "local" and not self.root.exists()
        local_check = self.read_only and self.kind == "local"  # writes nothing to OUTPUT
        if not local_check:
            (self.root / "data").mkdir(parents=True, exist_ok=True)
            self.meta.mkdir(exist_ok=True)
        shard = f"shard-{args.shard_index}-of-{args.num_shards}"
        self.notes_name = f".ocr/notes/{shard}.json"
        self.notes: dict[str, dict] = {}  # part name -> part_note(), of the Hub's parts
        self.card_on_hub = self.created_manifest = False
        self.sent_parts = 0  # parts this run gave the Hub
        self.upload_failures: list[str] = []
        self.lock = take_lock(self.meta / f"lock-{shard}", self.location(), probe=local_check)
        self.journal = Journal(self.meta / "journal" / shard)
        self.remote_names: set[str] = set()  # data parts on the Hub
        self.keep_local: set[str] = set()  # staged parts with rows to redo
        self.shard_range, self.conflict = (0, 0), None
        self.queued: dict[str, Path] = {}  # path in repo -> local file, for the next commit
        self.commit_interval, self.sharded = 36.0 * max(1, args.num_shards), args.num_shards > 1
        self.last_commit, self.committing = -math.inf, None
        self.queue_lock = threading.Lock()
        if self.api is not None:
            if not self.read_only:
                self.api.create_repo(self.target, repo_type="dataset",
                                     private=args.private or None, exist_ok=True)
            self.sync_from_hub()

    def refuse_foreign(self, files) -> None:
        """Refused: an OUTPUT holding files besides ours: its card would go, or its rows mix."""
        ours = any(f == ".ocr/manifest.json" or f.startswith("data/part-") for f in files)
        if other := sorted(f for f in files if not (
                f == ".gitattributes" or f.startswith(".ocr/") or (f == "README.md" and ours)
                or (f.startswith("data/") and PART_NAME.match(f[len("data/"):])))):
            fail(f"OUTPUT {self.target} holds a dataset of its own ({', '.join(other[:3])}): "
                 f"this run would replace its card, or mix its rows. Write to a new "
                 f"{'folder' if self.api is None else 'repo'}, e.g. {shown_path(self.target)}-ocr")

    def download(self, name: str, local_dir: Path) -> Path:
        return Path(self.api.hf_hub_download(self.target, name, repo_type="dataset",
                                             local_dir=local_dir))

    def sync_from_hub(self) -> None:
        """The Hub is the truth, the staging folder a cache."""
        files = self.read_hub()
        self.refuse_foreign(files)
        if ".ocr/manifest.json" in files:
            hub = self.download(".ocr/manifest.json", self.meta / "hub")
            mine, theirs = self.manifest(), json.loads(hub.read_text())
            if mine and mine.get("run") != theirs.get("run"):
                log(f"{self.target} holds another run than {self.root}: clearing the latter")
                self.clear_local()
            (self.meta / "manifest.json").write_bytes(hub.read_bytes())
        elif (self.meta / "manifest.json").exists():  # its upload failed
            self.queued[".ocr/manifest.json"] = self.meta / "manifest.json"

    def read_hub(self, others_only: bool = False) -> set[str]:
        """The repo's files; its parts, card and notes (others_only: the other shards')."""
        try:
            files = set(self.api.list_repo_files(self.target, repo_type="dataset"))
        except Exception as exc:  # no repo yet: a run creates it, a check reads it as empty
            if not self.read_only or type(exc).__name__ != "RepositoryNotFoundError":
                raise
            files = set()
        self.remote_names |= {Path(f).name for f in files if f.startswith("data/") and not (
            others_only and self.in_shard(f))}  # one in this shard's rows: see commit
        self.card_on_hub = "README.md" in files
        for name in sorted(f for f in files if f.startswith(".ocr/notes/")):
            if not (others_only and name == self.notes_name):
                notes = json.loads(self.download(name, self.meta / "hub").read_text())
                self.notes.update({k: v for k, v in notes.items() if k in self.remote_names})
        return files

    def in_shard(self, name: str, whole: bool = False) -> bool:
        """Whether part `name` overlaps this shard's rows (whole: is within them)."""
        lo, hi = self.shard_range
        return any(lo <= a < b <= hi if whole else a < hi and lo < b
                   for a, b in ranges_from_names([name]))

    def fetch_part(self, name: str) -> Path:
        """A part only the Hub has, staged to redo its error rows here."""
        try:
            return self.download(f"data/{name}", self.root)
        except Exception as exc:
            fail(f"cannot download data/{name} from {self.target} ({type(exc).__name__}: "
                 f"{redact_text(str(exc))[:300]}). Nothing was sent; rerun the same command "
                 f"once the Hub answers.", EXIT_NOT_WRITTEN)

    def local_parts(self) -> list[Path]:
        return sorted((self.root / "data").glob("part-*.parquet"))

    def parts(self) -> list[tuple[tuple[int, int], Path | None]]:
        """((start, stop), local path or None) of every part."""
        local = {p.name: p for p in self.local_parts()}
        return [(r, local.get(part_name(*r))) for r in ranges_from_names(
            set(local) | self.remote_names)]

    def abandon(self) -> None:
        """A refused run removes the folder it made, if only its lock is in it."""
        if self.made_root and self.lock is not None and [
                p for p in self.root.rglob("*") if not p.is_dir()] == [Path(self.lock.name)]:
            shutil.rmtree(self.root, ignore_errors=True)

    def clear_local(self) -> None:
        """Journal first, manifest last: a kill half-way leaves no old rows to a new run."""
        shutil.rmtree(self.meta / "journal", ignore_errors=True)
        for path in self.local_parts() + [self.root / "README.md", self.meta / "manifest.json"]:
            path.unlink(missing_ok=True)

    def manifest(self) -> dict | None:
        path = self.meta / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else None

    def other_shards_rows(self) -> list[str]:
        """Parts outside this shard's rows, and other shards' journals with rows."""
        return [part_name(*r) for r, _ in self.parts() if not self.in_shard(part_name(*r), True)
                ] + [f".ocr/journal/{path.name}" for path in (self.meta / "journal").glob("*")
                     if path != self.journal.folder and any(path.glob("*.jsonl"))]

    def other_writers(self) -> list[str]:
        """The other shards a process writes right now (their locks held)."""
        running = []
        for path in sorted(self.meta.glob("lock-*")):
            if self.lock is None or path.name != Path(self.lock.name).name:
                with open(path, "a+") as other:
                    if holder := lock_holder(other):
                        running.append(f"{holder} writing {path.name[len('lock-'):]}")
        return running

    def restart(self, shard: str | None = None) -> None:
        """--restart: OUTPUT's rows, card and manifest go (only `shard`'s beside other shards)."""
        if self.read_only:
            return
        if shard is None and (running := self.other_writers()):
            fail(f"--restart removes every shard's rows, and {running[0]} of {self.location()}: "
                 f"stop it first")
        mine = {part_name(*r) for r, _ in self.parts()
                if shard is None or self.in_shard(part_name(*r), whole=True)}
        what = f"the {len(mine)} part(s) of {shard}" if shard else "the rows, card and manifest"
        log(f"--restart: removing {what} of {self.location()}")
        if self.api is not None:
            files = self.api.list_repo_files(self.target, repo_type="dataset")
            self.delete_on_hub([f for f in files if f == self.notes_name or Path(f).name in mine]
                               if shard else [f for f in files if f != ".gitattributes"],
                               f"Restart {shard or 'the OCR run'}")
            self.remote_names -= mine
        if not shard:
            self.clear_local()
        shutil.rmtree(self.journal.folder, ignore_errors=True)
        for name in mine:  # (the journal opens its file at its first row)
            (self.root / "data" / name).unlink(missing_ok=True)
            self.notes.pop(name, None)

    def delete_on_hub(self, files: list[str], message: str) -> None:
        from huggingface_hub import CommitOperationDelete

        if files:
            self.api.create_commit(self.target, repo_type="dataset", commit_message=message,
                                   operations=[CommitOperationDelete(f) for f in files])

    def write_manifest(self, manifest: dict, replace: bool = False) -> dict | None:
        """Record the run atomically; unless `replace`, only if OUTPUT has none, else return it."""
        if self.read_only:
            return None
        path = self.meta / "manifest.json"
        tmp = path.with_name(f".manifest.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(manifest, indent=1))
            os.replace(tmp, path) if replace else os.link(tmp, path)
        except FileExistsError:
            return json.loads(path.read_text())
        finally:
            tmp.unlink(missing_ok=True)
        self.created_manifest |= not replace
        if self.api is not None and not self.commit({".ocr/manifest.json": path}) \
                and self.conflict:
            fail(self.conflict)
        return None

    def forget_run(self) -> None:
        """A run that wrote nothing leaves no manifest (a degenerate stop, say)."""
        if self.created_manifest:
            (self.meta / "manifest.json").unlink(missing_ok=True)
            if self.api is not None:
                with self.queue_lock:
                    self.queued.pop(".ocr/manifest.json", None)
                with contextlib.suppress(Exception):  # left: a later run's --restart clears it
                    self.delete_on_hub([".ocr/manifest.json"], "Remove an empty run's manifest")

    def drop_stale_staged_parts(self) -> None:
        """The Hub's parts win over staged ones that overlap them, which are never resent."""
        for path in self.local_parts() if self.api is not None else []:
            (start, stop), = ranges_from_names([path.name])
            if self.in_shard(path.name) and any(
                    a < stop and start < b for a, b in ranges_from_names(self.remote_names)):
                path.unlink(missing_ok=True)

    def resend_local_parts(self) -> None:
        """Parts a killed or offline run of this shard left staged."""
        for path in self.local_parts():
            if self.in_shard(path.name) and path.name not in self.remote_names:
                self.publish(path)

    def publish(self, path: Path) -> None:
        """A part written (or rewritten) goes with the next commit."""
        if self.api is None:
            return
        with self.queue_lock:
            self.queued[f"data/{path.name}"] = path
            self.sent_parts += 1
        self.commit_if_due()

    def commit_if_due(self) -> None:
        with self.queue_lock:
            if not self.queued or self.committing and self.committing.is_alive() or \
                    time.monotonic() - self.last_commit < self.commit_interval:
                return
            files, self.queued = self.queued, {}
            self.last_commit = time.monotonic()
            self.committing = threading.Thread(target=self.commit, args=(files,), daemon=True)
            self.committing.start()

    def commit(self, files: dict) -> bool:
        """One commit of files and this shard's notes, retried; what fails is queued again."""
        from huggingface_hub import CommitOperationAdd

        parts = {Path(name).name: part_note(local, self.column)
                 for name, local in files.items() if name.startswith("data/")}
        notes = {k: v for k, v in {**self.notes, **parts}.items() if self.in_shard(k)}
        operations = [CommitOperationAdd(name, str(local)) for name, local in files.items()]
        if parts:  # a copy per commit: no note goes ahead of its part
            operations.append(CommitOperationAdd(self.notes_name, json.dumps(notes).encode()))
        for attempt in range(UPLOAD_ATTEMPTS):
            try:  # no lock reaches another container: a part in this shard's rows this run
                # neither found nor wrote stops it, and a commit after the check gets a 412
                head = self.api.repo_info(self.target, repo_type="dataset").sha
                if foreign := sorted(Path(f).name for f in self.api.list_repo_files(
                        self.target, repo_type="dataset", revision=head) if f.startswith("data/")
                        and Path(f).name not in self.remote_names and self.in_shard(f)):
                    lo, hi = self.shard_range
                    self.conflict = (f"another run is writing rows {lo}-{hi} of {self.target} at "
                                     f"the same time ({foreign[0]} appeared): stopping this one")
                    return False
                self.api.create_commit(self.target, operations=operations, repo_type="dataset",
                                       commit_message=f"Add {len(files)} file(s) (OCR)",
                                       parent_commit=head)
                break
            except Exception as exc:  # network, rate limit (429), a commit went first (412)
                after = str(getattr(getattr(exc, "response", None), "headers", {}).get(
                    "Retry-After"))
                wait = float(after) if after.isdigit() else \
                    UPLOAD_BACKOFF_S * 2 ** attempt * random.uniform(0.5, 1.0)
                last = attempt + 1 == UPLOAD_ATTEMPTS or wait > UPLOAD_MAX_WAIT_S
                log(f"commit of {len(files)} file(s) failed ({type(exc).__name__}: {exc}); "
                    + ("giving up on it for now" if last else f"retry in {wait:.0f} s"))
                if last:
                    with self.queue_lock:  # the final commit tries them again
                        self.queued = {**files, **self.queued}
                    return False
                time.sleep(wait)
        self.last_commit = time.monotonic()
        self.notes.update(notes)
        self.remote_names.update(parts)
        for name in parts.keys() - self.keep_local:  # on the Hub now
            (self.root / "data" / name).unlink(missing_ok=True)
        return True

    def finish(self, card) -> None:
        """The card (card(): its text), then (Hub) all queued files in one last commit."""
        if self.committing is not None:
            self.committing.join()
        card_failed = False
        if card is not None:
            try:
                (self.root / "README.md").write_text(card(), encoding="utf-8")
                self.queued["README.md"] = self.root / "README.md"
            except OSError as exc:  # the rows are written: a rerun writes it
                card_failed = self.api is not None  # exit 6: the card is not on the Hub
                log(f"error: cannot write the dataset card ({exc}); the rows written are kept. "
                    f"To write the card, {rerun_advice()}")
        files, self.queued = self.queued, {}
        if self.api is not None and files and not self.conflict and not self.commit(files):
            self.upload_failures = sorted(self.queued)
        # two shards ending at once: the card is remade till the last to finish counts them all
        for _ in range(3 if self.sharded and "README.md" in files and not (
                self.upload_failures or self.conflict) else 0):
            seen = set(self.remote_names)
            with contextlib.suppress(Exception):  # else it counts what this shard saw
                self.read_hub(others_only=True)
            if self.remote_names == seen:
                break
            (self.root / "README.md").write_text(card(), encoding="utf-8")
            if not self.commit({"README.md": self.root / "README.md"}):
                break
        if self.conflict:  # found during the run, or by this last commit
            log(f"error: {self.conflict}")
        elif self.upload_failures:
            log(f"{len(self.upload_failures)} file(s) did not reach the Hub; they are safe in "
                f"{self.root}. To upload them, {rerun_advice()}")
        self.upload_failures += ["README.md"] * card_failed

    def location(self) -> str:
        from huggingface_hub import constants  # HF_ENDPOINT's Hub

        return str(self.root) if self.kind == "local" else \
            f"{constants.ENDPOINT}/datasets/{self.target}"


# ---- saving.py: A finished row's path to disk: held failures, the part writer, the part files.
PART_NAME = re.compile(r"^part-(\d{9})-(\d{9})\.parquet$")


class HeldFailures:
    """Server failures held until a page is answered; too many in a row stop the run."""

    def __init__(self, who: str, pages: int, seconds: float, streak: str):
        self.who, self.pages, self.seconds, self.streak = who, pages, seconds, streak
        self.held: list = []  # (row, result), in the order they failed
        self.answered, self.since = False, 0.0

    def failed(self, index: int, result: RowResult) -> None:
        self.since = self.since if self.held else time.monotonic()
        self.held.append((index, result))
        took = time.monotonic() - self.since
        if len(self.held) >= self.pages and took >= self.seconds:
            self.stop(f"the last {len(self.held)} pages {self.streak.format(took)} "
                      f"(last: {result.error[:300]})")

    def at_end(self, writer: "PartWriter") -> None:
        """Write the rows held, or refuse a run that answered none (redone rows excepted)."""
        if not self.answered and any(i not in writer.redo for i, _ in self.held):
            self.stop(f"no page of this run was answered: {len(self.held)} failed on the "
                      f"{self.who}'s side (last: {self.held[-1][1].error[:300]})")
        for row in self.held:
            writer.add(*row)

    def stop(self, what: str) -> "NoReturn":  # noqa: F821
        raise RunAborted(f"{what}. Unanswered rows stay pending: once the {self.who} works "
                         f"(its log says why it fails), {rerun_advice()} to send them again.",
                         EXIT_REFUSED)


def finish_row(writer: "PartWriter", stats: "RunStats", held: HeldFailures, index: int,
               result: RowResult, latency: float | None = None, failed: str | None = None) -> None:
    """A page's answer: counted, cleaned up, judged, then written or held."""
    stats.loop_retried += (result.attempts or 1) - result.resent > 1
    stats.still_looping += loops(result.text, result.finish_reason)
    answered = result.error is None and result.skipped is None
    answer = result.text  # the first-pages check judges the model's answer, not the clean-up's
    if answered:
        try:  # the model's clean-up: what it raises is this row's error
            sized = (result.sent_size,) if POSTPROCESS_GETS_SIZE else ()
            result.text, result.extras = postprocess(result.text, writer.args, *sized)
        except Exception as exc:
            result = replace(exception_row(exc, PAGE, "post-processing failed: "),
                             digest=result.digest)
            answered = False
    stats.errors_seen += result.error is not None
    stats.latencies += [] if latency is None else [latency]
    stats.finished_at.append(time.monotonic())
    stats.tokens.append(result.completion_tokens or 0)
    if failed or result.error_kind == SERVER:
        return held.failed(index, result)
    rows = [(index, result)]
    if answered or latency is not None:  # an answer, or the engine's refusal (a 400)
        writer.check.observe(replace(result, text=answer) if answered else result, index)
    if answered:  # the rows held before it go too
        rows += held.held
        held.held, held.answered = [], True
    for row in rows:
        writer.add(*row)


def part_name(start: int, stop: int) -> str:
    return f"part-{start:09d}-{stop:09d}.parquet"


def ranges_from_names(names) -> list[tuple[int, int]]:
    matches = (PART_NAME.match(Path(name).name) for name in names)
    return sorted((int(m[1]), int(m[2])) for m in matches if m)


def output_features(source: InputSource, args):
    import datasets

    names, text = result_column_names(args.output_column), datasets.Value("string")
    features = datasets.Features({k: v for k, v in input_features(source).items()
                                  if k not in names and k != "inference_info"})
    image = features.get(source.image_column)  # a {bytes, path} struct: an Image of paths
    if isinstance(image, datasets.Image) or isinstance(image, dict) and set(image) == {
            "bytes", "path"}:
        features[source.image_column] = datasets.Image()
    if ROW_IDENTITY not in features:  # the input's (a stacked run's) is kept as it is
        features[ROW_IDENTITY] = text
    layout = [{"label": text, "box": [datasets.Value("int32")], "text": text}]  # box: x1 y1 x2 y2
    features.update(zip(names, [datasets.Value(kind) for kind in RESULT_FIELDS.values()] +
                        [layout if kind == "blocks" else datasets.Value(kind)
                         for kind in EXTRA_COLUMNS.values()]
                        + [text] * len(_TEXT_LAYER_COLUMNS)))
    features["inference_info"] = text
    return features


def result_columns(results: list, column: str) -> dict:
    values = [[getattr(r, name) for r in results] for name in RESULT_FIELDS] + \
        [[r.extras.get(suffix) for r in results] for suffix in EXTRA_COLUMNS] + \
        [[getattr(r, name) for r in results] for name in _TEXT_LAYER_COLUMNS]
    return dict(zip(result_column_names(column), values))


def write_parquet(path: Path, schema, tables) -> None:
    """Atomically: a kill leaves the old file or the new."""
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(str(tmp), schema) as writer:
            for table in tables:
                writer.write_table(table)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def row_identity(source: InputSource, index: int, cell, result: RowResult) -> str | None:
    """What row `index` was made from: an image's input_digest(), a PDF page's, its document's and
    `#page=N`; None: no bytes. Byte-identical pages share it, whatever their order or run."""
    pdf = source.pdf
    doc = None if pdf is None else index if pdf.per_document else int(pdf.doc[index])
    if doc is not None and pdf.is_pdf(doc):
        number = 0 if pdf.per_document else int(pdf.number[index])
        digest = pdf.digest(doc)
        return f"{digest}#page={number}" if digest and number else digest
    with contextlib.suppress(PageError):  # a failed row's bytes, when it has some
        return result.digest or input_digest(read_cell_bytes(cell))
    return None


def write_part(path: Path, source: InputSource, indices: list[int], results: list, features,
               info_entry: dict, args) -> None:
    import datasets
    import pyarrow as pa

    def table(rows: dict, results: list):
        encoded = features.encode_batch({**rows, **result_columns(results, args.output_column)})
        if isinstance(features.get(source.image_column), datasets.Image):  # as carried_image()
            encoded[source.image_column] = rows[source.image_column]  # made it, not a path alone
        return pa.Table.from_pydict(encoded, schema=features.arrow_schema)

    def tables():
        for at in range(0, len(indices), 32):  # 32 rows' images in memory
            rows, part = input_rows(source, indices[at:at + 32]), results[at:at + 32]
            batch = {k: v for k, v in rows.items() if k in features}
            batch["inference_info"] = [append_info(info, info_entry) for info in
                                       rows.get("inference_info") or [None] * len(part)]
            if ROW_IDENTITY not in rows:  # this run's, unless its input (a stacked run) had one
                cells = rows.get(source.image_column) or [None] * len(part)
                batch[ROW_IDENTITY] = [row_identity(source, i, cell, result) for i, cell, result
                                       in zip(indices[at:at + 32], cells, part)]
            for i, cell in enumerate(batch.get(source.image_column) or []):
                batch[source.image_column][i], part[i] = carried_image(cell, part[i])
            try:
                done = table(batch, part)
            except Exception:  # find the rows at fault: encode each alone
                for i, result in enumerate(part):
                    try:
                        table({k: v[i:i + 1] for k, v in batch.items()}, [result])
                    except Exception as exc:
                        part[i] = exception_row(exc, PAGE, "the result cannot be stored: ")
                done = table(batch, part)
            results[at:at + 32] = part
            yield done

    write_parquet(path, features.arrow_schema, tables())


def carried_image(cell, result: RowResult):
    """The cell with its file embedded; a failed row's unreadable image is left out."""
    from PIL import Image

    if isinstance(cell, dict) and cell.get("bytes") is None and cell.get("path"):
        try:
            file = _resolve_image_path(cell["path"])
            cell = {"bytes": file.read_bytes(), "path": file.name}
        except (OSError, PageError):  # the row's error says why
            return None, result
    if result.error is None or not isinstance(cell, dict) or cell.get("bytes") is None:
        return cell, result
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Image.open(io.BytesIO(cell["bytes"])).load()
        return cell, result
    except Exception:
        return None, error_row(f"{result.error} (its image cannot be decoded: left out)", PAGE)


def replace_rows(path: Path, redone: dict, features, args) -> None:
    """A part rewritten with redone rows' results: a row is never in two parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(str(path))
    start = ranges_from_names([path.name])[0][0]
    for name, values in result_columns(list(redone.values()), args.output_column).items():
        column = table.column(name).to_pylist()
        for row, value in zip(redone, values):
            column[row - start] = value
        at, field = table.column_names.index(name), features.arrow_schema.field(name)
        table = table.set_column(at, field, pa.array(column, field.type))
    write_parquet(path, table.schema, [table])


def append_info(old, entry: dict) -> str:
    try:
        history = json.loads(old) if old and isinstance(old, str) else list(old or [])
    except (ValueError, TypeError):
        history = [{"unparsed": str(old)}]
    return json.dumps((history if isinstance(history, list) else [history]) + [entry],
                      ensure_ascii=False)


class PartWriter:
    """Finished rows go to the journal at once, to parts once the degenerate check passed."""

    def __init__(self, store: OutputStore, source: InputSource, plan: RowPlan, features,
                 info_entry: dict, check: "DegenerateCheck", args):
        self.store, self.source, self.features = store, source, features
        self.info_entry, self.check, self.args = info_entry, check, args
        self.redo = dict(plan.redo)  # row -> part holding its error row, until replaced
        self.results: dict[int, RowResult] = dict(plan.recovered)  # finished, in no part yet
        self.left = Counter(map(self._group, plan.pending))  # group -> its rows not finished
        self.complete = set(map(self._group, self.results)) - set(self.left)
        self.lock, self.last_flush = threading.Lock(), time.monotonic()
        self.rows_ok = self.rows_failed = self.rows_text_layer = 0  # rows_ok holds text_layer
        self.rows_blank = 0  # and blank pages (an empty text: an ok row)
        self.write_errors: list[str] = []
        self.open_documents: dict[int, dict] = {}  # --per-document: doc -> its pages finished
        for index, result in plan.pages.items():
            self.add(index, result, journaled=True)

    def _group(self, index: int):  # the part its error row is in, or its block
        return self.redo.get(index) or index // self.args.part_rows

    def add(self, index: int, result: RowResult, journaled: bool = False) -> None:
        pdf, pages = self.source.pdf, {}
        if pdf is not None and pdf.per_document:  # a page: its document's row once all are in
            if not journaled:
                self.store.journal.append(-1 - index, result)
            doc = int(pdf.doc[index])
            pages = self.open_documents.setdefault(doc, {})
            pages[index] = result
            if len(pages) < len(pdf.rows_of(doc)):
                return
            del self.open_documents[doc]
            result = joined_pages([(int(pdf.number[i]), pages[i]) for i in sorted(pages)])
            index = doc
        self.store.journal.append(index, result)
        if pages and result.error is None:  # else a rerun redoes only the failed pages
            self.store.journal.written([-1 - i for i in pages])
        with self.lock:
            self.results[index] = result
            group = self._group(index)
            self.left[group] -= 1
            if not self.left[group]:
                self.complete.add(group)

    def due(self) -> bool:
        return self.check.passed() and bool(self.results) and (
            bool(self.complete) or time.monotonic() - self.last_flush >= self.args.part_seconds)

    def flush(self, final: bool = False) -> None:
        """The complete groups, each as a part; every finished row once due, or final."""
        everything = final or time.monotonic() - self.last_flush >= self.args.part_seconds
        with self.lock:
            groups, self.complete = self.complete, set()
            rows = sorted(i for i in self.results if everything or self._group(i) in groups)
        for path, run in itertools.groupby(enumerate(rows), lambda p: self.redo.get(p[1]) or (
                p[1] - p[0], p[1] // self.args.part_rows)):
            run = [i for _, i in run]
            results = [self.results[i] for i in run]  # one no column can hold becomes its error
            try:
                if isinstance(path, Path):
                    replace_rows(path, dict(zip(run, results)), self.features, self.args)
                else:
                    path = self.store.root / "data" / part_name(run[0], run[-1] + 1)
                    write_part(path, self.source, run, results, self.features,
                               self.info_entry, self.args)
            except Exception as exc:
                self.write_errors.append(f"cannot write {path.name}: {type(exc).__name__}: {exc}")
                log(f"error: {self.write_errors[-1]}; its rows are kept and written again later")
                everything = True  # the next attempt after --part-seconds
                continue
            with self.lock:
                for index in run:
                    self.results.pop(index, None)
                    self.redo.pop(index, None)
            self.rows_ok += sum(r.error is None for r in results)
            self.rows_failed += sum(r.error is not None for r in results)
            self.rows_text_layer += sum(r.skipped is not None and r.attempts == 0 and
                                        not is_blank_row(r) for r in results)
            self.rows_blank += sum(map(is_blank_row, results))
            self.store.journal.written(run)
            if any(r.error_kind == SERVER for r in results):
                self.store.keep_local.add(path.name)  # a rerun here redoes them
            self.store.publish(path)
        if everything:
            self.last_flush = time.monotonic()


# ---- manifest.py: What one run is: the identity a rerun must match, in OUTPUT's manifest.
# The version of what OUTPUT records (manifest, journal, notes): another version is refused.
MANIFEST_FORMAT = 2  # 2: parts hold ROW_IDENTITY and <column>_skipped, notes list blank rows

# Engine flags that change speed and memory, never the text: the rest of the engine is identity
SPEED_ONLY_ENGINE_FLAGS = set("""gpu-memory-utilization data-parallel-size tensor-parallel-size
    pipeline-parallel-size api-server-count speculative-config max-num-seqs max-num-batched-tokens
    host port enforce-eager swap-space kv-cache-memory""".split())


def input_identity(args, files: list | None) -> dict:
    """A Hub dataset at its revision, or the files read: names, sizes, hashes (not of images)."""
    if files is None:
        return {"hub": args.input, "revision": hub_dataset_sha(args) or args.revision}
    local, entries, images = Path(args.input).expanduser(), [], image_extensions()
    for path in files:
        entry = str(path.relative_to(local) if path != local else path.name)
        try:
            entry += f" {path.stat().st_size} B"
            if path.suffix.lower() not in images:
                entry += f" #{hashlib.sha1(file_tail(path)).hexdigest()[:12]}"
        except OSError:  # a broken link: its row says it cannot be read
            entry += " unreadable"
        entries.append(entry)
    text = "\n".join(entries).encode("utf-8", "surrogateescape")
    identity = {"files": len(files), "digest": hashlib.sha256(text).hexdigest()[:20]}
    return {**identity, "list": entries} if len(entries) <= 2000 else identity  # names changes


def hub_dataset_sha(args) -> str | None:
    with contextlib.suppress(Exception):  # offline, or private without a token: datasets says so
        from huggingface_hub import HfApi

        return HfApi(token=args.hf_token or None).dataset_info(
            args.input, revision=args.revision, timeout=10).sha
    return None


def check_context_budget(max_model_len, args, option: str = "--max-model-len in --serve-args"
                         ) -> None:
    """Image tokens + max_tokens must fit the context (None: unknown), else every page fails."""
    budget = image_token_budget(args)
    need, room = budget + args.max_tokens, int(max_model_len or 0) - budget
    if max_model_len and need > int(max_model_len):
        advice = f"Lower --max-tokens to at most {room}, or raise" if room > 0 else \
            f"The largest page alone needs {budget} prompt tokens: raise"
        raise RunAborted(f"--max-tokens {args.max_tokens} plus {budget} prompt tokens (the largest "
                         f"page) is {need}, over max_model_len {max_model_len}: every request "
                         f"would be refused. {advice} {option} to at least {need}.", EXIT_USAGE)


def inference_info_entry(args, model_revision: str | None, **engine) -> dict:
    """This run's inference_info entry; engine: the shape's serve_args or llm_kwargs, redacted."""
    return {"model": args.model, "model_revision": model_revision, "script": script_name(),
            "shape": SCRIPT_SHAPE, "image": JOB_IMAGE, **engine,
            "column": args.output_column, "settings": run_settings(args)}  # plan_run stamps it


def run_settings(args) -> dict:
    """The model's settings and the loop retry's: what the card, inference_info and manifest say."""
    return {**inference_settings(args), "loop_retries": args.loop_retries,
            "loop_temperature": LOOP_TEMPERATURE,
            "repetition_detection": repetition_detection(args)}


def run_identity(args, source: InputSource, engine: dict) -> dict:
    """What a rerun must repeat: the input, options declared identity=True, the engine's flags."""
    options = {k: v for k, v in sorted(vars(args).items()) if _IDENTITY[k]
               and (k != "seed" or args.shuffle)}
    flags = {k.lstrip("-").replace("_", "-"): v for k, v in engine.items()}
    pdf = {"pdf": source.pdf.fingerprint()} if source.pdf is not None else {}
    return redact_value({  # a secret is no part of what the run is: a new token, the same run
        "script": script_name(), "input": input_identity(args, source.files), **pdf,
        "rows": source.rows_full, "options": options, "settings": run_settings(args), "engine": {
            k: v for k, v in sorted(flags.items()) if k not in SPEED_ONLY_ENGINE_FLAGS}}, None)


def run_digest(identity: dict, args) -> str:
    """The manifest's identity and --max-samples in 16 hex digits (ocr-jobs.py's Jobs label)."""
    text = json.dumps({"identity": identity, "max_samples": args.max_samples}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity_differences(old, new, where: str = "") -> list[str]:
    """Each difference between two identities, named (an option by its flag)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new), key=str)
                if key != "digest" or "list" not in old or "list" not in new  # the lists say more
                for line in identity_differences(old.get(key), new.get(key), (
                    f"--{key.replace('_', '-')}" if where == "options" else f"{where}.{key}"
                    ).lstrip("."))]
    if where == "input.list" and isinstance(old, list) and isinstance(new, list):
        changed = sorted(set(old) ^ set(new))  # a file renamed or changed: twice
        return [f"input files gone, new or changed: {', '.join(changed[:4])}"
                f"{f', ... ({len(changed)} in all)' * (len(changed) > 4)}"]
    return [f"{where}: was {json.dumps(old)}, now {json.dumps(new)}"]


def pinned_input(store: "OutputStore", args):
    """A rerun without --revision (not a whole --restart) reads the Hub input the first read."""
    if args.revision is None and not (args.restart and args.num_shards == 1):
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            args.revision = store.manifest()["identity"]["input"].get("revision")
    return args


def check_same_run(recorded: dict | None, identity: dict, store: "OutputStore", args,
                   pdf: "PdfPages | None" = None) -> None:
    """Refused, each difference named, unless OUTPUT's manifest is of this format and run."""
    def way_out(restart: str) -> str:  # no --restart deletes other shards' rows
        others = store.other_shards_rows() + store.other_writers() if args.num_shards > 1 else []
        return f"write to a new OUTPUT (other shards' rows are in it: {others[0]}, and a " \
            f"shard's --restart redoes its own rows only)" if others else restart

    version = (recorded or {}).get("format", 0)
    if version != MANIFEST_FORMAT:
        newer = isinstance(version, int) and version > MANIFEST_FORMAT
        fail(f"OUTPUT {store.location()} was written by {'a newer' if newer else 'an older'} "
             f"version of this script (manifest format {version}): " + (
                 "update the script (fetch it again from its URL) and rerun." if newer else
                 way_out("pass --restart to redo the run, or write to a new OUTPUT") + "."))
    before, now = recorded.get("max_samples"), args.max_samples
    longer = args.num_shards == 1 and (now is None or (before is not None and now > before))
    was = (recorded.get("identity") or {}).get("pdf")
    if pdf is not None and isinstance(was, str):  # recorded before the count was: its digest
        identity = {**identity, "pdf": pdf.fingerprint()["digest"]}
    elif pdf is not None and longer and isinstance(was, dict) and \
            isinstance(was.get("documents"), int):  # more documents: the first ones the same
        identity = {**identity, "pdf": pdf.fingerprint(was["documents"])}
    problems = identity_differences(recorded.get("identity"), identity)
    if before != now and not longer:  # the same order, longer
        problems.append(f"--max-samples: was {before}, now {now} (only a larger one, on an "
                        f"unsharded run)")
    if problems:
        advice = way_out("write to another OUTPUT, or pass --restart to delete what OUTPUT "
                         "holds and start it over")
        fail(f"OUTPUT {store.location()} holds another run, so resuming into it would mix "
             f"two runs:\n  " + "\n  ".join(problems) + f"\n{advice[0].upper()}{advice[1:]}.")


def claim_output(store: "OutputStore", identity: dict, args,
                 pdf: "PdfPages | None" = None) -> None:
    """The first run of an OUTPUT records what the run is; every later one must be the same."""
    identity = json.loads(json.dumps(identity))  # as it reads back
    rows, running = (store.other_shards_rows(), store.other_writers()) \
        if args.restart and args.num_shards > 1 else ([], [])
    if args.restart and not rows + running:
        store.restart()
    elif store.manifest() is not None or (rows if args.restart else store.parts()):
        check_same_run(store.manifest(), identity, store, args, pdf)
    if rows + running:  # a shard's --restart redoes its rows only, as the same run
        store.restart(f"shard {args.shard_index} of {args.num_shards}")
    existing = store.write_manifest({
        "format": MANIFEST_FORMAT, "identity": identity, "max_samples": args.max_samples,
        "row_identity": ROW_IDENTITY,  # the column ocr-compare.py pairs rows by
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": os.urandom(8).hex()})  # a run restarted in the same second is another
    if existing is not None:  # another run (a shard, a rerun) recorded it: this one must match
        check_same_run(existing, identity, store, args, pdf)
        if existing.get("max_samples") != args.max_samples:  # and what the longer run reads
            store.write_manifest({**existing, "max_samples": args.max_samples,
                                  "identity": identity}, replace=True)


# ---- stats.py: The run's figures: pages, rates, memory; for --stats-json and the card.
def proc_bytes(path: str, key: str) -> int | None:
    """A "key: N kB" line of a /proc file (Linux), in bytes; None without it."""
    with contextlib.suppress(OSError, TypeError):  # no such file, or no such line
        return int(re.search(rf"^{key}:\s*(\d+)", Path(path).read_text(), re.M)[1]) * 1024
    return None


def peak_rss_bytes() -> int:
    """Peak resident memory: /proc's VmHWM (ru_maxrss counts the parent's too, before exec)."""
    return proc_bytes("/proc/self/status", "VmHWM") or \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RunStats:
    shape_keys: tuple = ()  # a shape's own keys (the saturate block's): null until it sets them

    def __init__(self, rows_total: int, rows_skipped: int):
        self.started, self.first_started = time.monotonic(), None  # first: a page went in
        self.rows_total, self.rows_skipped = rows_total, rows_skipped
        self.rows_ok = self.rows_failed = 0  # rows written, error rows included (by the writer)
        self.rows_text_layer = 0  # rows written from their PDF text layer, not sent
        self.rows_blank = 0  # of rows_ok: blank pages, not sent (an empty text)
        self.rows_recovered = 0  # rows written from a killed run's journal
        self.errors_seen = self.in_flight = self.peak_in_flight = 0
        self.loop_retried = self.still_looping = 0
        self.latencies, self.finished_at, self.tokens = [], [], []
        self.server_startup_s = self.vllm_version = None
        self.extra: dict = {}

    def enter(self) -> None:
        self.first_started = self.first_started or time.monotonic()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1

    def as_dict(self) -> dict:
        elapsed, done, ordered = time.monotonic() - self.started, len(self.finished_at), \
            sorted(self.latencies)
        active = done and self.first_started and self.finished_at[-1] - self.first_started
        a, b = done // 10, done - done // 10 - 1  # the middle 80%: no start-up, no tail
        span = done >= 2 and self.finished_at[b] - self.finished_at[a]

        def rounded(value, digits=4):
            return round(value, digits) if value else None

        return {
            "rows_total": self.rows_total, "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed, "rows_skipped": self.rows_skipped,
            "rows_text_layer": self.rows_text_layer, "rows_blank": self.rows_blank,
            "rows_not_written": self.rows_total - self.rows_ok - self.rows_failed
            - self.rows_skipped - self.rows_text_layer, "rows_recovered": self.rows_recovered,
            "elapsed_s": round(elapsed, 3), "active_s": rounded(active, 3),
            "pages_per_s": round(done / elapsed, 4) if elapsed > 0 else None,
            "pages_per_s_steady": rounded(span and (b - a) / span),
            "completion_tokens_per_s": rounded(span and sum(self.tokens[a + 1:b + 1]) / span, 2),
            "latency_p50_s": rounded(ordered and ordered[int(0.5 * len(ordered))]),
            "latency_p95_s": rounded(ordered and ordered[int(0.95 * len(ordered))]),
            # Little's law: how full the driver kept the server, whatever the server's speed
            "mean_in_flight": rounded(active and sum(ordered) / active, 2),
            "peak_in_flight": self.peak_in_flight,
            "pages_loop_retried": self.loop_retried, "pages_still_looping": self.still_looping,
            "peak_rss_bytes": peak_rss_bytes(),
            "server_startup_s": self.server_startup_s, "vllm_version": self.vllm_version,
            **dict.fromkeys(self.shape_keys), **self.extra,
        }


def write_stats(stats: dict, args) -> None:
    """--stats-json; a file that cannot be written is a warning with the stats in the log."""
    if args.stats_json:
        path = Path(args.stats_json).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stats, indent=2))
        except OSError as exc:
            log(f"warning: cannot write --stats-json {args.stats_json} ({exc.strerror or exc}); "
                f"the stats: {json.dumps(stats)}")


# ---- jobs_command.py: The Hugging Face Jobs command that runs this script, printed or in the card.
def rerun_advice() -> str:
    """How to finish a run that has written rows: the same command, but not --restart."""
    return "rerun the same command" + (" without --restart (with it, the run starts over)"
                                       if was_given("restart") else "")


def jobs_spec() -> dict:
    """Jobs image, flavor, timeout, secrets: the header's [tool.hf-jobs], else its `hf jobs run`."""
    text = ""
    with contextlib.suppress(OSError, NameError):
        text = Path(__file__).read_text(encoding="utf-8")
    header = re.search(r"^# /// script$(.*?)^# ///$", text, re.M | re.S)
    table = header and re.search(r"^# \[tool\.hf-jobs\]$(.*?)(?=^# \[|\Z)", header[1], re.M | re.S)
    spec = {"image": JOB_IMAGE, "secrets": ["HF_TOKEN"]}
    if table:  # TOML strings and string lists, as JSON reads them
        spec.update({key: json.loads(value) for key, value in
                     re.findall(r"^# ([\w-]+) = (.+)$", table[1], re.M)})
    elif command := re.search(r"^\s*hf jobs run (.*)$", (__doc__ or "").replace("\\\n", " "), re.M):
        for name, values, _ in flag_items(shlex.split(command[1].split(" -- ")[0])):
            if name in ("--flavor", "--timeout", "--secrets") and values:
                spec[name[2:]] = values[:1] if name == "--secrets" else values[0]
    return spec


def script_url() -> str | None:
    """The URL of `uv run URL` when this is uv's temp copy (uv still holds it), unless secret."""
    if script_name() == Path(sys.argv[0]).name:
        return None
    words: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = Path(f"/proc/{os.getppid()}/cmdline")
        words = proc.read_bytes().decode(errors="replace").split("\0") if proc.exists() else \
            subprocess.run(["ps", "-o", "command=", "-p", str(os.getppid())], capture_output=True,
                           text=True, timeout=5).stdout.split()
    return next((word for word in words if re.match(r"https?://", word) and redact_text(word) ==
                 word and word.split("?")[0].endswith("/" + script_name())), None)


def script_reference(in_card: bool = False) -> str:
    """The script as a Jobs command names it: its URL, else its path as run (relative if inside)."""
    path = Path(sys.argv[0])
    if (url := script_url()) or in_card:
        return url or script_name()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd()) if path.is_absolute() else path
    return str(path)


def job_arguments(argv: list[str] | None = None) -> list[str]:
    """This run's arguments for a Job: secrets and this machine's options dropped."""
    places, options = [], []
    for name, values, _ in flag_items(redact_argv(_RUN_ARGV if argv is None else argv, None)):
        if name is None:  # INPUT, OUTPUT
            hub = REPO_ID.match(values[0]) and not Path(values[0]).expanduser().exists()
            places.append(values[0] if hub else ("INPUT", "OUTPUT")[len(places) % 2])
        elif values != [""] and name not in _THIS_MACHINE:
            options += [name, *values]
    return places + options


def jobs_command(argv: list[str] | None = None, in_card: bool = False) -> str:
    """This run as one Hugging Face Job (jobs_spec()'s image, flavor...; the token a Job secret)."""
    spec, script = jobs_spec(), script_reference(in_card)
    head = [word for key in ("flavor", "timeout") if spec.get(key) for word in (
        f"--{key}", os.environ.get("JOB_FLAVOR") or spec[key] if key == "flavor" else spec[key])]
    head += [word for secret in spec["secrets"] for word in ("--secrets", secret)]
    if IMAGE_HAS_UV:
        return shlex.join(["hf", "jobs", "uv", "run", "--image", spec["image"], *head, script,
                           *job_arguments(argv)])
    url = script if re.match(r"https?://", script) else f"<raw URL of {script_name()}>"
    inner = f'pip install -q uv && uv run "$SCRIPT_URL" {shlex.join(job_arguments(argv))}'
    return shlex.join(["hf", "jobs", "run", *head, "--env", f"SCRIPT_URL={url}", spec["image"],
                       "--", "bash", "-lc", inner])


def timeout_note(spec: dict) -> str:
    """What the Jobs command's --timeout covers: pages at the rate measured on its flavor."""
    timeout, flavor = spec.get("timeout", "30m"), os.environ.get("JOB_FLAVOR") or spec.get("flavor")
    size = re.fullmatch(r"([\d.]+)([smhd]?)", timeout)
    seconds = float(size[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[size[2]] \
        if size else 1800
    rate = JOB_PAGES_PER_S if flavor == spec.get("flavor") else None
    cover = f"about {int((seconds - 900) * rate // 1000 * 1000):,} pages at the {rate} pages/s " \
        f"measured on {flavor} (15 min of start-up left out)" if rate else \
        f"an unknown number of pages (no rate was measured on {flavor}: time a --max-samples " \
        f"run first)"
    return f"--timeout {timeout} (Jobs stop a job after 30 min unless told) covers {cover}; " \
        f"give a larger input a longer --timeout, or --num-shards N --shard-index i (one Job each)."


def jobs_notes(argv: list[str] | None = None, in_card: bool = False) -> list[str]:
    """What jobs_command's command covers, what to fill in, and the launcher when it is here."""
    words, script = job_arguments(argv), script_reference(in_card)
    notes = [timeout_note(jobs_spec())]
    if "INPUT" in words[:2]:
        notes.append("A Job cannot read INPUT on this machine: push it first (`hf upload "
                     "user/name FOLDER --repo-type dataset`) and give that dataset id for INPUT.")
    if "OUTPUT" in words[:2]:
        notes.append("A Job's disk goes when it ends: give a Hub dataset id for OUTPUT "
                     "(--private keeps it private).")
    by_url = re.match(r"https?://", script)
    if in_card and IMAGE_HAS_UV and not by_url:
        notes.append(f"Run it from the folder that holds {script}, or give its URL in its place.")
    if not IMAGE_HAS_UV and not by_url:
        notes.append(f"The image has no uv, so the Job fetches the script: put the raw URL of "
                     f"{script_name()} in place of <raw URL of {script_name()}>.")
    if not by_url and (Path(sys.argv[0]).resolve().parent / "ocr-jobs.py").is_file():
        launcher = str(Path(script).with_name("ocr-jobs.py"))
        notes.append(f"For many pages, ocr-jobs.py (beside this script) runs N Jobs into one "
                     f"OUTPUT, resubmits a shard left unfinished and prints the cost: `uv run "
                     f"{shlex.join([launcher, script])} INPUT OUTPUT --shards N` and the options "
                     f"above (--dry-run first: the Jobs, time and cost).")
    return notes


def jobs_advice(argv: list[str] | None = None) -> str:
    """The Jobs command for this run and its notes, as a message prints them."""
    return "\n".join([f"  {jobs_command(argv)}", *(f"* {note}" for note in jobs_notes(argv))])


# ---- card.py: The dataset card: what ran, on what, with what result; metadata for Hub search.
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


# ---- arguments.py: The command line: the options every script shares, their checks, the argv.
_RUN_ARGV: list = []  # this run's arguments, one word each (parse_arguments): a rerun's, a Job's
_IDENTITY: dict = {}  # each option's dest: whether option() declared it part of the run's identity
_THIS_MACHINE: set = set()  # the flags option() declared this machine's: not in a Job's command
_GIVEN: set = set()  # the dests of the options the command line gave (not defaults)


def option(group, *flags, identity: bool, this_machine: bool = False, at_least=None, above=None,
           **kwargs) -> argparse.Action:
    """add_argument, saying if the option is part of the run's identity, if it is about this
    machine only (a Job's command leaves it out); at_least, above: bounds."""
    action = group.add_argument(*flags, **kwargs)
    action.identity, action.this_machine = identity, this_machine
    action.at_least, action.above = at_least, above
    return action


def argument_parser(doc: str, add_shape_arguments) -> argparse.ArgumentParser:
    """Every option of a script; no abbreviations: `--hf-tok` would escape redaction."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1] + "\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    option(parser, "input", identity=False, help="Hub dataset id, or a local folder of images "
           "and/or PDFs, a .pdf, .parquet or save_to_disk folder")  # input_identity says it
    option(parser, "output", identity=False, help="Hub dataset id or local folder (./name, /path)")
    group = parser.add_argument_group("input")
    option(group, "--config", identity=True, help="dataset config (subset) of a Hub INPUT")
    option(group, "--split", identity=True, default="train", help="split to read (default: train)")
    option(group, "--revision", identity=False, help="Hub INPUT revision (branch, tag or commit)")
    option(group, "--image-column", identity=True, default="image", help="the page image's column")
    option(group, "--max-samples", type=int, at_least=1, identity=False,
           help="the first N rows (PDFs: N documents)")
    option(group, "--shuffle", identity=True, action="store_true",
           help="shuffle rows before --max-samples")
    option(group, "--seed", identity=True, type=int, default=42, help="shuffle seed (default: 42)")
    option(group, "--num-shards", identity=True, type=int, at_least=1, default=1,
           help="N contiguous ranges, one a Job")
    option(group, "--shard-index", type=int, at_least=0, default=0, identity=False,
           help="which range this run does")
    group = parser.add_argument_group("PDF input", "each page of a PDF is one row")
    option(group, "--pdf-column", identity=True, help="the column holding PDFs, when not detected")
    option(group, "--pages", identity=True,
           help="pages of each PDF, 1-based, e.g. 1-5,8,10- (default: all)")
    option(group, "--pdf-dpi", type=float, default=PDF_DPI, identity=True,
           help=f"render DPI, {PDF_MIN_DPI} to {PDF_MAX_DPI} (default: {PDF_DPI})")
    option(group, "--per-document", action="store_true", identity=True,
           help="one row per PDF: its pages' texts, each after <!-- page N -->")
    option(group, "--text-layer", action="store_true", identity=True,
           help="add <column>_text_layer: the text embedded in each PDF page")
    option(group, "--skip-text-pages", type=int, at_least=1, metavar="N", identity=True,
           help="keep the text layer of a page with N non-space characters, unsent")
    option(group, "--pdf-workers", type=int, at_least=1, default=min(4, os.cpu_count() or 1),
           identity=False, help="processes rendering PDF pages (default: up to 4)")
    option(group, "--pdf-page-timeout", type=float, above=0, default=120.0, identity=False,
           help="seconds a page may render before it is an error row (default: 120)")
    group = parser.add_argument_group("output")
    option(group, "--output-column", default="markdown", identity=True,
           help="column for the text, and its diagnostics' prefix (default: markdown)")
    option(group, "--overwrite", action="store_true", identity=False,
           help="replace result columns that the input already has")
    option(group, "--restart", action="store_true", identity=False, this_machine=True,
           help="delete this shard's rows in OUTPUT and start over")
    option(group, "--retry-errors", action="store_true", identity=False, help="redo the error rows")
    option(group, "--send-blank", action="store_true", identity=False,
           help="send blank pages too (by default written unsent: an empty text, <column>_skipped "
           "says so); a rerun with it sends the pages an earlier run skipped as blank")
    option(group, "--private", action="store_true", identity=False, help="create the repo private")
    option(group, "--hf-token", identity=False, help="Hub token (default: HF_TOKEN or your login)")
    option(group, "--work-dir", identity=False, this_machine=True,
           help="staging folder for Hub output")
    option(group, "--part-rows", type=int, at_least=1, default=250, identity=False,
           help="rows per parquet part (default: 250)")
    option(group, "--part-seconds", type=float, above=0, default=300.0, identity=False,
           help="write (and commit) finished rows at least this often (default: 300)")
    option(group, "--stats-json", identity=False, this_machine=True,
           help="write the run's stats as JSON to this path")
    option(group, "--check-only", action="store_true", identity=False,
           help="check the arguments, INPUT and OUTPUT; write nothing")
    group = parser.add_argument_group("model")
    option(group, "--model", default=MODEL_ID, identity=True,
           help=f"model id or path (default: {MODEL_ID})")
    option(group, "--model-revision", identity=True, help="sha, tag or branch of the weights")
    option(group, "--max-tokens", type=int, at_least=1, default=DEFAULT_MAX_TOKENS, identity=True,
           help=f"generation budget per page (default: {DEFAULT_MAX_TOKENS})")
    option(group, "--no-sanity-check", action="store_true", identity=False,
           help="do not stop when the first pages all come back degenerate")
    option(group, "--sanity-pages", type=int, at_least=1, default=8, identity=False,
           help="pages the degenerate-output check looks at (default: 8)")
    option(group, "--loop-retries", type=int, at_least=0, default=1, identity=False,  # settings
           help="send a looping page again, up to N times (default: 1)")
    option(group, "--repetition-detection", action=argparse.BooleanOptionalAction, identity=True,
           default=REPETITION_DETECTION_ON, help="let vLLM end a loop (it costs engine time)")
    add_shape_arguments(parser)
    add_model_arguments(parser)
    return parser


def was_given(dest: str) -> bool:
    """Whether the command line gave this option, rather than its default taking its place."""
    return dest in _GIVEN


def argument_word(action: argparse.Action, value) -> str:
    """A parsed argument as one word: a value, a flag (--x, or --no-x), --option=value."""
    if not action.option_strings:  # a path given after `--` as it starts like an option: ./-x
        return f"./{value}" if str(value).startswith("-") else str(value)
    if action.nargs == 0:
        return action.option_strings[-1 if value is False else 0]
    return f"{action.option_strings[0]}={value}"


def parse_arguments(doc: str, argv: list[str] | None, add_shape_arguments, shape_problems):
    """argv parsed and every argument checked before anything is read, started or created."""
    parser = argument_parser(doc, add_shape_arguments)
    words, argv = list(sys.argv[1:] if argv is None else argv), []
    while words:  # --serve-args "--enforce-eager": one flag as the value (argparse wants =)
        argv.append(words.pop(0))
        if argv[-1] in parser._option_string_actions.keys() & {"--serve-args"} and words and \
                words[0].startswith("-"):
            argv[-1] += "=" + words.pop(0)

    def error(message: str) -> "NoReturn":  # noqa: F821  (through log: argparse echoes values)
        parser.print_usage(sys.stderr)
        fail(message)

    parser.error = error
    args = parser.parse_args(argv)
    for action in parser._actions:  # parsed again without defaults: only the arguments given,
        action.default = argparse.SUPPRESS  # INPUT and OUTPUT, then the options in their order
    actions = {action.dest: action for action in parser._actions}
    _IDENTITY.update({dest: actions[dest].identity for dest in vars(args)})  # each declared
    _THIS_MACHINE.update(flag for action in parser._actions if getattr(action, "this_machine", 0)
                         for flag in action.option_strings)
    parsed = vars(parser.parse_args(argv))
    _GIVEN.update(parsed)
    _RUN_ARGV[:] = [argument_word(actions[dest], parsed[dest]) for dest in
                    sorted(parsed, key=lambda dest: bool(actions[dest].option_strings))]
    given = [(actions[dest], value) for dest, value in vars(args).items() if value is not None]
    problems = [f"{a.option_strings[0]} must be at least {a.at_least}, got {value}"
                for a, value in given if a.at_least is not None and value < a.at_least]
    problems += [f"{a.option_strings[0]} must be above {a.above}, got {value}"
                 for a, value in given if a.above is not None and not value > a.above]
    if args.shuffle and args.seed < 0:
        problems.append(f"--seed must be at least 0 to --shuffle, got {args.seed}")
    if not args.output_column.strip():
        problems.append("--output-column must name a column, got an empty name")
    if args.loop_retries > 5:
        problems.append(f"--loop-retries must be at most 5, got {args.loop_retries}")
    if not PDF_MIN_DPI <= args.pdf_dpi <= PDF_MAX_DPI:
        problems.append(f"--pdf-dpi must be {PDF_MIN_DPI} to {PDF_MAX_DPI}, got {args.pdf_dpi:g}")
    try:
        parse_pages(args.pages)
    except ValueError as exc:
        problems.append(str(exc))
    if args.num_shards >= 1 and not 0 <= args.shard_index < args.num_shards:
        problems.append(f"--shard-index must be in [0, {args.num_shards}) for --num-shards "
                        f"{args.num_shards}, got {args.shard_index}")
    problems += shape_problems(args) + model_argument_problems(args)
    if problems:
        fail("; ".join(problems) + ".")
    resolve_output(args.output)  # exits 2 saying how to write a local path
    check_output_outside_input(args)
    return args


# ---- run.py: The steps of a run, which main() calls in order: its state, the exits it may take, its end.
class Interrupts:
    """SIGINT and SIGTERM (a cancelled Job) stop the run as KeyboardInterrupt, but never while
    the finished rows are saved: a signal then waits for them (the run stops once they are)."""

    def __init__(self):
        self.signum, self.saving = None, False
        self.task = None  # asyncio.run's task while it runs (run_async): a signal cancels it
        self.previous = {sig: signal.signal(sig, self.on_signal)
                         for sig in (signal.SIGINT, signal.SIGTERM)
                         if threading.current_thread() is threading.main_thread()}

    def on_signal(self, signum, frame) -> None:
        if self.saving:
            self.signum = self.signum or signum
            return log("saving the finished rows first; the run stops once they are on disk")
        while frame and frame.f_code.co_name != "__del__" and \
                not frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            frame = frame.f_back
        if frame:  # a finalizer, whose exception Python ignores (and prints): the signal again
            return threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        self.signum, self.saving = signum, True  # the rows are saved before another one counts
        if self.task is not None and not self.task.done():
            # inside the event loop a KeyboardInterrupt can land in asyncio's or httpx's own
            # bookkeeping and leave a future nobody resolves (seen: an exit that hung for good);
            # the task stops at its next await instead, as asyncio.run does with a Ctrl-C
            self.task.cancel()
            return
        raise KeyboardInterrupt

    def exit_code(self) -> int:  # 130 for SIGINT, 143 for SIGTERM
        return 128 + int(self.signum or signal.SIGINT)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@dataclass
class Run:
    """One run's state, which main()'s steps fill in their order."""
    args: argparse.Namespace
    engine: dict  # the engine's settings: part of the run's identity
    info_entry: dict  # the inference's record, in the card and OUTPUT's info
    interrupts: Interrupts = field(default_factory=Interrupts)  # SIGINT, SIGTERM from here on
    store: OutputStore | None = None
    source: InputSource | None = None
    identity: dict | None = None
    plan: RowPlan | None = None
    stats: RunStats | None = None
    check: DegenerateCheck | None = None
    writer: PartWriter | None = None
    renderer: PdfRenderer | None = None  # PDF input: the processes that render its pages
    result: dict | None = None  # the stats, as written
    exit_code: int | None = None


@contextlib.contextmanager
def any_stop_said(run: Run):
    """What stops the steps inside is said, as the exit code; before plan_run, with no trace of
    the run left but its stats (and fail()'s exit goes on)."""
    try:
        yield
        run.exit_code = 0 if run.writer is not None else None
    except SystemExit as exc:  # fail() said why
        run.exit_code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if run.writer is None:
            raise
    except RunAborted as exc:
        log(f"error: {exc}")
        run.exit_code = exc.code
    except KeyboardInterrupt:
        log("interrupted" + (": saving the finished rows" if run.writer is not None else
                             " before any page was sent"))
        run.exit_code = run.interrupts.exit_code()
    except Exception as exc:
        run.exit_code, started = EXIT_NOT_WRITTEN, run.writer is not None
        if not started and isinstance(exc, OSError):  # a full or read-only disk, say
            log(f"error: cannot write to OUTPUT {run.args.output}: {exc}. Nothing was sent; free "
                f"space (or choose another OUTPUT), then rerun the same command.")
        else:  # a bug or an unforeseen failure: keep what is finished, then say what
            import traceback
            traceback.print_exc()
            log("error: the run failed" + ("; saving the finished rows" if started else ""))
    finally:
        if run.writer is None:  # refused, or only a check: no trace of this run
            run.interrupts.restore()
            if run.store is not None:
                run.store.abandon()
            if run.exit_code is not None and not run.args.check_only:  # every run's stats keys
                write_stats({**RunStats(0, 0).as_dict(), "exit_code": run.exit_code}, run.args)


def open_output_and_input(run: Run, hub_api=None) -> None:
    """OUTPUT and its lock (a Hub's refusal: exit 5), then INPUT as OUTPUT's run read it."""
    args = run.args
    try:
        run.store = store = OutputStore(args.output, args, hub_api)  # hub_api: a test's
    except Exception as exc:
        local_disk = isinstance(exc, OSError) and not isinstance(exc, ConnectionError) \
            and not hasattr(exc, "response")  # HfHubHTTPError is an OSError too
        if local_disk or resolve_output(args.output)[0] != "hub":
            raise
        said = ": ".join([type(exc).__name__, *str(exc).strip().splitlines()[:1]])
        refused = getattr(getattr(exc, "response", None), "status_code", None) in (401, 403, 404)
        fail(f"the Hub {'refused' if refused else 'failed while opening'} OUTPUT {args.output} "
             f"({said}). Nothing was sent; " + ("the token needs write access (HF_TOKEN or "
             "--hf-token) to that namespace." if refused else "rerun once the Hub answers."),
             EXIT_NOT_WRITTEN)
    if args.private and store.api is not None:  # create_repo(exist_ok=True) leaves it as it is
        with contextlib.suppress(Exception):  # only a warning: never a reason to stop
            if store.api.repo_info(store.target, repo_type="dataset").private is False:
                log(f"warning: {store.target} exists and is public: --private applies only to a "
                    f"repo it creates, so this one stays public (make it private in its settings)")
    run.source = open_input(pinned_input(store, args))
    check_output_columns(run.source, args)
    store.shard_range = (run.source.lo, run.source.hi)


def claim_run_output(run: Run) -> None:
    """OUTPUT's manifest records this run, or a rerun is checked to be the same run."""
    run.identity = run_identity(run.args, run.source, run.engine)
    if not run.args.check_only:  # a read-only store: claim_output compares, records nothing
        run.store.drop_stale_staged_parts()
    claim_output(run.store, run.identity, run.args, run.source.pdf)


def report_check(run: Run) -> int:
    """--check-only: the last stdout line is JSON: every shard's rows (PDF pages), the run."""
    source, identity = run.source, run.identity
    n = len(source.dataset)
    rows = n if source.pdf is None or source.pdf.per_document else source.pdf.first_row(n)
    revision = identity["input"].get("revision")
    log(f"check passed: {rows} rows -> {run.store.location()}; nothing was written")
    secret: list = []  # the options holding a secret (the launcher keeps them out of Jobs)
    redact_argv(_RUN_ARGV, None, secret)
    digest = run_digest(json.loads(json.dumps(identity)), run.args)  # as the manifest reads
    print(json.dumps({"rows": rows, "run": digest,
                      **({"input_revision": revision} if revision else {}),
                      **({"secret_options": secret} if secret else {})}))
    return 0


def plan_run(run: Run) -> None:
    """The rows to send and what writes them (PDF: render processes, forked before any thread);
    from here on the finished rows are saved whatever stops the run."""
    args, source, store = run.args, run.source, run.store
    run.plan = plan = plan_rows(source, store, args)
    store.resend_local_parts()
    run.stats = RunStats(rows_total=source.hi - source.lo, rows_skipped=plan.skipped)
    run.stats.rows_recovered = len(plan.recovered)
    run.check = DegenerateCheck(not args.no_sanity_check and not plan.earlier_ok,
                                args.sanity_pages, plan.send)
    run.info_entry["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.writer = PartWriter(store, source, plan, output_features(source, args), run.info_entry,
                            run.check, args)
    log(f"{len(plan.pending)} of {run.stats.rows_total} rows to do, {len(plan.send)} pages to "
        f"send ({plan.skipped} already done, {len(plan.recovered)} recovered from the "
        f"journal; {len(plan.redo)} error rows redone) -> {store.location()}")
    if source.pdf is not None and plan.send:
        run.renderer = PdfRenderer(source.pdf, args)
    for result in plan.recovered.values():  # journaled by a killed run: judged first
        if result.error is None and result.skipped is None:
            run.check.observe(result)


def save_rows(run: Run, stop_engine=lambda force: None) -> None:
    """The finished rows saved (a signal waits), unless all degenerate; then the engine stopped."""
    interrupts, check, writer, store = run.interrupts, run.check, run.writer, run.store
    interrupts.saving = True  # from here a signal waits for the finished rows to be saved
    try:
        check.finish()
    except RunAborted as exc:
        log(f"error: {exc}")
        run.exit_code = run.exit_code or exc.code
    if check.tripped:
        store.journal.close(discard=True)
        log("the pages finished so far are all degenerate: nothing is written")
    else:
        writer.flush(final=True)
        store.journal.close()
    if interrupts.signum and not run.exit_code:  # a signal while the rows were saved
        run.exit_code = interrupts.exit_code()
    pages = sum(map(len, writer.open_documents.values()))
    if run.exit_code and not check.tripped and (writer.rows_ok + writer.rows_failed or pages):
        pages = f" (and {pages} pages of unfinished documents)" if pages else ""
        log(f"saved: {writer.rows_ok + writer.rows_failed} finished rows{pages} are in "
            f"{store.location()}; to resume, {rerun_advice()}")
    interrupts.saving = False  # saved: a signal now stops the engine at once, or the last commit
    try:
        stop_engine(False)
    except KeyboardInterrupt:
        stop_engine(True)
        interrupts.saving = False
    if run.renderer is not None:
        run.renderer.close()


def write_card(run: Run) -> None:
    """The rows counted (one not written: exit 5), then the card and the last commit."""
    stats, writer, store = run.stats, run.writer, run.store
    stats.rows_ok, stats.rows_failed = writer.rows_ok - writer.rows_text_layer, writer.rows_failed
    stats.rows_text_layer, stats.rows_blank = writer.rows_text_layer, writer.rows_blank
    run.result = stats.as_dict()
    if run.result["rows_not_written"] and not run.exit_code:
        run.exit_code = EXIT_NOT_WRITTEN
        log(f"error: {run.result['rows_not_written']} row(s) were not written"
            + (f" ({writer.write_errors[-1]})" if writer.write_errors else "")
            + f"; to finish them, {rerun_advice()}")
    wrote = writer.rows_ok + writer.rows_failed or store.sent_parts
    try:
        if not wrote and not store.parts() and not list(store.journal.folder.glob("*.jsonl")):
            store.forget_run()  # nothing written: the next run may be another one
        if store.api is not None and wrote:  # the card counts what other shards wrote since
            with contextlib.suppress(Exception):  # (else what this run saw)
                store.read_hub(others_only=True)
        card_missing = store.parts() and not (store.card_on_hub if store.api is not None else
                                              (store.root / "README.md").exists())
        store.finish((lambda: build_card(run.source, store, run.args, run.result, run.info_entry))
                     if (wrote or card_missing) and not run.check.tripped else None)
    except (KeyboardInterrupt, OSError) as exc:  # the rows are saved: a rerun ends the output
        stopped = isinstance(exc, KeyboardInterrupt)
        run.exit_code = run.exit_code or (run.interrupts.exit_code() if stopped else
                                          EXIT_NOT_UPLOADED if store.api is not None else
                                          EXIT_NOT_WRITTEN)
        log(f"{'interrupted' if stopped else f'error: {exc}'} before the card and the last "
            f"commit; the finished rows are in {store.root}: to finish, {rerun_advice()}")


def finish_run(run: Run) -> int:
    """The exit code, the stats (every exit's) and the closing line."""
    store, result = run.store, run.result
    code = run.exit_code or (EXIT_USAGE if store.conflict else
                             EXIT_NOT_UPLOADED if store.upload_failures else 0)
    result["exit_code"] = code
    write_stats(result, run.args)
    text_layer = f"{result['rows_text_layer']} from their text layer, " \
        if result["rows_text_layer"] else ""
    blank = f" ({result['rows_blank']} blank, not sent)" if result["rows_blank"] else ""
    log(f"done: {result['rows_ok']} ok{blank}, {result['rows_failed']} failed, {text_layer}"
        f"{result['rows_skipped']} skipped, {result['rows_not_written']} not written in "
        f"{result['elapsed_s']:.1f} s ({result['pages_per_s'] or 0:.2f} pages/s) -> "
        f"{store.location()} (exit {code})")
    run.interrupts.restore()
    return code

# ==== END COMMON HELPERS ====


# ==== BEGIN BLANK PAGE HELPERS (edit blocks/blank_page.py, then run tools/sync_helpers.py) ====
# Whether a page holds any ink (see blocks/blank_page.py for the rule and its tests).
BLANK_JUDGE_SIDE = 900  # a page is judged at most this long on its long side (A4 at 300 dpi: 1/4)
BLANK_TILE = 24  # the paper's level: the 90th percentile of brightness over tiles of this side
INK_CONTRAST = 8  # grey levels below the paper, at the judging scale, at the least
INK_NOISE_FACTOR = 7  # ... and this many times the page's own noise (paper texture, the sensor)
MIN_INK_PIXELS = 8  # fewer ink pixels than this (each with two ink neighbours): a blank page


def judging_grey(img):
    """The page as grey int16 at most BLANK_JUDGE_SIDE long; a JPEG decoded at a DCT scale."""
    import numpy as np

    scale = -(-max(img.size) // BLANK_JUDGE_SIDE)
    if scale > 1 and getattr(img, "format", None) == "JPEG":  # a loaded one ignores it
        img.draft("L", (-(-img.width // scale), -(-img.height // scale)))
    factor = -(-max(img.size) // BLANK_JUDGE_SIDE)
    small = img.reduce(factor) if factor > 1 else img  # before any copy: a giant scan stays cheap
    return np.asarray(small.convert("L"), dtype=np.int16)


def paper_level(grey):
    """The paper's brightness under each pixel: a tile's 90th percentile, smoothed between tiles."""
    import numpy as np
    from PIL import Image

    h, w = grey.shape
    rows, cols = -(-h // BLANK_TILE), -(-w // BLANK_TILE)
    padded = np.pad(grey, ((0, rows * BLANK_TILE - h), (0, cols * BLANK_TILE - w)), mode="edge")
    tiles = padded.reshape(rows, BLANK_TILE, cols, BLANK_TILE).transpose(0, 2, 1, 3)
    tiles = tiles.reshape(rows, cols, -1)
    k = tiles.shape[2] * 9 // 10
    level = np.partition(tiles, k, axis=2)[:, :, k].astype(np.float32)
    return np.asarray(Image.fromarray(level, mode="F").resize((w, h), Image.BILINEAR))


def edge_runs(dark, pad: int = 3):
    """The dark runs touching the edge, per row and column (a scan's border), widened by `pad`."""
    import numpy as np

    runs = np.zeros_like(dark)
    for src, dst in ((dark, runs), (dark[:, ::-1], runs[:, ::-1]), (dark.T, runs.T),
                     (dark.T[:, ::-1], runs.T[:, ::-1])):
        length = np.where(src.all(axis=1), src.shape[1], np.argmin(src, axis=1))
        length = np.where(length > 0, length + pad, 0)
        dst |= np.arange(src.shape[1])[None, :] < length[:, None]
    return runs


def ink_pixels(grey) -> int:
    """Pixels darker than the paper by more than its noise, in a stroke, not at the border."""
    import numpy as np

    level = paper_level(grey)
    below = level - grey
    sample = below[::3, ::3]  # the noise, from a ninth of the pixels: as good, and cheaper
    sigma = 1.4826 * np.median(np.abs(sample - np.median(sample)))
    threshold = max(INK_CONTRAST, INK_NOISE_FACTOR * sigma)
    ink = below > threshold
    if not ink.any():
        return 0
    ink &= ~edge_runs(grey < np.median(level[::8, ::8]) - threshold)
    padded = np.pad(ink, 1).astype(np.int8)
    rows = padded[:-2] + padded[1:-1] + padded[2:]
    box = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]  # the 3x3 sum, the pixel itself included
    return int(np.count_nonzero(ink & (box >= 3)))


def is_blank(img) -> bool:
    """No ink on the page (a PIL image, loaded or not): the rule above."""
    return ink_pixels(judging_grey(img)) < MIN_INK_PIXELS
# ==== END BLANK PAGE HELPERS ====


# ==== BEGIN GROUNDING HELPERS (edit blocks/grounding.py, then run tools/sync_helpers.py) ====
# For the model sections that parse boxes out of their model's answer.
def block_box(values, top: int) -> list[int] | None:
    """A parsed box as four ints in [0, top], or None (never an int32 overflow); never raises."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        return None
    if len(numbers) != 4 or not all(0 <= v <= top for v in numbers):  # NaN fails too
        return None
    return [int(v) for v in numbers]
# ==== END GROUNDING HELPERS ====


# ==== BEGIN SERVER HELPERS (edit blocks/server/, then run tools/sync_helpers.py) ====
# The block's imports not already in the common block (see blocks/common/__init__.py).
import asyncio
import base64
import functools
import socket
import ssl
import urllib.parse
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import httpx


# ---- serve_args.py: The vLLM server's flags: the script's own, --serve-args, what they say.
def option_name(flag) -> str:
    return str(flag).replace("_", "-")  # like vLLM, an option may be spelled with underscores


def effective_serve_args(args) -> list[str]:
    """SERVE_ARGS, then --serve-args; --logits-processors last (it would swallow a bare value)."""
    items = flag_items(list(SERVE_ARGS) + shlex.split(args.serve_args or ""))
    return flag_words(sorted(items, key=lambda item: option_name(item[0]) == "--logits-processors"))


def serve_arg_value(argv: list[str], name: str, default=None):
    """The last value given for a flag."""
    values = [v[0] for flag, v, _ in flag_items(argv) if v and option_name(flag) == name]
    return values[-1] if values else default


def parse_vllm_size(value) -> int | None:
    """A size as vLLM reads it: 24k is 24000, 24K is 24576 (no decimals), auto or -1 is None."""
    text = str(value).strip()
    if text.lower() in ("auto", "-1"):
        return None
    match = re.fullmatch(r"(\d+(\.\d+)?)([kmgtKMGT]?)", text)
    if match and match[2] and match[3].isupper():
        raise ValueError(f"{text!r}: no decimals with {text[-1]} (did you mean {text.lower()}?)")
    if not match or match[2] and not match[3]:
        raise ValueError(f"{text!r} is not a size (write e.g. 32768, 24k, 32K or auto)")
    scale = (1024 if match[3].isupper() else 1000) ** " kmgt".index(match[3].lower())
    return int(float(match[1]) * scale)


def serve_max_model_len(args) -> int | None:
    """The context of the server this script would start; None: the model's own (`auto`)."""
    return parse_vllm_size(serve_arg_value(effective_serve_args(args), "--max-model-len", "auto"))


def server_url_parts(url: str) -> tuple[str, str, int]:
    """(base, host, port) of --server; the base keeps a proxy's path prefix, drops a /v1."""
    parsed = urllib.parse.urlparse(url if "//" in url else "http://" + url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--server {url!r} is not an http(s) URL (write e.g. "
                         f"http://127.0.0.1:8000)")
    if "@" in parsed.netloc:  # httpx would send it as Basic auth, in place of the API key
        raise ValueError(f"--server {url!r} holds a user or password: give the server's API key "
                         f"with --api-key (or VLLM_API_KEY), and --server without it")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)  # ValueError on a bad port
    path = parsed.path.rstrip("/").removesuffix("/v1")
    return f"{parsed.scheme}://{parsed.netloc}{path}", parsed.hostname, port


def server_argument_problems(args) -> list[str]:
    """The server options a user can get wrong (parse_arguments reports them with the rest)."""
    problems = []
    try:
        server_url_parts(args.server)
    except ValueError as exc:
        problems.append(str(exc))
    try:
        words = shlex.split(args.serve_args)
    except ValueError as exc:
        return problems + [f"--serve-args cannot be split as a command line: {exc}"]
    for flag, word in ((flag, word) for flag, values, _ in flag_items(words) for word in values):
        if not re.match(r"\{\s*[\w\"']", word):  # not a JSON object (nor a {{ template }})
            continue
        try:  # one whose inner quotes the shell took is refused, its value unshown (a secret?)
            json.loads(word)
        except ValueError:
            problems.append(f"--serve-args: the value of {flag or 'a word'} is not JSON (the shell "
                            f"took its quotes): quote it twice, e.g. --serve-args "
                            f"'{flag or '--flag'} \"{{\\\"key\\\": 1}}\"'")
    try:
        serve_max_model_len(args)
    except ValueError as exc:
        problems.append(f"--serve-args --max-model-len: {exc}")
    return problems


# ---- process.py: The vLLM server process: reused, or started under a watchdog, watched, stopped.
# Runs `vllm serve` in its own process group, its output to the driver (relay_log). When the
# driver dies without stopping it (kill -9, OOM), it notices within half a second, stops the
# group, then kills what is left (itself too).
SERVER_WATCHDOG = r"""
import os, signal, subprocess, sys, time
driver = os.getppid()
signal.signal(signal.SIGTERM, lambda *_: None)  # the driver's stop() signals the whole group
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
while server.poll() is None and os.getppid() == driver:
    time.sleep(0.5)
if server.poll() is None:  # the driver is gone
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    finally:
        os.killpg(0, signal.SIGKILL)
sys.exit(server.returncode if server.returncode >= 0 else 128 - server.returncode)
"""


def relay_log(output, log_file, known: set[str]) -> None:
    """The server's output into its log, secrets masked; never blocking on a full disk."""
    with output, log_file:
        for line in output:
            with contextlib.suppress(OSError):
                log_file.write(redact_text(line.decode(errors="surrogateescape"), known)
                               .encode(errors="surrogateescape"))


UNKNOWN_HOST = (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None))  # not a DNS hiccup
SILENT_PORT_S = 120.0  # connected, no HTTP answer this long: not vLLM (it listens once it answers)
HEALTH_EVERY_S = 10.0  # mid-run /health checks (at least 4 per --server-down-timeout)
REPORT_EVERY_S = 60.0  # while waiting for a server, a line this often


class ServerManager:
    """Reuse a server, wait for one that is starting, or start `vllm serve` and own it."""

    def __init__(self, args, log_dir: Path, window):  # window: its class, its serve flags
        self.args, (self.base, self.host, self.port) = args, server_url_parts(args.server)
        self.window = window
        self.log_path = log_dir / f"vllm-serve-{self.port}.log"
        self.may_spawn = self.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0") and \
            not args.no_spawn
        serve_args = effective_serve_args(args)
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or \
            serve_arg_value(serve_args, "--api-key") or None
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.model_name = serve_arg_value(serve_args, "--served-model-name") or args.model
        self.process: subprocess.Popen | None = None
        self.spawning = False  # plan()'s decision: start `vllm serve` here
        self.restarts, self.engines = 0, 1  # engines: data-parallel, of a server started here
        self.max_model_len = self.version = self.revision = None
        self.heard_at = time.monotonic()  # last passed a probe or /health, or answered a page
        self.silent_since: float | None = None  # connected, and no HTTP answer since
        self.asked_to_wait = False  # a 429/503's Retry-After was said
        self._lock = asyncio.Lock()

    def refused(self, what: str) -> RunAborted:
        return RunAborted(f"port {self.port} answers, but not as {what}: stop what uses the port, "
                          f"or pass --server with the vLLM server's URL (or a free port).",
                          EXIT_USAGE)

    def key_refused(self, status: int) -> RunAborted:
        hint = "the key sent is wrong" if self.api_key else "it wants one"
        return RunAborted(f"the server at {self.base} refuses the API key (HTTP {status}): "
                          f"{hint}: pass --api-key or set VLLM_API_KEY.", EXIT_REFUSED)

    async def probe(self, client, starting: bool = True) -> str:
        """"ready", "starting" (or no answer in time) or "absent"; RunAborted if it never will."""
        for attempt in range(2):  # a reset connection is tried once more before judging
            try:
                response = await client.get(f"{self.base}/v1/models", headers=self.headers,
                                            timeout=10)
                self.silent_since = None
                break
            except httpx.ReadTimeout:  # connected, no answer
                self.silent_since = self.silent_since or time.monotonic()
                if starting and time.monotonic() - self.silent_since >= SILENT_PORT_S:
                    raise RunAborted(f"port {self.port} accepts connections but has sent no HTTP "
                                     f"answer for {SILENT_PORT_S:.0f} s: not a vLLM server. Stop "
                                     f"what holds it, or pass --server a vLLM URL.", EXIT_USAGE)
                return "starting"
            except httpx.TimeoutException:
                return "starting"
            except httpx.HTTPError as exc:
                cause = exc  # TLS, or a host that DNS says does not exist, among its causes?
                while cause and not isinstance(cause, ssl.SSLError) and not (
                        isinstance(cause, socket.gaierror) and cause.errno in UNKNOWN_HOST):
                    cause = cause.__cause__ or cause.__context__
                if starting and cause:
                    raise RunAborted(f"cannot connect to {self.base} ({exc}): check the host and "
                                     f"scheme (http or https) of --server.", EXIT_USAGE) from None
                if isinstance(exc, httpx.ConnectError):
                    return "absent"
                if attempt:
                    raise self.refused(f"an HTTP server ({type(exc).__name__}: {exc}; for HTTPS, "
                                       f"write --server https://...)") from None
        status = response.status_code
        if status in (401, 403):
            raise self.key_refused(status)
        if status in (500, 502, 503, 504):
            return "starting"  # a proxy whose upstream boots, a server loading its model
        try:
            models = {m["id"]: m for m in response.json()["data"]} if status == 200 else None
        except (ValueError, KeyError, TypeError):
            models = None
        if models is None:
            raise self.refused(f"an OpenAI-compatible vLLM server (GET {self.base}/v1/models "
                               f"gave HTTP {status} without a model list)")
        if await self.health_problem(client, 5):
            return "starting"
        if self.model_name not in models:  # EXIT_REFUSED: it changed under a running job
            names = ", ".join(map(str, models)) or "no model"
            raise RunAborted(f"the server at {self.base} serves {names}, not {self.model_name}. "
                             f"Pass --model with the served name, or point --server elsewhere.",
                             EXIT_USAGE if starting else EXIT_REFUSED)
        self.max_model_len = models[self.model_name].get("max_model_len") or self.max_model_len
        self.heard_at = time.monotonic()
        return "ready"

    async def health_problem(self, client, timeout: float) -> str | None:
        """Why /health fails, or None. 404: an OpenAI-compatible proxy without one, passed."""
        try:
            response = await client.get(f"{self.base}/health", headers=self.headers,
                                        timeout=timeout)
        except httpx.TimeoutException:
            return f"no answer in {timeout:g} s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code in (200, 404) else f"HTTP {response.status_code}"

    async def watch(self, client, stats: RunStats, storm: HeldFailures) -> None:
        """Stop the run once the server is down for --server-down-timeout."""
        limit = self.args.server_down_timeout
        every = min(HEALTH_EVERY_S, limit / 4)
        while True:
            await asyncio.sleep(every)
            problem = await self.health_problem(client, every)
            if problem is None:
                self.heard_at = time.monotonic()
            elif time.monotonic() - self.heard_at >= limit:
                storm.stop(f"the server at {self.base} has failed /health ({problem}) and "
                           f"answered no page for {time.monotonic() - self.heard_at:.0f} s "
                           f"(--server-down-timeout), with {stats.in_flight} pages in flight")

    def waiting_on(self, state: str) -> str:
        if self.process is not None:
            return f"vllm serve, started here, is loading (its log: {self.log_path})"
        if self.silent_since is not None:
            return "it accepts connections but has sent no HTTP answer"
        return "it answers, not ready yet" if state == "starting" else \
            "it does not answer yet (`vllm serve` opens its port once the model is loaded)"

    async def plan(self) -> None:
        """Before the input is read: use a ready server, wait for one, or decide to start one."""
        async with httpx.AsyncClient() as client:
            state = await self.probe(client)
        self.spawning = state == "absent" and self.may_spawn
        # a server waited for (no max_model_len yet) is checked at start
        check_context_budget(serve_max_model_len(self.args) if self.spawning else
                             self.max_model_len, self.args, self.budget_option)
        if not self.spawning:
            head = f"using the vLLM server already running at {self.base} ({self.model_name}" \
                if state == "ready" else f"the server at {self.base}: " \
                f"{self.waiting_on(state)}; the run will be waiting for that URL (up to " \
                f"{self.args.server_timeout:.0f} s, --server-timeout"
            return log(f"{head}; not started by this run; it will be left running)")
        if shutil.which("vllm") is None:
            local = "`pip install vllm` on a machine with a GPU" \
                if JOB_IMAGE.startswith("vllm/vllm-openai:") else \
                f"run it inside {JOB_IMAGE} (the vendor's vLLM, the only one for this model)"
            fail(f"nothing answers at {self.base} and there is no `vllm` command here to start a "
                 f"server.\n\nRun it on Hugging Face Jobs:\n{jobs_advice()}\n\n"
                 f"or locally: {local}, then rerun the same command; or pass --server URL to use "
                 f"a running server.")

    async def start(self, client, stats: RunStats) -> None:
        """Act on plan()'s decision; return once the server is ready."""
        started = time.monotonic()
        if self.spawning:
            self.spawn()
        await self.wait_ready(client, self.args.server_timeout)
        if self.process is not None:
            stats.server_startup_s = round(time.monotonic() - started, 2)
        check_context_budget(self.max_model_len, self.args, self.budget_option)
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            response = await client.get(f"{self.base}/version", headers=self.headers, timeout=5)
            self.version = stats.vllm_version = response.json().get("version")

    @property
    def budget_option(self) -> str:
        """What raises max_model_len: this run's --serve-args, or the server's own flag."""
        return "--max-model-len in --serve-args" if self.spawning else \
            "the server's --max-model-len"

    def serve_command(self) -> list[str]:
        command = ["vllm", "serve", self.args.model, "--host", self.host, "--port", str(self.port)]
        self.revision = resolved_revision(self.args)  # what this server loads, and the record
        if revision := self.revision or requested_revision(self.args):
            command += ["--revision", revision]
        serve_args = effective_serve_args(self.args)
        # one engine per GPU (a multi-GPU flavor is paid for every one), unless told otherwise
        told = any(serve_arg_value(serve_args, flag) for flag in PARALLEL_FLAGS)
        self.engines = 1 if told else max(1, visible_gpus())
        parallel = ["--data-parallel-size", str(self.engines)] if self.engines > 1 else []
        return command + self.window.serve_args(self.args, serve_args) + parallel + serve_args

    def spawn(self) -> None:
        """Start `vllm serve` under SERVER_WATCHDOG; secrets go through its env, not its argv."""
        argv = self.serve_command() + spawn_args(self.args)
        secrets = {"VLLM_API_KEY": self.api_key,
                   "HF_TOKEN": self.args.hf_token or serve_arg_value(argv, "--hf-token")}
        command = flag_words([item for item in flag_items(argv)  # argv is public
                              if option_name(item[0]) not in ("--api-key", "--hf-token")])
        known = set().union(*(secret_literals(v, is_secret(name or "", values))
                              for name, values, _ in flag_items(argv) for v in values))
        known |= {v for v in secrets.values() if v and len(v) >= 4}
        env = {**os.environ, **SERVE_ENV, **{k: v for k, v in secrets.items() if v}}
        log(f"starting: {shlex.join(redact_argv(command))}\n  (server log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab", buffering=0)  # a line each write: none held back
        self.process = subprocess.Popen([sys.executable, "-c", SERVER_WATCHDOG, *command],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self.relay = threading.Thread(target=relay_log, daemon=True,
                                      args=(self.process.stdout, log_file, known))
        self.relay.start()

    def log_tail(self) -> str:
        if self.process is not None and self.process.poll() is not None:
            self.relay.join(timeout=5)  # its last lines, unless what it started holds the pipe
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()[-40:]
            return f"Last lines of {self.log_path}:\n" + "\n".join("  | " + s for s in lines)
        return "(no server log)"

    async def wait_ready(self, client, timeout: float) -> None:
        """Until the server (ours: started and still running) is ready, or RunAborted."""
        began = reported = time.monotonic()
        while (state := await self.probe(client)) != "ready":
            if self.process is not None and self.process.poll() is not None:
                raise RunAborted(f"vllm serve exited with code {self.process.returncode} "
                                 f"before it was ready. {self.log_tail()}")
            if state == "absent" and self.process is None and self.may_spawn:
                raise RunAborted(f"the server that was starting on port {self.port} is gone; "
                                 f"rerun to start one.")
            if time.monotonic() >= began + timeout:
                tail = f"\n{self.log_tail()}" if self.process else ""
                raise RunAborted(f"the server at {self.base} was not ready after {timeout:.0f} s "
                                 f"(--server-timeout): once it answers (or with a longer "
                                 f"--server-timeout), {rerun_advice()}{tail}")
            if time.monotonic() - reported >= REPORT_EVERY_S:
                reported = time.monotonic()
                log(f"waiting for the server at {self.base} for {reported - began:.0f} s of up to "
                    f"{timeout:.0f} s (--server-timeout): {self.waiting_on(state)}")
            await asyncio.sleep(1.0)

    async def recover(self, client) -> None:
        """After a connection error: wait for the server, restarting ours if it died."""
        async with self._lock:
            if await self.probe(client, starting=False) == "ready":
                return
            log(f"the server at {self.base} is not answering: waiting up to "
                f"{self.args.server_down_timeout:g} s for it (--server-down-timeout)")
            while await self.probe(client, starting=False) != "ready":
                if self.process is not None and self.process.poll() is not None:
                    if self.restarts >= self.args.max_restarts:
                        raise RunAborted(f"vllm serve died ({self.restarts + 1} starts); "
                                         f"giving up. {self.log_tail()}", EXIT_REFUSED)
                    self.restarts += 1
                    log(f"vllm serve died (exit {self.process.returncode}); restart "
                        f"{self.restarts}/{self.args.max_restarts}; its pages are sent again")
                    self.stop(force=True)  # what is left of its process group
                    self.spawn()
                    self.heard_at = float("inf")  # loading: wait_ready judges it, not watch()
                    return await self.wait_ready(client, self.args.server_timeout)
                await asyncio.sleep(1.0)

    def stop(self, force: bool = False) -> None:
        """Stop the server this run started and what is left of its process group, never more."""
        if self.process is None:
            return
        if not force and self.process.poll() is None:
            log("stopping the vllm serve this run started")
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)  # the watchdog waits for the server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.relay.join(timeout=5)  # the log complete


# ---- requests.py: One page's request: its body built once, sent with retries, its answer read.
IMAGE_URL_PLACEHOLDER = "@@PAGE_IMAGE_URL@@"
SEND_AGAIN = globals().get("SEND_AGAIN")  # the model section's: a page it asks to send again
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
RETRY_AFTER_MAX_S = 120.0  # the longest wait a server's Retry-After is granted before a retry


def request_json(model_name: str, args, seed: int | None = None) -> tuple[bytes, bytes]:
    """The JSON body's text before and after the image URL; with a seed, a loop retry's."""
    request = {**build_request(IMAGE_URL_PLACEHOLDER, args), "model": model_name}
    if repetition_detection(args):
        request["repetition_detection"] = repetition_detection(args)
    if seed is not None:
        request.update(temperature=LOOP_TEMPERATURE, seed=seed)
    head, tail = json.dumps(request, ensure_ascii=False).split(IMAGE_URL_PLACEHOLDER)
    return head.encode(), tail.encode()


def request_body(page: PreparedPage, model_name: str, args) -> bytes:
    """The JSON body with the page's base64 spliced in as bytes: one copy, no escaping needed."""
    head, tail = request_json(model_name, args)
    return b"".join((head, b"data:", page.mime.encode(), b";base64,",
                     base64.b64encode(page.data), tail))


def loop_retry_body(body: bytes, model_name: str, args, seed: int, previous: int | None) -> bytes:
    """`body` again with the retry's temperature and seed, its image URL cut out of the bytes."""
    head, tail = request_json(model_name, args, previous)
    new_head, new_tail = request_json(model_name, args, seed)
    with memoryview(body) as view:
        return b"".join((new_head, view[len(head):len(body) - len(tail)], new_tail))


async def send_until_clean(client, server: "ServerManager", body: bytes, index: int,
                           args) -> RowResult:
    """send_page(), then up to --loop-retries more while the kept answer loops."""
    result, previous = await send_page(client, server, body, args), None
    for attempt in range(1, args.loop_retries + 1):
        if not loops(result.text, result.finish_reason):  # an error row has no text
            break
        seed = loop_seed(index, attempt)
        body, previous = loop_retry_body(body, server.model_name, args, seed, previous), seed
        result = kept_attempt(result, await send_page(client, server, body, args))
    return result


def read_completion(response) -> RowResult:
    """The row's result from a 200 answer; a malformed one is the server's error."""
    def count(value) -> int | None:  # a token count as the int32 column holds it
        return value if isinstance(value, int) and 0 <= value < 2 ** 31 else None

    try:
        payload = response.json()
        choice, usage = payload["choices"][0], payload.get("usage") or {}
        text, finish = choice["message"]["content"], choice.get("finish_reason")
        if text is not None and not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}")
        finish = finish if isinstance(finish, str) else None
        return RowResult(text=cut_at_loop(text or "", finish), finish_reason=finish,
                         prompt_tokens=count(usage.get("prompt_tokens")),
                         completion_tokens=count(usage.get("completion_tokens")), attempts=1)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return error_row(f"unreadable response ({type(exc).__name__}: {exc}): "
                         f"{response.text[:300]}", SERVER)


async def send_page(client, server: "ServerManager", body: bytes, args) -> RowResult:
    """POST one page; retry what may pass next time, record what will not."""
    url = f"{server.base}/v1/chat/completions"
    headers = {"Content-Type": "application/json", **server.headers}
    attempt, outages, last_error = 0, 0, ""
    while attempt <= args.max_retries:
        asked = 0.0  # the wait a 429/503's Retry-After asks (seconds; capped)
        try:
            response = await client.post(url, content=body, headers=headers)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            outages += 1
            if outages > args.max_restarts + 5:
                return error_row(f"connection failed {outages} times: {exc}", SERVER)
            await server.recover(client)  # one that stays down, watch() stops the run
            continue
        except httpx.TimeoutException:
            last_error = f"timed out after {args.request_timeout:g} s"
        except httpx.HTTPError as exc:  # an answer httpx cannot read (a gzip body that is not)
            last_error = f"unreadable answer: {type(exc).__name__}: {exc}"
        except Exception as exc:  # whatever else the transport raised: the server's side
            return exception_row(exc, SERVER, "request failed: ")
        else:
            server.heard_at = time.monotonic()
            status, text = response.status_code, response.text[:300]
            if status == 200:
                return read_completion(response)
            if status in (401, 403):  # these two refuse the whole run, not this page
                raise server.key_refused(status)
            if status == 404 and "does not exist" in text:
                raise RunAborted(f"the server at {server.base} no longer serves "
                                 f"{server.model_name} (HTTP 404: {text}); it was restarted with "
                                 f"another model?", EXIT_REFUSED)
            last_error = f"HTTP {status}: {response.text[:500]}"
            if status not in RETRY_STATUS:
                return error_row(last_error, PAGE)  # the request itself (this page) is refused
            with contextlib.suppress(TypeError, ValueError):
                asked = min(RETRY_AFTER_MAX_S, float(response.headers.get("Retry-After")))
            if asked >= 5 and not server.asked_to_wait:  # once: the bar may stand still a while
                server.asked_to_wait = True
                log(f"the server asks to wait {asked:.0f} s before a retry (HTTP {status}, "
                    f"Retry-After): waiting")
        attempt += 1
        if attempt <= args.max_retries:
            await asyncio.sleep(max(asked, min(30.0, 2 ** attempt) * random.uniform(0.5, 1.0)))
    return error_row(f"gave up after {args.max_retries + 1} attempts: {last_error}", SERVER)


# ---- pipeline.py: The send loop: a window of pages in flight over a client group.
class ClientGroup(contextlib.AsyncExitStack):
    """httpx clients of at most 16 requests each: httpx scans its whole pool per request."""

    def __init__(self, **client_kwargs):
        super().__init__()  # closes every client on exit
        self.client_kwargs, self.clients = client_kwargs, {}  # client: its requests in flight

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        client = min(self.clients, key=self.clients.__getitem__, default=None)
        if client is None or self.clients[client] >= 16:
            client = httpx.AsyncClient(**self.client_kwargs)
            self.push_async_callback(client.aclose)
            self.clients[client] = 0
        self.clients[client] += 1
        try:
            return await client.request(method, url, **kwargs)
        finally:
            self.clients[client] -= 1

    post = functools.partialmethod(request, "POST")
    get = functools.partialmethod(request, "GET")


PAGES_PER_ENGINE = 32  # the measured window: on l4x1 the KV cache was under 10% used at 32


class Window:
    """Pages in flight, at most --concurrency (AdaptiveWindow adapts)."""

    def __init__(self, args, run):
        self.limit, self.used, self.preparing = max(1, args.concurrency or PAGES_PER_ENGINE), 0, 0
        self.changed = asyncio.Event()  # a slot given back, the limit raised, or the run stopped
        self.body_sizes: deque[int] = deque(maxlen=256)  # of recent requests
        self.input_done = self.stopped = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, group) -> None:
        option(group, "--concurrency", type=int, at_least=1, default=None, identity=False,
               help=f"pages in flight (default: {PAGES_PER_ENGINE} per engine of the server, the "
               f"measured setting)")

    @staticmethod
    def serve_args(args, serve_args: list[str]) -> list[str]:  # for a server started here
        return []

    async def acquire(self) -> bool:
        """A slot for the next page; False once the run stopped (unstarted pages give none back)."""
        while self.used >= self.limit and not self.stopped:
            self.changed.clear()
            await self.changed.wait()
        self.used += 1
        return not self.stopped

    def release(self) -> None:
        self.used -= 1
        self.changed.set()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.changed.set()

    async def adapt(self, client, server: "ServerManager") -> None:
        """Resize the window while the pages run (an adaptive one does)."""

    async def sample(self, client, server: "ServerManager") -> None:
        """Read the server's gauges and decide (an adaptive one does)."""

    def summary(self) -> dict:
        return {}


def holds_interrupt(exc) -> bool:
    """A KeyboardInterrupt, or an exception group holding one (a signal in anyio's connect)."""
    return isinstance(exc, KeyboardInterrupt) or any(map(holds_interrupt,
                                                         getattr(exc, "exceptions", ())))


def run_async(work, interrupts) -> None:
    """asyncio.run; a signal cancels the work at its next await (Interrupts.task), which then
    stops the run as a KeyboardInterrupt, said once (any_stop_said), not as a traceback."""
    async def quietly():
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: holds_interrupt(context.get("exception")) or
            loop.default_exception_handler(context))
        interrupts.task = asyncio.current_task()
        try:
            await work
        except asyncio.CancelledError:
            if interrupts.signum is None:
                raise
            raise KeyboardInterrupt from None
        finally:
            interrupts.task = None

    asyncio.run(quietly())


async def run_server_pipeline(run, args, server: ServerManager, window: Window) -> None:
    """Start or reuse the server, then keep the window full until every pending row is done."""
    from tqdm import tqdm

    loop, stats, writer = asyncio.get_running_loop(), run.stats, run.writer
    write_lock = asyncio.Lock()
    storm = HeldFailures(SERVER, args.abort_after_failures, args.abort_after_seconds,
                         "all failed on the server's side over {:.0f} s")
    failure: list[BaseException] = []
    tasks: set[asyncio.Task] = set()

    def stop(exc: BaseException) -> None:  # the pages in flight stay pending
        failure.append(exc)
        window.stopped = True
        window.changed.set()
        for task in tasks - {asyncio.current_task()}:
            task.cancel()

    server.log_path = run.store.meta / "logs" / server.log_path.name
    async with ClientGroup(timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        # what the exit undoes, last first: the tasks, the bar, the pools, the window's stats
        client.callback(lambda: stats.extra.update(window.summary()))
        write_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")
        client.callback(write_pool.shutdown, wait=True)
        prep_pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                       thread_name_prefix="prepare")
        client.callback(prep_pool.shutdown, wait=False, cancel_futures=True)
        await server.start(client, stats)
        writer.info_entry.update(vllm_version=server.version, model_revision=server.revision)
        if not args.concurrency and server.engines > 1:  # a window for every engine
            window.resize(max(window.limit, PAGES_PER_ENGINE * server.engines))
        bar = tqdm(total=len(run.plan.send), unit="page", dynamic_ncols=True, smoothing=0.1,
                   mininterval=0.5 if sys.stderr.isatty() else 10.0)
        client.callback(bar.close)
        adapting = asyncio.create_task(window.adapt(client, server))
        client.callback(adapting.cancel)

        async def one(index: int, cell) -> None:
            latency = None
            stats.enter()  # in the task: one cancelled before it began neither enters nor leaves
            try:
                held = cell.get("bytes") if isinstance(cell, dict) else cell
                window.preparing += 1  # bytes in memory go out as they are: no pool hop
                page = isinstance(held, (bytes, bytearray, memoryview)) and \
                    read_page(cell, args, decode=False) or \
                    await loop.run_in_executor(prep_pool, read_page, cell, args, run.renderer)
                window.preparing -= 1
                if isinstance(page, RowResult):  # not sent: its error, or its text layer
                    result = page
                else:
                    layer, digest, size = page.text_layer, page.digest, (page.width, page.height)
                    body = request_body(page, server.model_name, args)
                    del page, cell, held
                    window.body_sizes.append(len(body))
                    sent = time.monotonic()
                    result = await send_until_clean(client, server, body, index, args)
                    if SEND_AGAIN is not None:  # e.g. olmOCR-2: a page said rotated, turned
                        result = await SEND_AGAIN(functools.partial(
                            send_until_clean, client, server, index=index, args=args),
                            body, result, args)
                    del body
                    latency = time.monotonic() - sent
                    result.text_layer, result.digest, result.sent_size = layer, digest, size
            except RunAborted as exc:
                return stop(exc)
            except Exception as exc:  # preparing or sending the page: this row fails, not the run
                result = exception_row(exc, PAGE)
            finally:
                stats.leave()
                window.release()  # the answer is in: the next page may go
            try:
                finish_row(writer, stats, storm, index, result, latency)
            except RunAborted as exc:  # nothing written: degenerate, or held by the storm
                return stop(exc)
            bar.update(1)
            if result.error is not None:
                bar.set_postfix(errors=stats.errors_seen, refresh=False)
            if writer.store.conflict:
                return stop(RunAborted(writer.store.conflict, EXIT_USAGE))
            if writer.due():
                async with write_lock:
                    await loop.run_in_executor(write_pool, writer.flush, False)
            writer.store.commit_if_due()

        watching = asyncio.create_task(server.watch(client, stats, storm))
        watching.add_done_callback(lambda watch: watch.cancelled() or stop(watch.exception()))
        client.callback(watching.cancel)
        for index, cell in iter_image_cells(run.source, run.plan.send):
            if not await window.acquire():
                break
            task = asyncio.create_task(one(index, cell))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        window.input_done = True
        while tasks and not failure:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        if failure:
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failure[0]
        storm.at_end(writer)
        adapting.cancel()  # then one last sample: the final state, the final counters
        await asyncio.gather(adapting, return_exceptions=True)
        await window.sample(client, server)


# ---- arguments.py: The server scripts' options, and the server's settings a run records.
def add_server_arguments(parser: argparse.ArgumentParser, window=Window) -> None:
    group = parser.add_argument_group("server")
    option(group, "--server", default=DEFAULT_SERVER, identity=False, this_machine=True,
           help="vLLM server URL: reused when it answers, else started here if local (default: "
           "%(default)s)")
    option(group, "--api-key", identity=False, help="server API key (default: VLLM_API_KEY)")
    option(group, "--serve-args", default="", identity=False,  # its flags: run_identity
           help="extra `vllm serve` arguments, appended after the script's own so they override "
           "them, e.g. \"--max-model-len 16384\"")
    option(group, "--no-spawn", action="store_true", identity=False, this_machine=True,
           help="never start a server: wait for --server (up to --server-timeout)")
    option(group, "--server-timeout", type=float, above=0, default=1800.0, identity=False,
           help="seconds to wait for a server to be ready (default: 1800)")
    option(group, "--server-down-timeout", type=float, above=0, default=300.0, identity=False,
           help="seconds a server may go without answering (/health, a page) mid-run before "
           "the run stops (default: 300; rerun to resume)")
    option(group, "--max-restarts", type=int, at_least=0, default=3, identity=False,
           help="restarts of a spawned server that dies mid-run (default: 3)")
    option(group, "--request-timeout", type=float, above=0, default=900.0, identity=False,
           help="seconds for one page's answer (default: 900)")
    option(group, "--max-retries", type=int, at_least=0, default=4, identity=False,
           help="retries of a page after a timeout, 429 or 5xx (default: 4)")
    option(group, "--abort-after-failures", type=int, default=20, identity=False,
           help="stop after this many pages in a row fail on the server's side (5xx, timeouts) "
           "over --abort-after-seconds (default: 20)")
    option(group, "--abort-after-seconds", type=float, default=60.0, identity=False,
           help="see --abort-after-failures (default: 60)")
    window.add_arguments(parser, group)


PARALLEL_FLAGS = ("--data-parallel-size", "--tensor-parallel-size", "--pipeline-parallel-size",
                  "-dp", "-tp", "-pp")


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() not in ("", "-1")])
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    return 0


def serve_settings(serve_args: list[str]) -> dict:
    """The server's flags as the run's identity holds them (a bare flag: True)."""
    return {flag: values[0] if len(values) == 1 else values or True
            for flag, values, _ in flag_items(serve_args) if flag}

# ==== END SERVER HELPERS ====


if __name__ == "__main__":
    sys.exit(main())
