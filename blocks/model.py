"""The model section, as the blocks, the tests and ocr-jobs.py see it: the one interface between
a script's model section and everything that reads it. No script carries this file.

A block reaches the model section only through the names below. In a script they are globals
the model section defines before the blocks run; in a module of blocks/ they are imported from
here (`from blocks.model import ...`, in the part above the BEGIN line, which the assembler
leaves out), so that ruff knows every name and a test can import a block. Each value here is a
placeholder of the right type; a script's model section sets the real one. The names are
grouped by who needs them (the comment above each group); tools/sync_helpers.py refuses to write
(and --check fails on) a script whose model section lacks one its shape needs, naming it with
its comment here.

Besides these, a block reads an optional model-section name with its default, at the top of
the block that uses it: `NAME = globals().get("NAME", default)`. A model section sets one only
where its model differs. Every one, with its default, the block that reads it and its meaning
(tests/test_block_interface.py holds this list equal to the blocks' reads):

    MODEL_REVISION = None  # common: a commit sha or tag that pins the weights
    RESIZE_FILTER = "bicubic"  # common: the model's own resampling filter (a PIL name)
    LOOP_TEMPERATURE = 0.3  # common: the temperature of a looping page's second try
    IMAGE_TAG_MOVING = False  # common: True: JOB_IMAGE's tag is no fixed build
    PDF_DPI = 400  # common: a PDF page's render DPI (--pdf-dpi's default)
    REPETITION_DETECTION = (32, 64)  # common: vLLM's (max_pattern_size, min_count) for
        --repetition-detection
    REPETITION_DETECTION_ON = False  # common: True: --repetition-detection is on by default
    REPETITION_DETECTION_NOTE = ""  # common: what the card says of it, when on
    MODEL_CARD_NOTE = ""  # common: Markdown the card must say of the model (a licence term, a
        warning of what the script leaves out)
    POSTPROCESS_GETS_SIZE = False  # common: True: server scripts call `postprocess(text, args,
        (width, height))` with the size the page was sent at, for a model whose boxes are in
        its input's pixels
    IMAGE_HAS_UV = True  # common: False: JOB_IMAGE has no uv, so the Jobs command is the
        docstring's `hf jobs run` form
    JOB_PAGES_PER_S = None  # common: pages/s measured on the header's flavor, what the Jobs
        timeout covers (ocr-jobs.py also reads `^JOB_PAGES_PER_S = <number>` from the script's
        text to plan shards); left out when none was measured
    API_SERVER_COUNT = 1  # saturate: the API servers a server started here runs, on a flavor
        of 12+ CPUs (measured for the model)
    SEND_AGAIN = None  # server: an async function `(send, body, result, args) -> RowResult`
        that, given a page's answer, may send the page again changed (`await send(new_body)`
        sends it with its loop retries) and returns the row's result, its `attempts` counting
        every send and its `resent` the sends it made (olmOCR-2 turns a page the model says is
        rotated)

Optional names read outside the blocks: SERVED_NAME (the tests: the name a server
script's `--served-model-name` gives the model), DEFAULT_PROMPT_MODE (the tests, where a script
has prompt modes).

Not a name, but read the same way: the PEP 723 header at the top of the script, whose
`dependencies` `uv run` installs (never vllm or torch: the image has them) and whose
`[tool.hf-jobs]` table (`image` = JOB_IMAGE, `flavor`, `timeout`, `secrets`) `hf jobs uv run`
and ocr-jobs.py read; models.json repeats image, flavor and timeout (tests/test_registry.py).
A script whose image has no uv (IMAGE_HAS_UV False) has no such table: its models.json entry's
`run_command` says how to start it.

The other way, a model section (and a model part, blocks/<model>.py) reaches the blocks only
through MODEL_SECTION_HELPERS below: its functions call them at run time, after the blocks are
defined (a section that calls one at import, as dots.mocr's counts its context with the patch
grid helpers, carries that block above it).
"""

# The blocks' names a model section or model part may use besides builtins, its own names and
# its own imports, with the block that defines them (tests/test_scripts.py holds every script
# and model part to this list). The modules a block imports are among them: imported again in
# a model section that uses them only in functions, ruff would call it a redefinition (F811).
MODEL_SECTION_HELPERS = {
    **dict.fromkeys([
        "repeated_tail",  # (period, repeats) of a run repeated at the end of a text
        "RowResult", "error_row", "SERVER",  # a page's result, an error row, its rerun kind
        "encode_page",  # a page resized and encoded: (data, mime, width, height)
        "log", "fail",  # a line to stderr, secrets masked; an error that stops the run
        "option",  # add_argument that says whether the option is part of the run's identity
        "was_given",  # whether the command line gave an option (not its default)
        "requested_revision", "resolved_revision",  # the weights' revision asked for; its sha
        "argparse", "io", "json", "math", "Path",  # the block's imports
    ], "COMMON HELPERS"),
    **dict.fromkeys(["asyncio", "base64"], "SERVER HELPERS"),  # the block's imports
    "block_box": "GROUNDING HELPERS",  # a parsed box as four ints in [0, top], or None
    **dict.fromkeys([  # a Qwen2-VL-style processor's image sizes and tokens
        "patch_grid_tokens", "max_patch_grid_tokens", "snap_to_patch_grid", "per_frame",
    ], "PATCH GRID HELPERS"),
}

# Every script, read by the tests, ocr-jobs.py and models.json's checks (no block reads them)
IMAGE_TAG = "v0.0.0"  # the tag of JOB_IMAGE: tests/pinned_vllm.py checks that vLLM release's
# parser, request fields and model registry against the script (a vendor image: its fork's base)
IMAGE_HAS_UV = True  # False: the image has no uv, so no `hf jobs uv run`; ocr-jobs.py reads
# `^IMAGE_HAS_UV = False` from the text and starts it with `hf jobs run` instead
MAX_MODEL_LEN = 32768  # the context SERVE_ARGS or LLM_KWARGS give (the offline block reads it)
PREFIX_CACHING = False  # what SERVE_ARGS or LLM_KWARGS set (the serve-flag tests hold them equal)

# Every script (common block)
MODEL_ID = "org/model"  # the Hub id of the weights
JOB_IMAGE = "vllm/vllm-openai:tag"  # the image a Job runs in
SCRIPT_SHAPE = "server"  # "server", "saturate" or "offline"
PAGE_FORMAT = "jpeg"  # the format of pages that must be converted or resized
DEFAULT_MAX_TOKENS = 4096  # --max-tokens when none is given
EXTRA_COLUMNS: dict = {}  # column suffix -> "blocks", "string", "bool" or "int32": model-specific
# output columns (a document's row, --per-document: blocks joined, strings marked by page,
# a bool or an int its pages' one value, else null)


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """The size a page is sent at, with these arguments (None: the defaults)."""
    raise NotImplementedError


def image_token_budget(args=None) -> int:
    """Worst-case prompt tokens of one page, with these arguments (None: the defaults)."""
    raise NotImplementedError


def model_argument_problems(args) -> list[str]:
    """What is wrong in the model's own options, refused with the other argument problems."""
    raise NotImplementedError


def add_model_arguments(parser) -> None:
    """The model's own command-line options, each added by the common block's
    `option(parser, *flags, identity=..., **add_argument_kwargs)`: identity=True when a rerun
    into the same OUTPUT must repeat it (it changes the text), False when it may change; a
    number may declare its bounds too (at_least=, above=), checked with the other arguments."""
    raise NotImplementedError


def postprocess(text: str, args) -> tuple[str, dict]:
    """The model's answer -> (Markdown, {column suffix: extra value})."""
    raise NotImplementedError


def inference_settings(args) -> dict:
    """What the inference_info entry and the card record about the model's settings."""
    raise NotImplementedError


# Server scripts (server block)
SERVE_ARGS: list = []  # `vllm serve` arguments after the model id
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"  # --server's default


def spawn_args(args) -> list[str]:
    """Serve arguments known only when the script starts the server itself."""
    raise NotImplementedError


def build_request(image_url: str, args) -> dict:
    """One chat-completions request body for one page."""
    raise NotImplementedError


# Offline scripts (offline block)
VLLM_REQUIREMENT = ">=0"  # what `uv run --with vllm...` asks for where none is installed
LLM_KWARGS: dict = {}  # vllm.LLM(**LLM_KWARGS)
CHAT_KWARGS: dict = {}  # llm.chat(..., **CHAT_KWARGS)


def build_messages(image_url: str, args) -> list[dict]:
    """One conversation for one page."""
    raise NotImplementedError


def sampling_kwargs(args) -> dict:
    """vllm.SamplingParams(**sampling_kwargs(args))."""
    raise NotImplementedError
