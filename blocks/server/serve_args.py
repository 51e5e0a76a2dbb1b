"""The vLLM server's flags: the script's own, --serve-args, what they say."""

import json
import re
import shlex
import urllib

from blocks.common.secrets import flag_items, flag_words
from blocks.model import SERVE_ARGS

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
