"""Secrets: which values are secrets, and their masks in logs, argv and records."""

import contextlib
import json
import re
import shlex

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
