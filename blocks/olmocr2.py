"""The olmOCR-2 model section of olmocr2-server.py: the toolkit's prompt and settings, the page at
a 1288 px longest side, the YAML front matter parsed into columns, and a page the model says is
rotated sent again turned (the server block's optional SEND_AGAIN).

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN line on)
into the script. Its functions may call the blocks' helpers (imported below), which the script
defines before they run.
"""

import asyncio
import base64
import io

from blocks.common.arguments import option
from blocks.common.pages import encode_page
from blocks.common.rows import error_row, RowResult, SERVER
from blocks.patch_grid import max_patch_grid_tokens

# ==== BEGIN OLMOCR-2 MODEL (source: blocks/olmocr2.py) ====
# The model section of olmocr2-server.py (edit the source, then run tools/sync_helpers.py).
MODEL_ID = "allenai/olmOCR-2-7B-1025"  # BF16: the weights ocr-bench ran on a10g-small
IMAGE_TAG = "v0.26.0"  # vllm/vllm-openai:<tag>: registers Qwen2_5_VLForConditionalGeneration
JOB_IMAGE = f"vllm/vllm-openai:{IMAGE_TAG}"
IMAGE_HAS_UV = True  # the vLLM images have uv: ocr-jobs.py submits with run_uv_job
SCRIPT_SHAPE = "server"

# build_no_anchoring_v4_yaml_prompt() of the olmOCR toolkit, character for character ("LateX"
# is the source's spelling)
PROMPT = (
    "Attached is one page of a document that you must process. Just return the plain text "
    "representation of this document as if you were reading it naturally. Convert equations to "
    "LateX and tables to HTML.\nIf there are any figures or charts, label them with the following "
    "markdown syntax ![Alt text describing the contents of the figure]"
    "(page_startx_starty_width_height.png)\nReturn your output as markdown, with a front matter "
    "section on top specifying values for the primary_language, is_rotation_valid, "
    "rotation_correction, is_table, and is_diagram parameters."
)
MAX_MODEL_LEN = 16384  # the toolkit's --max-model-len, and every run found
DEFAULT_MAX_TOKENS = 8000  # the toolkit's (ocr-bench 4096, the reference script 8192)
TEMPERATURE = 0.1  # the toolkit's first attempt, and the reference script's (ocr-bench 0.0)
ROTATION_ATTEMPTS = 8  # sends of one page in all while it is said rotated (--max_page_retries)
LONGEST_SIDE = 1288  # the card: "rendered such that the longest dimension is 1288 pixels"
RESIZE_FILTER = "lanczos"  # the reference script's, up or down
PAGE_FORMAT = "png"  # the toolkit sends PNG renders
PATCH_FACTOR = 28  # Qwen2.5-VL: 14 px patches merged 2x2
PROMPT_TEXT_TOKENS = 600  # the 557-byte prompt (a token is at least a byte) and the chat template
PREFIX_CACHING = False
# YAML front matter -> column (suffix) and its type; the body is the Markdown
FRONT_MATTER = {"primary_language": "string", "is_rotation_valid": "bool",
                "rotation_correction": "int32", "is_table": "bool", "is_diagram": "bool"}
EXTRA_COLUMNS = {**FRONT_MATTER, "raw": "string"}  # suffix -> "blocks", "string", "bool", "int32"
TURNS = {90: "ROTATE_90", 180: "ROTATE_180", 270: "ROTATE_270"}  # PIL's: counter-clockwise
MODEL_CARD_NOTE = (
    "The model's YAML front matter is parsed into the columns ending `_primary_language`, "
    "`_is_rotation_valid`, `_rotation_correction`, `_is_table` and `_is_diagram` (null when the "
    "answer has none, or a value is not of its type). A page the model said was rotated was "
    "sent again turned counter-clockwise by the sum of its corrections, as the olmOCR toolkit "
    "does: `_attempts` counts those sends too, and the front matter is the last answer's.")

SERVE_ARGS = [
    "--max-model-len", str(MAX_MODEL_LEN),
    "--limit-mm-per-prompt", '{"image": 1}',
    "--enable-prefix-caching" if PREFIX_CACHING else "--no-enable-prefix-caching",
    "--mm-processor-cache-gb", "0",
]
SERVE_ENV: dict = {}  # environment variables the spawned `vllm serve` needs
DEFAULT_SERVER = "http://127.0.0.1:8000"


def spawn_args(args) -> list[str]:
    """Serve arguments known only when this script starts the server itself (none here)."""
    return []


def target_size(width: int, height: int, args=None) -> tuple[int, int]:
    """The longest side at 1288 px, up or down, as the toolkit renders every page."""
    scale = LONGEST_SIDE / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def image_token_budget(args=None) -> int:
    """The largest page, a 1288 px square (46 x 46 image tokens: 1288 is 46 x 28, so no page of
    that longest side snaps to more), and the text around it."""
    return max_patch_grid_tokens(LONGEST_SIDE ** 2, PATCH_FACTOR) + PROMPT_TEXT_TOKENS


def model_argument_problems(args) -> list[str]:
    problems = []
    if args.rotation_attempts < 1:
        problems.append(f"--rotation-attempts counts every send of a page, the first included: "
                        f"at least 1 (1 never turns a page), got {args.rotation_attempts}")
    if not 0 <= args.temperature < float("inf"):  # vLLM refuses below 0; nan fails this too
        problems.append(f"--temperature must be a number from 0 up, got {args.temperature}")
    return problems


def add_model_arguments(parser) -> None:
    option(parser, "--temperature", identity=True, type=float, default=TEMPERATURE,
           help=f"sampling temperature (default: {TEMPERATURE}, the toolkit's)")
    option(parser, "--rotation-attempts", type=int, default=ROTATION_ATTEMPTS, metavar="N",
           identity=True, help="sends of one page in all while the model says it is rotated, each "
                "turned by the corrections so far (default: "
                f"{ROTATION_ATTEMPTS}, the toolkit's; 1: never turn a page)")
    option(parser, "--keep-raw", identity=True, action="store_true",
           help="also keep the answer as the model wrote it, front matter and all, "
                "in <column>_raw")


def build_request(image_url: str, args) -> dict:
    """One chat request as the toolkit sends it: the prompt first, then the page."""
    return {
        "messages": [{
            "role": "user",
            "content": [
                {"type": "text", "text": PROMPT},
                {"type": "image_url", "image_url": {"url": image_url}},
            ],
        }],
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
    }


def split_front_matter(text: str) -> tuple[dict | None, str]:
    """(the front matter's fields as strings, the body): the toolkit's reading, where a text that
    starts with `---` holds YAML up to the next `\\n---`. No front matter, or YAML that is not a
    mapping: (None, the text as it is)."""
    import yaml

    stripped = text.lstrip()
    end = stripped.find("\n---", 3)
    if not stripped.startswith("---\n") or end < 0:
        return None, text
    try:  # every scalar as a string: `no` stays Norwegian, `null` is read below
        fields = yaml.load(stripped[4:end], Loader=yaml.BaseLoader) or {}
    except yaml.YAMLError:
        return None, text
    if not isinstance(fields, dict):
        return None, text
    return fields, stripped[end + 4:].strip()


def typed_value(value, kind: str):
    """A front matter value as its column's type; None when it is not one."""
    if not isinstance(value, str) or value.lower() in ("", "null", "none", "~"):
        return None
    if kind == "bool":
        return {"true": True, "false": False}.get(value.lower())
    if kind == "int32":
        return int(value) if value.lstrip("-").isdigit() and abs(int(value)) < 2 ** 31 else None
    return value


def postprocess(text: str, args) -> tuple[str, dict]:
    """The body as the Markdown, the front matter as columns; an answer without one (cut inside
    it, or malformed) is kept whole, its columns null."""
    fields, body = split_front_matter(text)
    extras = {name: typed_value((fields or {}).get(name), kind)
              for name, kind in FRONT_MATTER.items()}
    return body, {**extras, "raw": text} if args.keep_raw else extras


def rotation_asked(result: "RowResult") -> int | None:
    """The correction an answer asks for: is_rotation_valid false with 90, 180 or 270."""
    if result.error is not None or not result.text:
        return None
    fields, _ = split_front_matter(result.text)
    if fields is None or typed_value(fields.get("is_rotation_valid"), "bool") is not False:
        return None
    correction = typed_value(fields.get("rotation_correction"), "int32")
    return correction if correction in TURNS else None


def turned_body(body: bytes, degrees: int) -> bytes:
    """The request with its page turned counter-clockwise by `degrees` (0: as it was), as PNG."""
    from PIL import Image

    start = body.index(b'"data:image/') + 1
    end = body.index(b'"', start)
    img = Image.open(io.BytesIO(base64.b64decode(body[start:end].split(b",", 1)[1])))
    if degrees:
        img = img.transpose(getattr(Image.Transpose, TURNS[degrees]))
    data, mime, *_ = encode_page(img, img.size)
    return b"".join((body[:start], b"data:", mime.encode(), b";base64,",
                     base64.b64encode(data), body[end:]))


async def send_turned(send, body: bytes, result: "RowResult", args) -> "RowResult":
    """While the answer says the page is rotated, send the page again turned by the sum of the
    corrections so far (as the toolkit does), up to --rotation-attempts sends in all; the last
    answer is kept. `send(body)` sends one body (and its loop retries)."""
    turned = 0
    while (correction := rotation_asked(result)) and \
            (result.attempts or 1) < args.rotation_attempts:
        turned = (turned + correction) % 360
        again = await send(await asyncio.to_thread(turned_body, body, turned))
        if again.error is not None and again.error_kind == SERVER:  # a rerun redoes the page
            return error_row(f"the page was said rotated, and sending it again turned failed: "
                             f"{again.error}", SERVER)
        sends, resent = (result.attempts or 1) + (again.attempts or 1), result.resent + 1
        result = again if again.error is None else result  # refused turned: the last answer
        result.attempts, result.resent = sends, resent
        if again.error is not None:
            break
    return result


def inference_settings(args) -> dict:
    """What the inference_info entry and the card record about this model's settings."""
    return {"prompt": PROMPT, "temperature": args.temperature, "max_tokens": args.max_tokens,
            "longest_side": LONGEST_SIDE, "image_format": PAGE_FORMAT,
            "rotation_attempts": args.rotation_attempts}


SEND_AGAIN = send_turned  # the server block sends every answered page through it
# ==== END OLMOCR-2 MODEL ====
