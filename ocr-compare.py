# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "datasets>=3.0",
#     "pyarrow>=15",
#     "numpy",
#     "rapidfuzz>=3.6",
#     "matplotlib>=3.7",
#     "markdown-it-py>=3.0",
#     "mdit-py-plugins>=0.4",
#     "nh3>=0.2.14",
#     "pillow>=10.4",
#     "pypdfium2>=4.30",
# ]
# ///
"""Compare OCR outputs: parity between two runs, or accuracy against ground truth.

No GPU, no vllm: it reads two datasets (or one and its ground truth) and prints a table.

Parity (two runs: offline vs server, two models, before and after a vLLM upgrade)
    uv run ocr-compare.py ./run-offline ./run-server
    rows are matched by key, then: how many are byte-identical, the similarity of the rest
    (1 - Levenshtein distance / the longer length: min, p5, median), the rows where one side
    failed or looped, and the worst pairs side by side.

Accuracy (against ground truth)
    uv run ocr-compare.py ./scans-ocr --reference-column text        # ground truth in A
    uv run ocr-compare.py ./scans-ocr --reference user/scans-gt --reference-column text
    uv run ocr-compare.py ./model-a ./model-b --reference user/scans-gt   # two models, one truth
    CER and WER per page and overall: the pooled (micro) rate is the headline (all edits over
    all reference characters), then the per-page median and the per-page mean (the figure
    the collection's source document quotes). Only pages whose normalised reference has at
    least --min-reference-chars characters count. A looping page (finish reason `length`
    with a repeated tail, or degenerate output) counts with its rate capped at 1, and the
    rates without looping pages are printed beside; error rows (no text) are left out and
    reported as a rate of their own. PDF pages not sent because their text layer was enough
    (--skip-text-pages) are neither: they are left out and counted apart.

olmOCR-Bench (the official scorer, over a run of the benchmark's PDFs)
    uv run ocr-compare.py ./run-1 [./run-2 ...] --olmocr-bench ./olmOCR-bench/bench_data
    each output is one repeat; its Markdown is written into DIR/<candidate> in the
    benchmark's layout (a failed or missing page as an empty .md) and scored by
    olmocr[bench] at a pinned version, installed by uv for this mode only: the headline (the
    mean of the per-file pass rates) with its 95% CI, per test type and per test file, and
    the settings from inference_info. Without Playwright's Chromium the math tests are left
    out and the score is labelled not comparable to published figures.

Look at the pages (--html REPORT.html, with any of the modes above, or with A alone)
    uv run ocr-compare.py ./scans-ocr --html look.html --show 50     # a first run: its pages
    uv run ocr-compare.py ./a ./b --html parity.html --show 100       # worst pages first
    uv run ocr-compare.py ./pdfs-ocr --html look.html --input ./pdfs  # PDF pages: from the input
    one file that opens offline in any browser: per page, its image (a thumbnail; a click opens
    the larger view), the Markdown rendered (tables; formulas as written) and as source, its
    error, skip reason and loop flag, and when comparing, the other run's text (or the
    reference) with the differences marked and the page's similarity or CER. Pages come worst
    first when there is a figure to rank by, else in input order; --show bounds them, so the
    file grows with the pages shown (0.56 MB a page with the larger views, 0.07 MB without,
    --html-page-px 0, on 150 dpi scans: benchmarks/report_size.py). A model's answer is untrusted: its HTML passes an allow-list, and the
    page's Content-Security-Policy lets no script run and nothing load from the network.

A, B and --reference are Hub dataset ids (user/name) or local paths: an output folder of the
collection (data/*.parquet), a .parquet file or folder of them, or a save_to_disk folder.

Rows are matched by --key COL[,COL]; by default by the page each row was made from, the
column the run manifest (OUTPUT/.ocr/manifest.json) names as its row identity (input_digest:
byte-identical pages are interchangeable, so any shuffle, subset or stacked run pairs), else
by `file_name` (with `page_number` where both sides have it), else by row order when neither
run manifest records --shuffle and both sides have the same number of rows (else refused).

Normalisation (--normalise, printed with every figure; characters are Unicode code points)
    diplomatic  Unicode NFC, whitespace runs collapsed to one space
    reading     (default) Markdown and HTML markup stripped, NFKC, invisible characters
                dropped, quotes and dashes unified, line-end hyphenation joined, case
                folded, whitespace collapsed
    Byte-identical counts always compare the raw text.

More examples
    uv run ocr-compare.py ./a ./b --json parity.json --plot parity.png
    uv run ocr-compare.py ./out --reference-column gt --by volume --rows pages.csv
    uv run ocr-compare.py user/a user/b --column markdown --column-b text --key page_id

Exit status: 0 when the comparison ran, 2 on a usage or input problem, 1 when the
olmOCR-Bench scorer could not be installed or failed (each said in one line).
"""

import argparse
import base64
import csv
import hashlib
import html
import io
import json
import math
import os
import re
import sys
import time
import unicodedata
import zlib
from dataclasses import dataclass, field
from pathlib import Path

# Not a model script: tests/conftest.py, tools/sync_helpers.py and the registry tests skip
# every top-level script that carries this line (no models.json entry, no helper blocks).
SCRIPT_KIND = "tool"

PROG = "ocr-compare.py"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_KEY = ("file_name", "page_number")  # page_number is used where both sides have it
MANIFEST = Path(".ocr") / "manifest.json"
ROW_IDENTITY = "input_digest"  # the model scripts' column naming the page a row was made from
CHARACTERS_NOTE = "characters are Unicode code points; words are whitespace-separated"


class UsageError(Exception):
    """A problem with the arguments or the input: printed in one line, exit 2."""


# ---- normalisation ----------------------------------------------------------------------------
# Each normalisation has a name and a version. Change what one does and its version goes up, so
# figures computed under different rules are never mistaken for each other.

_WS = re.compile(r"\s+")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_HTML_BREAK = re.compile(r"<br\s*/?>|</?(?:p|div|tr|li|ul|ol|h[1-6]|table|thead|tbody|tfoot|"
                         r"blockquote|pre|caption|figure|section)\b[^>]*>", re.I)
_HTML_CELL = re.compile(r"</?(?:td|th)\b[^>]*>", re.I)
_HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
# Line markup, matched against one line at a time (only lines that start with a mark are read)
_LINE_MARKS = frozenset("#>-*+_|`~:")
_MD_FENCE = re.compile(r"[ \t]*(?:```|~~~)")
_MD_RULE = re.compile(r"[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t\r]*$")
_MD_TABLE_RULE = re.compile(r"[ \t]*\|?(?:[ \t]*:?-{3,}:?[ \t]*\|)+(?:[ \t]*:?-{3,}:?[ \t]*)?[ \t\r]*$")
_MD_QUOTE = re.compile(r"[ \t]*(?:>[ \t]?)+")
_MD_HEADING = re.compile(r"[ \t]{0,3}#{1,6}(?:[ \t]+|$)")
_MD_BULLET = re.compile(r"[ \t]*[-*+][ \t]+")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MD_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1", re.S)
_MD_EM_STAR = re.compile(r"\*(?=[^\s*])(.+?)(?<=[^\s*])\*", re.S)
_MD_EM_UNDER = re.compile(r"_(?<!\w_)(?=[^\s_])(.+?)(?<=[^\s_])_(?!\w)", re.S)  # "_" first: fast
_MD_STRIKE = re.compile(r"~~(.+?)~~", re.S)
_MD_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
# An escaped character (\*) is set aside as a private-use code point while the markup is
# stripped, so that it is never read as markup, and put back as itself at the end.
_ESCAPED = re.compile("[\U000F0021-\U000F007E]")
_HYPHENATION = re.compile(r"[-¬](?<=\w[-¬])[ \t]*\n[ \t]*(?=\w)")  # the hyphen first: fast
_QUOTE_DASH_MAP = {
    **{c: "'" for c in "\u2018\u2019\u201a\u201b\u2032\u2039\u203a"},
    **{c: '"' for c in "\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb\u301d\u301e"},
    **{c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2043\u2212\u2e17\ufe58\ufe63\uff0d"},
}
# A regex over the few characters to replace, not str.translate: translate looks every
# character of the page up in its table (about 0.2 ms a page), a regex scan is ten times faster.
_QUOTE_DASH = re.compile("[" + "".join(_QUOTE_DASH_MAP) + "]")
_QUOTE_DASH_CHARS = frozenset(_QUOTE_DASH_MAP)
_invisible: tuple | None = None


def _invisible_chars() -> tuple:
    """Format characters (zero-width space and joiners, soft hyphen, BOM, direction marks) and
    control characters other than whitespace, which `reading` drops: (set, pattern). Built
    once, on first use, from this Python's Unicode database: the planes where Unicode puts
    them (0 and 1, and the tags of plane 14); the others hold ideographs and private use."""
    global _invisible
    if _invisible is None:
        points = [cp for cp in (*range(0x20000), *range(0xE0000, 0xE1000))
                  if unicodedata.category(chr(cp)) in ("Cf", "Cc") and not chr(cp).isspace()]
        ranges, start, prev = [], points[0], points[0]
        for cp in points[1:] + [-1]:
            if cp != prev + 1:
                ranges.append(re.escape(chr(start)) if start == prev
                              else f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
                start = cp
            prev = cp
        _invisible = (frozenset(map(chr, points)), re.compile("[" + "".join(ranges) + "]+"))
    return _invisible


def _drop_invisible(text: str, chars: set) -> str:
    invisible, pattern = _invisible_chars()
    # a set test on the page's distinct characters costs a fraction of a regex scan of the page
    return text if invisible.isdisjoint(chars) else pattern.sub("", text)


def _strip_line(line: str) -> str:
    if _MD_FENCE.match(line) or _MD_RULE.match(line) or _MD_TABLE_RULE.match(line):
        return ""
    for pattern in (_MD_QUOTE, _MD_HEADING, _MD_BULLET):  # "> - item", "> # title"
        match = pattern.match(line)
        if match:
            line = line[match.end():]
    return line


def _strip_lines(text: str) -> str:
    """Fences, rules, table rules, quote marks, heading marks and bullets: a line at a time,
    and only the lines that start with one of their characters (a regex over the whole page
    per kind of markup costs several times more)."""
    lines = text.split("\n")
    changed = False
    for k, line in enumerate(lines):
        if line.lstrip(" \t")[:1] in _LINE_MARKS:
            stripped = _strip_line(line)
            if stripped is not line:
                lines[k], changed = stripped, True
    return "\n".join(lines) if changed else text


def strip_markup(text: str) -> str:
    """Markdown and HTML markup out, the text it marks up kept (line structure kept too)."""
    escaped = "\\" in text
    if escaped:
        text = _MD_ESCAPE.sub(lambda m: chr(0xF0000 + ord(m.group(1))), text)
    if "<" in text:
        text = _HTML_COMMENT.sub("", text)
        text = _HTML_BREAK.sub("\n", text)
        text = _HTML_CELL.sub(" ", text)
        text = _HTML_TAG.sub("", text)
    if "&" in text:
        text = html.unescape(text)
    text = _strip_lines(text)
    if "](" in text:
        text = _MD_IMAGE.sub("", text)
        text = _MD_LINK.sub(r"\1", text)
    if "**" in text or "__" in text:
        text = _MD_STRONG.sub(r"\2", text)
    if "*" in text:
        text = _MD_EM_STAR.sub(r"\1", text)
    if "_" in text:
        text = _MD_EM_UNDER.sub(r"\1", text)
    if "~~" in text:
        text = _MD_STRIKE.sub(r"\1", text)
    if "`" in text:
        text = text.replace("`", "")
    if "|" in text:
        text = text.replace("|", " ")
    if escaped:
        text = _ESCAPED.sub(lambda m: chr(ord(m.group()) - 0xF0000), text)
    return text


def diplomatic_words(text: str) -> list[str]:
    return unicodedata.normalize("NFC", text).split()


def reading_words(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text)
    chars = set(text)
    text = _drop_invisible(text, chars)
    if "&" in chars:  # an entity may stand for a character NFKC changes or an invisible one
        text = unicodedata.normalize("NFKC", strip_markup(text))
        chars = set(text)
        text = _drop_invisible(text, chars)
    else:
        text = strip_markup(text)  # removes characters only: `chars` still covers the text
    if not _QUOTE_DASH_CHARS.isdisjoint(chars):
        text = _QUOTE_DASH.sub(lambda m: _QUOTE_DASH_MAP[m.group()], text)
    if "\n" in chars and ("-" in chars or "\u00ac" in chars):
        text = _HYPHENATION.sub("", text)
    return text.casefold().split()


def normalise_diplomatic(text: str) -> str:
    return " ".join(diplomatic_words(text))


def normalise_reading(text: str) -> str:
    return " ".join(reading_words(text))


@dataclass(frozen=True)
class Normalisation:
    name: str
    version: int
    apply: object  # text -> normalised text (words joined by one space)
    words: object  # text -> its words: the same split once, for WER
    summary: str

    @property
    def label(self) -> str:
        return f"{self.name}-v{self.version}"


NORMALISATIONS = {
    "diplomatic": Normalisation("diplomatic", 1, normalise_diplomatic, diplomatic_words,
                                "Unicode NFC, whitespace collapsed"),
    "reading": Normalisation("reading", 1, normalise_reading, reading_words,
                             "Markdown/HTML markup stripped, NFKC, invisible characters dropped, "
                             "quotes and dashes unified, line-end hyphenation joined, case folded, "
                             "whitespace collapsed"),
}


# ---- looping detection (the collection's detector, copied: scripts share no code) --------------

def repeated_tail(text: str, max_period: int = 200) -> tuple[int, int]:
    """(period, repeats) of the longest run of one unit repeated at the end of text.

    The model scripts' answer, found faster: a unit repeated at least twice ends in the
    text's last character, so only the periods where that character recurs are tried."""
    best = (0, 0)
    n = len(text)
    limit = min(max_period, n // 2)
    if limit < 1:
        return best
    last, low, pos = text[-1], n - 1 - limit, n - 2
    while pos >= low:
        pos = text.rfind(last, low, pos + 1)
        if pos < 0:
            break
        period = n - 1 - pos
        pos -= 1
        unit = text[-period:]
        repeats, end = 1, n - period
        while end >= period and text[end - period:end] == unit:
            repeats += 1
            end -= period
        if repeats >= 2 and repeats * period > best[0] * best[1]:
            best = (period, repeats)
    return best


def looks_degenerate(text: str | None) -> bool:
    """Empty, one character over and over, or mostly a repetition loop (the model scripts'
    sanity check, same thresholds)."""
    if not text or not text.strip():
        return True
    # (the model scripts' copy lists every visible character; the set of distinct ones decides
    # the same question without a Python loop over the page)
    distinct = {c for c in set(text) if not c.isspace()}
    if len(distinct) <= 2 and sum(text.count(c) for c in distinct) >= 8:
        return True
    if len(text) >= 40:
        period, repeats = repeated_tail(text)
        if repeats >= 5 and period * repeats >= len(text) * 0.5:
            return True
    if len(text) >= 200:
        data = text.encode()
        if len(zlib.compress(data)) < len(data) * 0.05:
            return True
    return False


def is_looping(text: str | None, finish_reason: str | None) -> bool:
    """A page that ran out of tokens repeating itself, or degenerate output."""
    if text is None:
        return False  # an error row, counted as such
    if finish_reason == "length":
        period, repeats = repeated_tail(text)
        if repeats >= 5 and period * repeats >= 100:
            return True
    return looks_degenerate(text)


# ---- distances ---------------------------------------------------------------------------------

def edit_distance(a, b) -> int:
    """Levenshtein distance of two strings (or two lists of words), exact.

    rapidfuzz first with a bound: below it, its banded algorithm answers several times faster
    on the near-identical pages OCR comparisons are mostly made of, and the answer is exact;
    above it (it then answers bound + 1), once more without one."""
    from rapidfuzz.distance import Levenshtein

    bound = max(32, abs(len(a) - len(b)), max(len(a), len(b)) // 16)
    distance = Levenshtein.distance(a, b, score_cutoff=bound)
    return distance if distance <= bound else Levenshtein.distance(a, b)


def similarity(distance: int, a_len: int, b_len: int) -> float:
    longer = max(a_len, b_len)
    return 1.0 if longer == 0 else 1.0 - distance / longer


def quantile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ---- loading -----------------------------------------------------------------------------------

@dataclass
class Side:
    """One dataset, reduced to the columns the comparison needs (as Python lists)."""
    label: str
    spec: str
    description: str
    num_rows: int
    available: list[str]
    columns: dict[str, list] = field(default_factory=dict)
    manifest_key: list[str] | None = None  # the column(s) naming the page a row was made from
    shuffled: bool = False  # its run manifest records --shuffle: row order means nothing

    def has(self, name: str) -> bool:
        return name in self.available

    def column(self, name: str) -> list:
        return self.columns[name]


def is_local(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or Path(spec).expanduser().exists()


def local_parquet_files(path: Path) -> list[Path]:
    """A collection output keeps its rows in data/*.parquet (parts named by row range, so name
    order is row order); anything else: every .parquet below the folder."""
    data = path / "data"
    if data.is_dir():
        files = sorted(data.glob("*.parquet"))
        if files:
            return files
    return sorted(p for p in path.rglob("*.parquet") if ".ocr" not in p.parts and "logs" not in p.parts)


def read_manifest(path: Path) -> dict | None:
    """A collection output's run manifest (OUTPUT/.ocr/manifest.json), None when it has none."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def apply_manifest(side: "Side", manifest: dict | None) -> "Side":
    """What matching needs of a run manifest, the one place that knows its layout: the column(s)
    its `row_identity` names (the page each row was made from, written since manifest format 2),
    and whether the run read its input shuffled (`--shuffle`, among the identity's options)."""
    manifest = manifest or {}
    identity = manifest.get("row_identity")
    if isinstance(identity, str):
        side.manifest_key = [identity]
    elif isinstance(identity, list) and identity and all(isinstance(c, str) for c in identity):
        side.manifest_key = identity
    run = manifest.get("identity")
    options = run.get("options") if isinstance(run, dict) else None
    side.shuffled = isinstance(options, dict) and bool(options.get("shuffle"))
    return side


def manifest_row_identity(manifest: dict | None) -> list[str]:
    """The column(s) a run manifest names as its row identity (none: an empty list)."""
    return apply_manifest(Side("", "", "", 0, []), manifest).manifest_key or []


def load_side(label: str, spec: str, wanted: list[str], args) -> Side:
    """Read only the wanted columns that exist (never the images)."""
    if is_local(spec):
        return _load_local(label, Path(spec).expanduser(), wanted, args)
    if not REPO_ID.match(spec):
        raise UsageError(f"{label} {spec!r} is neither an existing path nor a Hub dataset id "
                         f"(namespace/name); for a local folder write ./{spec}")
    return _load_hub(label, spec, wanted, args)


def _table_to_side(label, spec, description, table, wanted) -> Side:
    available = list(table.column_names)
    keep = [c for c in dict.fromkeys(wanted) if c in available]
    side = Side(label, spec, description, table.num_rows, available)
    for name in keep:
        side.columns[name] = table.column(name).to_pylist()
    return side


def _load_local(label: str, path: Path, wanted: list[str], args) -> Side:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.exists():
        raise UsageError(f"{label} {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix != ".parquet":
            raise UsageError(f"{label} {str(path)!r} is not a .parquet file or a folder")
        files = [path]
    elif (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        import datasets
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if args.split not in loaded:
                raise UsageError(f"split {args.split!r} not in {path}; it has {sorted(loaded)}")
            loaded = loaded[args.split]
        table = loaded.data.table
        if loaded._indices is not None:  # a selected/shuffled view: materialise its rows
            table = loaded.flatten_indices().data.table
        return _table_to_side(label, str(path), str(path.resolve()), table, wanted)
    else:
        files = local_parquet_files(path)
        if not files:
            raise UsageError(f"{label} {str(path)!r} holds no .parquet files and no saved dataset")
    # Read the parquet files directly with pyarrow rather than datasets.load_dataset(folder):
    # datasets caches a local folder load by the folder's name, so a rerun into the same
    # folder (or two outputs both called ./out) could be answered from a stale cache. pyarrow
    # reads the files as they are now, and only the columns compared (never the images).
    manifest = read_manifest(path) if path.is_dir() else None
    schema_names = list(dict.fromkeys(n for f in files for n in pq.read_schema(f).names))
    keep = [c for c in dict.fromkeys(wanted + manifest_row_identity(manifest))
            if c in schema_names]
    tables = []
    for f in files:
        # ParquetFile.read, not pq.read_table: the latter goes through pyarrow.dataset, whose
        # import alone costs about 2 s here
        handle = pq.ParquetFile(f)
        tables.append(handle.read(columns=[c for c in keep if c in handle.schema_arrow.names]))
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    side = _table_to_side(label, str(path), str(path.resolve()), table, keep)
    side.available = schema_names
    return apply_manifest(side, manifest)


def _load_hub(label: str, repo: str, wanted: list[str], args) -> Side:
    import datasets

    token = args.hf_token or os.environ.get("HF_TOKEN") or None
    manifest = _hub_manifest(repo, args, token)
    wanted = wanted + manifest_row_identity(manifest)
    try:
        builder = datasets.load_dataset_builder(repo, args.config, revision=args.revision, token=token)
        features = builder.info.features
        names = list(features) if features else None
        kwargs = {}
        if names is not None:
            if wanted[0] not in names:
                raise UsageError(f"column {wanted[0]!r} not in {label} ({repo}); it has: "
                                 f"{', '.join(names)}")
            kwargs["columns"] = [c for c in dict.fromkeys(wanted) if c in names]
        try:
            ds = datasets.load_dataset(repo, args.config, split=args.split, revision=args.revision,
                                       token=token, **kwargs)
        except (TypeError, ValueError):
            if not kwargs:
                raise
            # a builder without column selection (not parquet-backed): load every column
            ds = datasets.load_dataset(repo, args.config, split=args.split, revision=args.revision,
                                       token=token)
    except UsageError:
        raise
    except Exception as exc:  # not found, private, offline, bad split: one clear line
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot load {label} {repo!r} from the Hub: {type(exc).__name__}: {message}")
    keep = [c for c in dict.fromkeys(wanted) if c in ds.column_names]
    table = ds.select_columns(keep).flatten_indices().data.table if keep else ds.data.table
    side = _table_to_side(label, repo, f"{repo} (split {args.split})", table, keep)
    side.available = names if names is not None else list(ds.column_names)
    side.num_rows = ds.num_rows
    return apply_manifest(side, manifest)


def _hub_manifest(repo: str, args, token) -> dict | None:
    """The run manifest of a collection output on the Hub; None for any other dataset."""
    try:
        from huggingface_hub import hf_hub_download

        return read_manifest(Path(hf_hub_download(
            repo, str(MANIFEST), repo_type="dataset", revision=args.revision, token=token)
            ).parent.parent)
    except Exception:  # no manifest (a reference dataset), offline: matched without it
        return None


# ---- matching rows -----------------------------------------------------------------------------

@dataclass
class Match:
    pairs: list[tuple[int, int]]  # (row in left, row in right)
    how: str
    left_only: int
    right_only: int
    key_columns: list[str] | None


def _key_values(side: Side, columns: list[str]) -> list[tuple]:
    return list(zip(*(side.column(c) for c in columns)))


def identity_key(left: Side, right: Side) -> list[str] | None:
    """The column(s) a run manifest names as the page each row was made from, if both sides
    have them (a reference dataset without a manifest may carry them too)."""
    return next((list(key) for key in (left.manifest_key, right.manifest_key)
                 if key and all(c in left.columns and c in right.columns for c in key)), None)


def default_key(left: Side, right: Side) -> tuple[list[str] | None, str]:
    if key := identity_key(left, right):
        return key, f"the run manifest's row identity ({', '.join(key)}: the page each row " \
            f"was made from)"
    if left.has("file_name") and right.has("file_name"):
        if left.has("page_number") and right.has("page_number"):
            return ["file_name", "page_number"], "file_name and page_number"
        return ["file_name"], "file_name"
    return None, "row order"


def by_row_order(left: Side, right: Side) -> Match:
    """Rows paired by position: only when both read their input in one order and agree in
    length; else refused, naming the way out."""
    shuffled = [side.label for side in (left, right) if side.shuffled]
    if shuffled or left.num_rows != right.num_rows:
        why = f"{' and '.join(shuffled)} read {'their' if len(shuffled) > 1 else 'its'} input " \
            f"shuffled (--shuffle in the run manifest)" if shuffled else \
            f"{left.label} has {left.num_rows} rows and {right.label} {right.num_rows}"
        raise UsageError(
            f"{left.label} and {right.label} cannot be matched by row order: {why}, and no column "
            f"in both names each row's page (file_name, or a run's {ROW_IDENTITY}, written since "
            f"its manifest format 2): pass --key COLUMN naming a column both have")
    return Match([(i, i) for i in range(left.num_rows)], "row order", 0, 0, None)


def match_rows(left: Side, right: Side, key: list[str] | None) -> Match:
    """Pair the rows of two sides by key columns, or by row order. A run's row identity pairs
    rows as multisets: byte-identical pages share it and are interchangeable."""
    how = f"key {', '.join(key)}" if key else None
    if not key:
        key, how = default_key(left, right)
    if key is None:
        return by_row_order(left, right)
    interchangeable = key == identity_key(left, right)
    for side in (left, right):
        missing = [c for c in key if not side.has(c)]
        if missing:
            raise UsageError(f"key column(s) {', '.join(missing)} not in {side.label} "
                             f"({side.spec}); it has: {', '.join(side.available)}")
    left_keys, right_keys = _key_values(left, key), _key_values(right, key)
    index: dict[tuple, list[int]] = {}
    for i, value in enumerate(right_keys):
        if value in index and not interchangeable:
            raise UsageError(f"key {', '.join(key)} is not unique in {right.label}: "
                             f"{_show_key(value)} appears twice; pass --key with more columns")
        index.setdefault(value, []).append(i)
    for rows in index.values():
        rows.reverse()  # pop() gives the first
    pairs, seen = [], set()
    for i, value in enumerate(left_keys):
        if value in seen and not interchangeable:
            raise UsageError(f"key {', '.join(key)} is not unique in {left.label}: "
                             f"{_show_key(value)} appears twice; pass --key with more columns")
        seen.add(value)
        rows = index.get(value)
        if rows:  # the first of its equals not paired yet
            pairs.append((i, rows.pop()))
    if not pairs:
        raise UsageError(f"no row of {left.label} matches a row of {right.label} by "
                         f"{', '.join(key)} (e.g. {_show_key(left_keys[0]) if left_keys else '-'} "
                         f"against {_show_key(right_keys[0]) if right_keys else '-'})")
    return Match(pairs, how, left.num_rows - len(pairs), right.num_rows - len(pairs), key)


def _show_key(value: tuple) -> str:
    return " / ".join(str(v) for v in value)


# ---- one system's texts ------------------------------------------------------------------------

@dataclass
class Texts:
    """A side's text column and finish reasons; a null text is an error row (whether or not
    `<column>_error` says why), unless `<column>_skipped` says the page was not sent: a blank
    page (an empty text) or a PDF page whose text layer was enough (--skip-text-pages, a null
    text). Neither is scored: a blank page's empty text is no empty answer."""
    text: list
    finish: list
    error: list
    skip: list

    def failed(self, i: int) -> bool:
        return self.text[i] is None and self.skip[i] is None

    def skipped(self, i: int) -> bool:
        return self.skip[i] is not None

    def scored(self, i: int) -> bool:
        return self.text[i] is not None and self.skip[i] is None


def read_texts(side: Side, column: str) -> Texts:
    if not side.has(column):
        strings = [name for name in side.available if not name.endswith(
            ("_error", "_error_kind", "_finish_reason", "_prompt_tokens", "_completion_tokens"))]
        raise UsageError(f"column {column!r} not in {side.label} ({side.spec}); it has: "
                         f"{', '.join(strings)}. Pass --column{'-b' if side.label == 'B' else ''} NAME")
    finish = side.columns.get(f"{column}_finish_reason") or [None] * side.num_rows
    errors = side.columns.get(f"{column}_error") or [None] * side.num_rows
    skip = side.columns.get(f"{column}_skipped") or [None] * side.num_rows
    return Texts(text_values(side, column, f"--column{'-b' if side.label == 'B' else ''}"),
                 finish, errors, skip)


def text_values(side: Side, column: str, flag: str) -> list:
    """The column's values, when they are text (or null)."""
    values = side.column(column)
    other = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if other is not None:
        raise UsageError(f"column {column!r} of {side.label} ({side.spec}) is not text: it holds "
                         f"{type(other).__name__} values (e.g. {str(other)[:40]}). Pass {flag} "
                         f"NAME with the text column")
    return values


def side_columns(column: str) -> list[str]:
    return [column, f"{column}_error", f"{column}_finish_reason", f"{column}_skipped"]


# ---- scoring, one row at a time, in worker processes -------------------------------------------

def score_pair(x: str, y: str, finish_x, finish_y, norm_name: str) -> tuple:
    """Parity of two texts: (identical, identical after normalisation, similarity,
    x looping, y looping)."""
    loop_x = is_looping(x, finish_x)
    loop_y = loop_x if x == y and finish_x == finish_y else is_looping(y, finish_y)
    if x == y:
        return True, True, 1.0, loop_x, loop_y
    apply = NORMALISATIONS[norm_name].apply
    nx, ny = apply(x), apply(y)
    return False, nx == ny, similarity(edit_distance(nx, ny), len(nx), len(ny)), loop_x, loop_y


def score_page(hyp, finish, ref, norm_name: str, min_chars: int) -> tuple:
    """Accuracy of one page: (status, reference chars, reference words, char edits, word edits,
    looping); status is ok, looping, error, short reference or no reference."""
    if not isinstance(ref, str):
        return "no reference", None, None, None, None, False
    words = NORMALISATIONS[norm_name].words
    ref_words = words(ref)
    ref_norm = " ".join(ref_words)
    if len(ref_norm) < min_chars:
        return "short reference", len(ref_norm), None, None, None, False
    if hyp is None:
        return "error", len(ref_norm), None, None, None, False
    looping = is_looping(hyp, finish)
    hyp_words = words(hyp)
    return ("looping" if looping else "ok", len(ref_norm), len(ref_words),
            edit_distance(" ".join(hyp_words), ref_norm), edit_distance(hyp_words, ref_words), looping)


_JOB: dict = {}  # the rows being scored; forked workers inherit it instead of receiving a copy
WORKERS_USED = {"processes": 1}  # how many processes scored the last rows (reported in --json)
PARALLEL_MIN_ROWS = 2000


def _score_range(bounds: tuple[int, int]) -> list[tuple]:
    lo, hi = bounds
    function, columns, const = _JOB["function"], _JOB["columns"], _JOB["const"]
    return [function(*(column[k] for column in columns), *const) for k in range(lo, hi)]


def score_rows(function, columns: list[list], const: tuple, workers: int) -> list[tuple]:
    """function(*row, *const) for every row of the columns, in order. With more than one
    worker and enough rows, forked processes share the work: they inherit the texts (nothing
    is pickled but the row ranges and the results). Where fork does not exist (Windows, and
    macOS by policy) it runs in this process."""
    global _JOB
    import multiprocessing

    n = len(columns[0]) if columns else 0
    _JOB = {"function": function, "columns": columns, "const": const}
    _invisible_chars()  # built once here, not once per worker
    try:
        # the workers find _score_range by name in __main__: so only when this file runs as
        # the program (not imported by a test, nor run under a profiler)
        runs_as_main = getattr(sys.modules.get("__main__"), "_score_range", None) is _score_range
        if workers > 1 and n >= PARALLEL_MIN_ROWS and sys.platform.startswith("linux") and runs_as_main:
            from concurrent.futures import ProcessPoolExecutor
            chunk = max(250, n // (workers * 16))
            bounds = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                results = [result for part in pool.map(_score_range, bounds) for result in part]
            WORKERS_USED["processes"] = workers
            return results
        WORKERS_USED["processes"] = 1
        return _score_range((0, n))
    finally:
        _JOB = {}


# ---- parity ------------------------------------------------------------------------------------

def parity(a: Side, b: Side, args, norm: Normalisation) -> dict:
    match = match_rows(a, b, args.key)
    ta, tb = read_texts(a, args.column), read_texts(b, args.column_b or args.column)
    group_of = _group_lookup(args.by, a, b)
    both = [(i, j) for i, j in match.pairs if ta.scored(i) and tb.scored(j)]
    scores = iter(score_rows(score_pair, [[ta.text[i] for i, _ in both], [tb.text[j] for _, j in both],
                                          [ta.finish[i] for i, _ in both], [tb.finish[j] for _, j in both]],
                             (norm.name,), args.workers))
    rows, compared = [], []
    counts = {"both_failed": 0, "a_failed": 0, "b_failed": 0, "skipped": 0}
    skipped = {"a": 0, "b": 0}  # of the pairs left out because a page was not sent
    for i, j in match.pairs:
        fa, fb = ta.failed(i), tb.failed(j)
        sa, sb = ta.skipped(i), tb.skipped(j)
        row = {"key": _row_key(match, a, i), "a_row": i, "b_row": j, "a_failed": fa, "b_failed": fb,
               "a_skipped": sa, "b_skipped": sb, "group": group_of(i, j)}
        if fa or fb or sa or sb:
            if fa or fb:
                counts["both_failed" if fa and fb else "a_failed" if fa else "b_failed"] += 1
            else:
                counts["skipped"] += 1
                skipped["a"] += sa
                skipped["b"] += sb
            row.update(identical=None, identical_normalised=None, similarity=None,
                       a_looping=None, b_looping=None)
        else:
            (row["identical"], row["identical_normalised"], row["similarity"],
             row["a_looping"], row["b_looping"]) = next(scores)
            compared.append(row)
        rows.append(row)
    excluded = {"a_failed": counts["a_failed"], "b_failed": counts["b_failed"],
                "both_failed": counts["both_failed"], "skipped": counts["skipped"],
                "only_in_a": match.left_only, "only_in_b": match.right_only}
    result = {
        "mode": "parity", "a": a.description, "b": b.description,
        "column": args.column, "column_b": args.column_b or args.column,
        "matched_by": match.how, "normalisation": norm.label,
        "normalisation_summary": norm.summary, "characters": CHARACTERS_NOTE,
        "rows_matched": len(match.pairs), "rows_compared": len(compared),
        "rows_excluded": sum(excluded.values()), "excluded": excluded,
        "skipped_a": skipped["a"], "skipped_b": skipped["b"],
        **parity_figures(compared),
    }
    if args.by:
        result["by"] = {"column": args.by, "groups": {
            str(g): parity_figures([r for r in compared if r["group"] == g])
            for g in sorted({r["group"] for r in rows}, key=str)}}
    worst = sorted((r for r in compared if not r["identical"]), key=lambda r: r["similarity"])
    return {"result": result, "rows": rows, "worst": worst, "texts": (ta, tb)}


def parity_figures(compared: list[dict]) -> dict:
    rest = [r["similarity"] for r in compared if not r["identical"]]
    identical = sum(r["identical"] for r in compared)
    return {
        "identical": identical,
        "identical_share": identical / len(compared) if compared else None,
        "identical_normalised": sum(r["identical_normalised"] for r in compared),
        "different": len(rest),
        "similarity_min": min(rest) if rest else None,
        "similarity_p5": quantile(rest, 0.05),
        "similarity_median": quantile(rest, 0.5),
        "similarity_median_all": quantile([r["similarity"] for r in compared], 0.5),
        "looping_a": sum(bool(r["a_looping"]) for r in compared),
        "looping_b": sum(bool(r["b_looping"]) for r in compared),
    }


# ---- accuracy ----------------------------------------------------------------------------------

def accuracy(system: Side, column: str, ref_side: Side, ref_column: str, match: Match,
             args, norm: Normalisation, group_of) -> dict:
    """CER and WER of one system's pages against the reference, per page and pooled."""
    texts = read_texts(system, column)
    if not ref_side.has(ref_column):
        raise UsageError(f"reference column {ref_column!r} not in {ref_side.label} "
                         f"({ref_side.spec}); it has: {', '.join(ref_side.available)}")
    refs = text_values(ref_side, ref_column, "--reference-column")
    scores = score_rows(score_page, [[None if texts.skipped(i) else texts.text[i]
                                      for i, _ in match.pairs],
                                     [texts.finish[i] for i, _ in match.pairs],
                                     [refs[j] for _, j in match.pairs]],
                        (norm.name, max(1, args.min_reference_chars)), args.workers)
    rows = []
    for (i, j), (status, chars, words, char_edits, word_edits, looping) in zip(match.pairs, scores):
        if status == "error" and texts.skipped(i):
            status = "skipped"
        row = {"key": _row_key(match, system, i), "row": i, "ref_row": j, "group": group_of(i, j),
               "status": status, "ref_chars": chars}
        if status in ("ok", "looping"):
            row.update(ref_words=words, char_edits=char_edits, word_edits=word_edits,
                       cer=char_edits / chars, wer=word_edits / words if words else None,
                       looping=looping)
        rows.append(row)
    count = {status: sum(r["status"] == status for r in rows)
             for status in ("error", "skipped", "short reference", "no reference")}
    scored = [r for r in rows if r["status"] in ("ok", "looping")]
    eligible = len(scored) + count["error"]
    result = {
        "rows_matched": len(match.pairs), "rows_compared": len(scored),
        "rows_excluded": len(rows) - len(scored) + match.left_only, "excluded": {
            "error": count["error"], "skipped": count["skipped"],
            "short_reference": count["short reference"],
            "no_reference": count["no reference"], "unmatched": match.left_only},
        "error_rows": count["error"],
        "error_rate": count["error"] / eligible if eligible else None,
        **accuracy_figures(scored),
    }
    if args.by:
        result["by"] = {"column": args.by, "groups": {
            str(g): {"rows_compared": len([r for r in scored if r["group"] == g]),
                     "error_rows": len([r for r in rows if r["group"] == g and r["status"] == "error"]),
                     **accuracy_figures([r for r in scored if r["group"] == g])}
            for g in sorted({r["group"] for r in rows}, key=str)}}
    return {"result": result, "rows": rows, "texts": texts, "refs": refs}


def accuracy_figures(scored: list[dict]) -> dict:
    """Headline rates (looping pages capped at 1 per page) and the rates without them."""
    def rates(rows: list[dict], unit: str, capped: bool) -> dict:
        edits_key, len_key = ("char_edits", "ref_chars") if unit == "cer" else ("word_edits", "ref_words")
        rows = [r for r in rows if r.get(len_key)]
        edits = [min(r[edits_key], r[len_key]) if capped and r["looping"] else r[edits_key] for r in rows]
        lengths = [r[len_key] for r in rows]
        per_page = [e / n for e, n in zip(edits, lengths)]
        return {"micro": sum(edits) / sum(lengths) if lengths else None,
                "median": quantile(per_page, 0.5), "mean": mean(per_page)}

    out = {}
    clean = [r for r in scored if not r["looping"]]
    for unit in ("cer", "wer"):
        headline, without = rates(scored, unit, True), rates(clean, unit, False)
        for stat in ("micro", "median", "mean"):
            out[f"{unit}_{stat}"] = headline[stat]
        for stat in ("micro", "median", "mean"):
            out[f"{unit}_{stat}_without_looping"] = without[stat]
    looping = len(scored) - len(clean)
    out["looping_pages"] = looping
    out["looping_rate"] = looping / len(scored) if scored else None
    return out


# ---- shared bits -------------------------------------------------------------------------------

def _row_key(match: Match, side: Side, i: int) -> str:
    if match.key_columns:
        return _show_key(tuple(side.column(c)[i] for c in match.key_columns))
    return f"row {i}"


def _group_lookup(by: str | None, *sides: Side):
    """Group value of a matched pair: the --by column of the first side that has it."""
    if not by:
        return lambda i, j: None
    for position, side in enumerate(sides):
        if side.has(by):
            values = side.column(by)
            return (lambda i, j: values[i]) if position == 0 else (lambda i, j: values[j])
    raise UsageError(f"--by column {by!r} is in none of: "
                     + "; ".join(f"{s.label} ({', '.join(s.available)})" for s in sides))


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def pct(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def visible(text: str) -> str:
    return text.replace("\r", "\\r").replace("\t", "\\t").replace("\n", "\u21b5")


def side_by_side(a: str, b: str, width: int, lines: int = 4) -> list[str]:
    """The region around the first difference of a and b, in two columns."""
    start = 0
    limit = min(len(a), len(b))
    while start < limit and a[start] == b[start]:
        start += 1
    start = max(0, start - 20)
    column = max(20, (width - 5) // 2)
    chunk = column * lines
    left, right = visible(a[start:start + chunk]), visible(b[start:start + chunk])
    prefix = "…" if start else ""
    left, right = prefix + left, prefix + right
    out = []
    for k in range(lines):
        l_part, r_part = left[k * column:(k + 1) * column], right[k * column:(k + 1) * column]
        if not l_part and not r_part:
            break
        out.append(f"  {l_part:<{column}} | {r_part}")
    return out


# ---- reporting ---------------------------------------------------------------------------------

def print_parity(report: dict, args, out) -> None:
    r = report["result"]
    width = min(max(shutil_width(), 80), 160)
    w = lambda line="": print(line, file=out)  # noqa: E731
    w(f"parity: A = {r['a']} [{r['column']}]")
    w(f"        B = {r['b']} [{r['column_b']}]")
    w(f"rows matched by {r['matched_by']}: {r['rows_matched']}; compared (text on both sides): "
      f"{r['rows_compared']}; excluded: {r['rows_excluded']}")
    w(f"normalisation for similarity: {r['normalisation']} ({r['normalisation_summary']})")
    w(f"similarity = 1 - Levenshtein distance / longer length; {CHARACTERS_NOTE}")
    w()
    n = r["rows_compared"]
    table = [
        ("byte-identical (raw text)", f"{r['identical']} / {n}  ({pct(r['identical'], n)})"),
        (f"identical after {r['normalisation']}", f"{r['identical_normalised']} / {n}"),
        (f"similarity of the {r['different']} others: min", fmt(r["similarity_min"])),
        ("                                    p5", fmt(r["similarity_p5"])),
        ("                                median", fmt(r["similarity_median"])),
        ("one side failed: A only / B only", f"{r['excluded']['a_failed']} / {r['excluded']['b_failed']}"),
        ("both failed", str(r["excluded"]["both_failed"])),
        ("not sent, text layer enough: A / B", f"{r['skipped_a']} / {r['skipped_b']}"),
        ("looping or degenerate: A / B", f"{r['looping_a']} / {r['looping_b']}"),
        ("unmatched rows: only in A / only in B", f"{r['excluded']['only_in_a']} / {r['excluded']['only_in_b']}"),
    ]
    label_width = max(len(k) for k, _ in table)
    for k, v in table:
        w(f"  {k:<{label_width}}  {v}")
    if "by" in r:
        w()
        w(f"by {r['by']['column']}:")
        w(f"  {'group':<24} {'identical':>12} {'sim min':>8} {'sim med':>8}")
        for g, f in r["by"]["groups"].items():
            total = f["identical"] + f["different"]
            w(f"  {clip(g, 24):<24} {f['identical']:>5} / {total:<4} {fmt(f['similarity_min']):>8} "
              f"{fmt(f['similarity_median']):>8}")
    ta, tb = report["texts"]
    worst = report["worst"][: args.show]
    failed = [row for row in report["rows"] if row["a_failed"] != row["b_failed"]][: args.show]
    if worst:
        w()
        w(f"worst pairs ({r['normalisation']} similarity), from the first difference; A | B:")
        for row in worst:
            a_text, b_text = ta.text[row["a_row"]], tb.text[row["b_row"]]
            loops = [side for side, flag in (("A", row["a_looping"]), ("B", row["b_looping"])) if flag]
            loop = f"; looping: {' and '.join(loops)}" if loops else ""
            w(f" {row['key']}: similarity {row['similarity']:.4f}, {len(a_text)} vs {len(b_text)} chars{loop}")
            for line in side_by_side(a_text, b_text, width):
                w(line)
    if failed:
        w()
        w("rows where one side failed:")
        for row in failed:
            texts, index = (ta, row["a_row"]) if row["a_failed"] else (tb, row["b_row"])
            why = texts.error[index]
            w(f"  {row['key']}: {'A' if row['a_failed'] else 'B'} has no text"
              + (f" ({clip(visible(why), 100)})" if why else ""))
    looping = [row for row in report["rows"] if row["a_looping"] or row["b_looping"]][: args.show]
    if looping:
        w()
        w("rows that loop (finish reason length with a repeated tail, or degenerate output):")
        for row in looping:
            sides = " and ".join(s for s, f in (("A", row["a_looping"]), ("B", row["b_looping"])) if f)
            w(f"  {row['key']}: {sides}{' (identical)' if row['identical'] else ''}")


def print_accuracy(report: dict, args, out) -> None:
    systems = report["systems"]
    norm = report["normalisation"]
    w = lambda line="": print(line, file=out)  # noqa: E731
    w(f"reference: {report['reference']} [{report['reference_column']}]")
    for label, system in systems.items():
        w(f"accuracy of {label} = {system['source']} [{system['column']}], rows matched to the "
          f"reference by {system['matched_by']}")
    w(f"normalisation: {norm} ({report['normalisation_summary']})")
    w(f"{CHARACTERS_NOTE}; pages count when the normalised reference has >= "
      f"{report['min_reference_chars']} characters")
    w()
    labels = list(systems)
    header = f"  {'':<34}" + "".join(f"{label + ' CER':>10}{label + ' WER':>10}" for label in labels)
    w(header)

    def line(title: str, key: str) -> None:
        cells = "".join(f"{fmt(systems[l]['figures'][f'cer_{key}']):>10}"
                        f"{fmt(systems[l]['figures'][f'wer_{key}']):>10}" for l in labels)
        w(f"  {title:<34}{cells}")

    line("pooled (micro): the headline", "micro")
    line("per-page median", "median")
    line("per-page mean (source doc's figure)", "mean")
    line("without looping pages: pooled", "micro_without_looping")
    line("                       median", "median_without_looping")
    line("                       mean", "mean_without_looping")
    w()
    for label in labels:
        f = systems[label]["figures"]
        ex = f["excluded"]
        w(f"  {label}: {f['rows_compared']} pages scored; looping {f['looping_pages']} "
          f"({fmt(f['looping_rate'], 3)}), capped at 1 in the headline; error rows "
          f"{f['error_rows']} (rate {fmt(f['error_rate'], 3)}), left out; not sent (text layer "
          f"enough) {ex['skipped']}; reference under "
          f"{report['min_reference_chars']} chars {ex['short_reference']}, no reference "
          f"{ex['no_reference']}, unmatched {ex['unmatched']}")
    if args.by:
        w()
        w(f"by {args.by} (pooled / median / mean CER, pages):")
        for label in labels:
            for g, f in systems[label]["figures"]["by"]["groups"].items():
                w(f"  {label} {clip(g, 28):<28} {fmt(f['cer_micro']):>8} {fmt(f['cer_median']):>8} "
                  f"{fmt(f['cer_mean']):>8}  {f['rows_compared']:>6} pages, {f['error_rows']} errors")
    width = min(max(shutil_width(), 80), 160)
    for label in labels:
        detail = report["details"][label]
        scored = [r for r in detail["rows"] if r["status"] in ("ok", "looping")]
        worst = sorted(scored, key=lambda r: -r["cer"])[: args.show]
        if worst:
            w()
            w(f"{label}: worst pages by CER ({norm}), from the first difference; output | reference:")
            for row in worst:
                hyp = norm_apply(report, detail["texts"].text[row["row"]])
                ref = norm_apply(report, detail["refs"][row["ref_row"]])
                loop = ""
                if row["looping"]:
                    loop = " (looping: counts as 1 in the headline)" if row["cer"] > 1 else " (looping)"
                w(f" {row['key']}: CER {row['cer']:.4f}, WER {fmt(row['wer'])}{loop}")
                for text_line in side_by_side(hyp, ref, width, lines=2):
                    w(text_line)


def norm_apply(report: dict, text) -> str:
    return NORMALISATIONS[report["normalisation_name"]].apply(text or "")


def shutil_width() -> int:
    import shutil
    return shutil.get_terminal_size((120, 24)).columns


def check_writable(option: str, value: str | None) -> None:
    """A file the run will write, checked up front: not a folder, and in a folder that exists
    or can be made (made when the file is written)."""
    if not value:
        return
    path = Path(value).expanduser()
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.is_dir():
        raise UsageError(f"{option} {value} is a folder: name a file")
    if not folder.is_dir():
        raise UsageError(f"{option} {value}: {folder} is not a folder")
    try:
        if folder != path.parent:
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(f"cannot create folders in {folder}")
        elif path.exists():
            open(path, "a").close()
        else:
            open(path, "x").close()
            path.unlink()
    except OSError as exc:
        raise UsageError(f"{option} {value} cannot be written ({exc.strerror or exc})") from None


def output_file(option: str, value: str) -> Path:
    """The path to write --json, --plot or --rows to, its folder made."""
    path = Path(value).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {option} {value} ({exc.strerror or exc})") from None
    return path


def write_plot(path: str, title: str, series: dict[str, list[float]], xlabel: str) -> None:
    """A histogram per series (CER or similarity per page), medians marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    values = [v for vs in series.values() for v in vs]
    top = max(values) if values else 1.0
    low = min(values) if values else 0.0
    bins = 50 if values else 10
    span = (min(low, 0.0), max(top, 1e-9)) if "CER" in xlabel else (min(low, 0.999), 1.0)
    for label, vs in series.items():
        if not vs:
            continue
        median = quantile(vs, 0.5)
        ax.hist(vs, bins=bins, range=span, alpha=0.6, label=f"{label} (n={len(vs)}, median {median:.4f})")
        ax.axvline(median, linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("pages")
    ax.set_title(title, fontsize=10)
    if values:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no pages to plot", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    try:
        fig.savefig(output_file("--plot", path))
    except (OSError, ValueError) as exc:  # ValueError: a file type matplotlib does not write
        raise UsageError(f"cannot write --plot {path}: {exc}") from None
    finally:
        plt.close(fig)


def write_rows(path: str, rows: list[dict]) -> None:
    """Per-row figures: CSV when PATH ends in .csv, else JSON lines."""
    try:
        if path.endswith(".csv"):
            names = list(dict.fromkeys(k for r in rows for k in r))
            with open(output_file("--rows", path), "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=names)
                writer.writeheader()
                writer.writerows(rows)
        else:
            with open(output_file("--rows", path), "w") as handle:
                for r in rows:
                    handle.write(json.dumps(r, default=str) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write --rows {path}: {exc}") from None


# ---- the HTML report: each page beside its text, for a browser ---------------------------------
# One self-contained file that opens offline: the page images are embedded (a thumbnail, and a
# larger view that opens on a click, with no script: <details>), the Markdown is rendered by
# markdown-it and passed through nh3's allow-list (a model's answer is untrusted text), and a
# Content-Security-Policy forbids every script and every load from the network besides.

REPORT_THUMB_PX = 512
REPORT_ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "pre",
    "code", "em", "strong", "b", "i", "u", "s", "del", "ins", "sub", "sup", "small", "span", "div",
    "table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "colgroup", "col", "a"}
REPORT_ALLOWED_ATTRIBUTES = {"td": {"colspan", "rowspan", "align"}, "th": {"colspan", "rowspan", "align"},
                             "span": {"class"}, "div": {"class"}, "ol": {"start"}}
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
REPORT_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1800px;padding:1em;color:#222}
header{border-bottom:1px solid #ccc;margin-bottom:1em} header p{margin:.2em 0}
article{display:grid;grid-template-columns:minmax(180px,512px) 1fr;gap:1em;border-bottom:1px solid #ddd;padding:1em 0}
article h2{grid-column:1/-1;font-size:1.05em;margin:0} .figure{color:#555;font-weight:normal}
.page summary{list-style:none} .page summary::-webkit-details-marker{display:none}
.page img.thumb{max-width:100%;border:1px solid #bbb;cursor:zoom-in} .page img.full{display:none}
.page details[open] img.full{display:block;position:fixed;inset:0;margin:auto;max-width:98vw;max-height:98vh;
z-index:10;cursor:zoom-out;box-shadow:0 0 0 100vmax rgba(0,0,0,.65)} .nopage{color:#777;font-style:italic}
.texts{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:1em;min-width:0}
.text{min-width:0;overflow:auto} .text h3{font-size:.95em;margin:.2em 0;color:#444}
.rendered{border-left:3px solid #9bd;padding-left:.7em} .rendered table{border-collapse:collapse}
.rendered td,.rendered th{border:1px solid #999;padding:2px 6px} .math{font-family:monospace;color:#036}
pre.source{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.5em;font-size:12px}
.flag{display:inline-block;background:#fde2e2;color:#900;padding:0 .4em;border-radius:3px;margin:.1em .2em .1em 0}
.flag.skip{background:#e6eefc;color:#124} del{background:#fcc;text-decoration:line-through} ins{background:#cfc;text-decoration:none}
"""


@dataclass
class ReportText:
    """One system's text of one page, and what the row says about it."""
    label: str
    text: str | None
    error: str | None = None
    skip: str | None = None
    finish: str | None = None
    looping: bool = False


@dataclass
class ReportPage:
    key: str
    figure: str  # the page's similarity or CER, or "" in a look at one run
    image_row: int | None  # A's row whose page is shown
    texts: list[ReportText]
    diff: tuple[str, str, str] | None = None  # (title, text a, text b) marked word by word


def render_markdown(text: str) -> str:
    """Markdown to HTML that keeps only REPORT_ALLOWED_TAGS: tables render, formulas stay as
    written (dollarmath wraps them, unrendered), no script, no image, no link target survives."""
    import nh3
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    md = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
    md.use(dollarmath_plugin, allow_labels=False, double_inline=True,
           renderer=lambda content, options: html.escape(content))
    return nh3.clean(md.render(text), tags=REPORT_ALLOWED_TAGS, attributes=REPORT_ALLOWED_ATTRIBUTES,
                     url_schemes=set(), link_rel="noopener noreferrer")


DIFF_WORDS = 20_000  # words a side the marked diff compares: its table is (a x b) bits


def marked_diff(a: str, b: str) -> str:
    """b against a, word by word: words only in a struck through, words only in b marked.
    Past DIFF_WORDS words a side only the start is compared; the rest of b follows unmarked."""
    from rapidfuzz.distance import Indel

    words_a, words_b = re.findall(r"\S+|\s+", a), re.findall(r"\S+|\s+", b)
    rest_of_b = words_b[2 * DIFF_WORDS:]
    cut = len(words_a) > 2 * DIFF_WORDS or bool(rest_of_b)
    words_a, words_b = words_a[:2 * DIFF_WORDS], words_b[:2 * DIFF_WORDS]  # words and spaces
    parts = []
    for tag, a0, a1, b0, b1 in Indel.opcodes(words_a, words_b):
        old, new = html.escape("".join(words_a[a0:a1])), html.escape("".join(words_b[b0:b1]))
        if tag == "equal":
            parts.append(old)
        else:
            parts.append((f"<del>{old}</del>" if old else "") + (f"<ins>{new}</ins>" if new else ""))
    if cut:
        parts.append(html.escape(f"\n[differences marked in only the first {DIFF_WORDS:,} words; "
                                 f"the rest of B follows unmarked]\n") + html.escape("".join(rest_of_b)))
    return "".join(parts)


def page_label(side: Side, i: int) -> str:
    """A page as a reader knows it: its file (and page number), else its row."""
    if not side.has("file_name"):
        return f"row {i}"
    return _show_key(tuple(side.column(c)[i] for c in DEFAULT_KEY if side.has(c)))


def report_pages_look(a: Side, texts: "Texts", args) -> list[ReportPage]:
    """A look at one run: its pages in input order."""
    return [ReportPage(page_label(a, i), "", i, [report_text("A", texts, i)])
            for i in range(min(a.num_rows, args.show))]


def report_text(label: str, texts: "Texts", i: int) -> ReportText:
    return ReportText(label, texts.text[i], texts.error[i], texts.skip[i], texts.finish[i],
                      texts.text[i] is not None and is_looping(texts.text[i], texts.finish[i]))


def report_pages_parity(report: dict, a: Side, args) -> list[ReportPage]:
    """Worst first: a page one side failed, then by similarity; identical pages last."""
    ta, tb = report["texts"]
    rows = sorted(report["rows"], key=lambda r: (
        not (r["a_failed"] or r["b_failed"]), bool(r["identical"]),
        r["similarity"] if r["similarity"] is not None else 1.0))
    pages = []
    for row in rows[: args.show]:
        i, j = row["a_row"], row["b_row"]
        figure = f"similarity {row['similarity']:.4f}" if row["similarity"] is not None else \
            "one side has no text" if row["a_failed"] or row["b_failed"] else "not sent"
        if row["identical"]:
            figure = "byte-identical"
        diff = None
        if ta.text[i] is not None and tb.text[j] is not None and not row["identical"]:
            diff = ("B against A", ta.text[i], tb.text[j])
        pages.append(ReportPage(page_label(a, i), figure, i, [report_text("A", ta, i),
                                                         report_text("B", tb, j)], diff))
    return pages


def report_pages_accuracy(shown: dict, a: Side, args) -> list[ReportPage]:
    """Worst first by A's CER (an error row first of all); B and the reference beside it."""
    detail = shown["details"]["A"]
    refs, texts = detail["refs"], detail["texts"]
    other = shown["details"].get("B")
    b_by_ref = {r["ref_row"]: r for r in other["rows"]} if other else {}
    rows = sorted(detail["rows"], key=lambda r: (r["status"] != "error", -(r.get("cer") or 0.0)))
    pages = []
    for row in rows[: args.show]:
        i, j = row["row"], row["ref_row"]
        figure = f"CER {row['cer']:.4f}" if "cer" in row else row["status"]
        shown_texts = [report_text("A", texts, i)]
        diff = ("A against the reference", refs[j] or "", texts.text[i]) if texts.text[i] is not None else None
        if other and j in b_by_ref:
            b_row = b_by_ref[j]
            shown_texts.append(report_text("B", other["texts"], b_row["row"]))
            if "cer" in b_row:
                figure += f"; B: CER {b_row['cer']:.4f}"
        shown_texts.append(ReportText("reference", refs[j]))
        pages.append(ReportPage(page_label(a, i), figure, i, shown_texts, diff))
    return pages


def page_images(side: Side, rows: list[int], args) -> dict[int, bytes]:
    """The page image of each row (encoded bytes), read for those rows only: from the image
    column of A, or for PDF pages (whose bytes an output does not copy) rendered from the input."""
    column = args.image_column or manifest_option(Path(side.spec), "image_column") or "image"
    if column in side.available:
        return {row: cell for row, cell in zip(rows, read_cells(side, column, rows)) if cell}
    if side.has("page_number") or manifest_option(Path(side.spec), "pdf_column"):
        return render_pdf_pages(side, rows, args)
    return {}


def read_cells(side: Side, column: str, rows: list[int]) -> list[bytes | None]:
    """One column's cells for some rows, without reading the others' images."""
    if is_local(side.spec) and Path(side.spec).expanduser().is_dir() and \
            local_parquet_files(Path(side.spec).expanduser()):
        import pyarrow.parquet as pq

        wanted, found, start = sorted(set(rows)), {}, 0
        for path in local_parquet_files(Path(side.spec).expanduser()):
            handle = pq.ParquetFile(path)
            for group in range(handle.num_row_groups):
                size = handle.metadata.row_group(group).num_rows
                inside = [r for r in wanted if start <= r < start + size]
                if inside:
                    values = handle.read_row_group(group, columns=[column]).column(0)
                    found.update({r: values[r - start].as_py() for r in inside})
                start += size
        cells = [found.get(r) for r in rows]
    else:
        import datasets

        if is_local(side.spec):
            loaded = datasets.load_from_disk(str(Path(side.spec).expanduser()))
            loaded = loaded[args_split(side)] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            loaded = datasets.load_dataset(side.spec, split=args_split(side))
        loaded = loaded.cast_column(column, datasets.Image(decode=False)) \
            if isinstance(loaded.features.get(column), datasets.Image) else loaded
        cells = loaded.select_columns([column]).select(rows)[column]
    return [image_bytes(cell) for cell in cells]


def args_split(side: Side) -> str:
    match = re.search(r"\(split (.+)\)$", side.description)
    return match.group(1) if match else "train"


def image_bytes(cell) -> bytes | None:
    """An image cell as encoded bytes: datasets' {"bytes", "path"} or plain bytes."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return cell["bytes"]
        path = cell.get("path")
        return Path(path).read_bytes() if path and Path(path).is_file() else None
    return cell if isinstance(cell, (bytes, bytearray)) else None


def render_pdf_pages(side: Side, rows: list[int], args) -> dict[int, bytes]:
    """PDF pages rendered from the run's input: --input, a folder or a .pdf on this machine."""
    source = args.input or manifest_input_path(Path(side.spec))
    if not source or not Path(source).expanduser().exists():
        raise UsageError("A holds PDF pages, whose images an output does not keep: pass --input "
                         "with the run's input (a local folder or .pdf) to show them")
    import pypdfium2 as pdfium

    source, pages = Path(source).expanduser(), {}
    names = side.column("file_name") if side.has("file_name") else None
    numbers = side.column("page_number")
    for row in rows:
        path = source / names[row] if names and source.is_dir() else source
        number = numbers[row]
        if number is None or not path.is_file():
            continue
        try:
            image = render_pdf_page(path, number)
        except (pdfium.PdfiumError, IndexError, OSError) as exc:  # not the run's input
            raise UsageError(f"--input: page {number} of {path} cannot be rendered ({exc}); "
                             f"is this the run's input?") from None
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "PNG")
        pages[row] = buffer.getvalue()
    return pages


REPORT_PAGE_DPI = 150


def render_pdf_page(path: Path, number: int):
    """Page `number` (1-based) of a PDF as a PIL image, at REPORT_PAGE_DPI."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(str(path))
    try:
        return document[number - 1].render(scale=REPORT_PAGE_DPI / 72).to_pil()
    finally:
        document.close()


def manifest_input_path(path: Path) -> str | None:
    """The input a local run read, as its manifest records it (none for a Hub input)."""
    try:
        recorded = json.loads((path / MANIFEST).read_text()).get("input_path")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


def embedded_images(data: bytes, full_px: int) -> tuple[str, str | None]:
    """A page as data URLs: a thumbnail at most REPORT_THUMB_PX on its long side, and (unless
    full_px is 0) a view at most full_px, both JPEG."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")

    def encoded(limit: int, quality: int) -> str:
        copy = image.copy()
        copy.thumbnail((limit, limit))
        buffer = io.BytesIO()
        copy.save(buffer, "JPEG", quality=quality, optimize=True)
        return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()

    return encoded(REPORT_THUMB_PX, 80), encoded(full_px, 72) if full_px else None


def write_html_report(path: str, title: str, lines: list[str], pages: list[ReportPage],
                      image_side: Side, args) -> None:
    images = page_images(image_side, [p.image_row for p in pages if p.image_row is not None], args)
    seen: dict[str, str] = {}  # a page's digest -> the anchor of its first showing
    body = []
    for number, page in enumerate(pages, 1):
        anchor = f"page-{number}"
        data = images.get(page.image_row)
        if data is None:
            picture = '<p class="nopage">no page image in this output</p>'
        else:
            digest = hashlib.sha1(data).hexdigest()
            if digest in seen:
                picture = f'<p class="nopage">the same page as <a href="#{seen[digest]}">above</a></p>'
            else:
                seen[digest] = anchor
                try:
                    thumb, full = embedded_images(data, args.html_page_px)
                except Exception as exc:  # an unreadable image is said, not fatal
                    picture = f'<p class="nopage">page image unreadable: {html.escape(str(exc)[:200])}</p>'
                else:
                    big = f'<img class="full" alt="page {number}, full size" src="{full}">' if full else ""
                    # the full view is part of the summary: a click on it closes it again
                    picture = (f'<details><summary><img class="thumb" alt="page {number}" src="{thumb}">'
                               f'{big}</summary></details>')
        panels = "".join(text_panel(t) for t in page.texts)
        if page.diff:
            panels += (f'<section class="text"><h3>{html.escape(page.diff[0])}</h3>'
                       f'<pre class="source diff">{marked_diff(page.diff[1], page.diff[2])}</pre></section>')
        body.append(f'<article id="{anchor}"><h2>{number}. {html.escape(page.key)} '
                    f'<span class="figure">{html.escape(page.figure)}</span></h2>'
                    f'<div class="page">{picture}</div><div class="texts">{panels}</div></article>')
    head = "".join(f"<p>{html.escape(line)}</p>" for line in lines)
    document = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                f'<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">'
                f'<meta name="viewport" content="width=device-width,initial-scale=1">'
                f'<title>{html.escape(title)}</title><style>{REPORT_STYLE}</style></head><body>'
                f'<header><h1>{html.escape(title)}</h1>{head}</header>{"".join(body)}</body></html>\n')
    try:
        output_file("--html", path).write_text(document, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write --html {path}: {exc}") from None


def text_panel(text: ReportText) -> str:
    flags = []
    if text.error:
        flags.append(f'<span class="flag">error: {html.escape(text.error[:500])}</span>')
    if text.skip:
        flags.append(f'<span class="flag skip">not sent: {html.escape(text.skip)}</span>')
    if text.looping:
        flags.append('<span class="flag">looping</span>')
    if text.finish and text.finish != "stop":
        flags.append(f'<span class="flag">finish: {html.escape(text.finish)}</span>')
    if text.text is None:
        content = "<p class=\"nopage\">no text</p>"
    else:
        content = (f'<div class="rendered">{render_markdown(text.text)}</div><details><summary>source'
                   f'</summary><pre class="source">{html.escape(text.text)}</pre></details>')
    return f'<section class="text"><h3>{html.escape(text.label)}</h3>{"".join(flags)}{content}</section>'


# ---- olmOCR-Bench: the official scorer over a run of the benchmark's PDFs ----------------------
# The benchmark (allenai/olmocr, olmocr/bench): DIR holds test files *.jsonl (one test a line,
# naming its pdf and page), the PDFs under DIR/pdfs, and a folder per candidate with
# {pdf path without .pdf}_pg{page}_repeat{n}.md. The scorer is installed only for this mode, at a
# pinned version; numpy is imported by its tests module but not declared, and playwright is
# pinned so that the browser install command printed matches the browser it will look for.
OLMOCR_BENCH = ("olmocr[bench]==0.4.27", "numpy", "playwright==1.65.2")
# ... and its dependencies (rapidfuzz, fuzzysearch, numpy: they decide matches) as published by
# this date, so that the same output scores the same later on
OLMOCR_BENCH_AS_OF = "2026-12-01T00:00:00Z"
BENCH_TEST_TYPES = ("present", "absent", "order", "table", "math", "baseline")
CANDIDATE_MARKER = ".ocr-compare.json"  # a candidate folder this tool wrote (and may replace)
# What must agree between the repeats of one candidate: inference_info's, and the PDF render
# DPI, an option of the run its manifest records (inference_info does not)
RUN_SETTINGS = ("model", "model_revision", "script", "settings", "pdf_dpi")
BROWSER_PROBE = """
try:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        p.chromium.launch().close()
    print("chromium: ok")
except Exception as exc:
    print("chromium: " + (str(exc).strip().splitlines() or [type(exc).__name__])[0])
"""


class ScorerError(Exception):
    """The scorer could not be installed or did not finish: printed in one line, exit 1."""


def scorer_command(*args: str) -> list[str]:
    import shutil
    uv = shutil.which("uv")
    if uv is None:
        raise ScorerError("--olmocr-bench installs the official scorer with uv, and uv is not on "
                          "PATH: install it (https://docs.astral.sh/uv/)")
    return [uv, "run", "--no-project", "--quiet", "--exclude-newer", OLMOCR_BENCH_AS_OF,
            *(a for spec in OLMOCR_BENCH for a in ("--with", spec)), *args]


def browser_install_command() -> str:
    playwright = next(s for s in OLMOCR_BENCH if s.startswith("playwright"))
    return f"uv run --no-project --with {playwright} playwright install --with-deps chromium"


def run_scorer(args: list[str], what: str) -> str:
    import subprocess
    done = subprocess.run(scorer_command(*args), capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise ScorerError(f"{what} failed (exit {done.returncode}): "
                          f"{lines[-1].strip() if lines else 'no message'}")
    return done.stdout


@dataclass
class Benchmark:
    folder: Path
    pdfs: list[str]  # paths under pdfs/, as the scorer names them and a run's file_name is
    tests: dict[str, list[dict]]  # test file name -> its tests, in order
    lines: dict[str, list[str]]  # test file name -> its lines as written

    def pages(self) -> set[tuple[str, int]]:
        """The pages tests look at: those the tests name, and page 1 of every PDF (the scorer
        adds a baseline test there)."""
        return {(t["pdf"], t["page"]) for ts in self.tests.values() for t in ts} | \
            {(pdf, 1) for pdf in self.pdfs}


def read_benchmark(folder: Path) -> Benchmark:
    if not folder.is_dir():
        raise UsageError(f"--olmocr-bench {folder} is not a folder")
    pdf_folder = folder / "pdfs"
    if not pdf_folder.is_dir():
        raise UsageError(f"--olmocr-bench {folder} has no pdfs/ folder: give the benchmark's "
                         f"folder (the one with the *.jsonl test files and pdfs/)")
    pdfs = sorted(p.relative_to(pdf_folder).as_posix() for p in pdf_folder.rglob("*.pdf"))
    if not pdfs:
        raise UsageError(f"--olmocr-bench {folder}: pdfs/ holds no .pdf files")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise UsageError(f"--olmocr-bench {folder} has no *.jsonl test files beside pdfs/")
    tests, lines = {}, {}
    for path in files:
        tests[path.name], lines[path.name] = [], []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                test = json.loads(line)
                assert isinstance(test, dict) and isinstance(test["page"], int)
                test["pdf"], test["id"]  # noqa: B018 (the fields every test has)
            except (ValueError, KeyError, AssertionError):
                raise UsageError(f"{path}:{number} is not a test (a JSON object with pdf, page, "
                                 f"id and type)") from None
            if test.get("type") not in BENCH_TEST_TYPES:
                raise UsageError(f"{path}:{number}: test type {test.get('type')!r} is none of "
                                 f"{', '.join(BENCH_TEST_TYPES)}")
            tests[path.name].append(test)
            lines[path.name].append(line)
    unknown = sorted({t["pdf"] for ts in tests.values() for t in ts} - set(pdfs))
    if unknown:
        raise UsageError(f"{len(unknown)} PDF(s) named by the tests are not under {pdf_folder}: "
                         f"{', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}")
    return Benchmark(folder, pdfs, tests, lines)


def run_info(side: Side, column: str) -> dict | None:
    """The settings the rows were made with: the last inference_info entry for the column;
    None when the output records none. Rows made with different settings are refused."""
    found = {}
    for cell in side.columns.get("inference_info") or []:
        try:
            history = json.loads(cell) if isinstance(cell, str) else cell
        except ValueError:
            continue
        entries = [e for e in history or [] if isinstance(e, dict)] \
            if isinstance(history, list) else []
        mine = [e for e in entries if e.get("column") in (None, column)]
        if mine:
            entry = mine[-1]
            found.setdefault(json.dumps({k: entry.get(k) for k in RUN_SETTINGS}, sort_keys=True,
                                        default=str), entry)
    if len(found) > 1:
        raise UsageError(f"the rows of {side.spec} were made with different settings (a rerun "
                         f"with other options?): score outputs of one setting")
    return next(iter(found.values()), None)


def settings_differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b), key=str)
                for d in settings_differences(a.get(key), b.get(key),
                                              f"{where}.{key}" if where else str(key))]
    return [] if a == b else [f"{where} {json.dumps(a, default=str)[:60]} vs "
                              f"{json.dumps(b, default=str)[:60]}"]


@dataclass
class Repeat:
    """One OUTPUT: one repeat of the candidate, its pages by (pdf, page)."""
    spec: str
    texts: dict  # (pdf, page) -> text, or None with the reason in `reasons`
    reasons: dict
    info: dict | None
    ignored: int  # rows that are not pages of the benchmark's PDFs


def read_repeat(label: str, spec: str, bench: Benchmark, args) -> Repeat:
    wanted = side_columns(args.column) + ["file_name", "page_number", "inference_info"]
    side = load_side(label, spec, wanted, args)
    if not (side.has("file_name") and side.has("page_number")):
        raise UsageError(f"{spec} has no file_name and page_number columns: score the output of "
                         f"a run over {bench.folder / 'pdfs'}")
    texts = read_texts(side, args.column)
    known = set(bench.pdfs)
    pages, reasons, ignored = {}, {}, 0
    for i, (name, page) in enumerate(zip(side.column("file_name"), side.column("page_number"))):
        if name not in known or page is None:
            ignored += 1
            continue
        if (name, page) in pages:
            raise UsageError(f"{spec} has two rows for {name} page {page}: score one run's "
                             f"output (each page once)")
        pages[(name, page)] = texts.text[i]
        if texts.text[i] is None:
            reasons[(name, page)] = ("not sent (its text layer was enough)" if texts.skipped(i)
                                     else f"failed: {texts.error[i] or 'no text'}")
    absent = sorted(known - {pdf for pdf, _ in pages})
    if absent:
        raise UsageError(f"{len(absent)} of the benchmark's {len(known)} PDFs are not in {spec}: "
                         f"{', '.join(absent[:5])}{', ...' if len(absent) > 5 else ''}; run the "
                         f"script over {bench.folder / 'pdfs'}")
    info = run_info(side, args.column)
    dpi = manifest_option(Path(spec).expanduser(), "pdf_dpi") if is_local(spec) else None
    if dpi is not None:
        info = {**(info or {}), "pdf_dpi": dpi}
    return Repeat(spec, pages, reasons, info, ignored)


def manifest_option(path: Path, name: str):
    """An option of the run, as its manifest (OUTPUT/.ocr/manifest.json) records it."""
    try:
        options = json.loads((path / MANIFEST).read_text())["identity"]["options"]
        return options.get(name) if isinstance(options, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def candidate_name(args) -> str:
    name = args.candidate or Path(args.a.rstrip("/")).name
    name = re.sub(r"[^\w.+-]+", "-", name).strip(".-") or "candidate"
    if name == "pdfs":
        raise UsageError("the candidate cannot be called pdfs: pass --candidate NAME")
    return name


def write_candidate(bench: Benchmark, name: str, repeats: list[Repeat]) -> tuple[Path, list]:
    """The candidate folder in the benchmark's layout, one .md per page and repeat; a page
    without text is an empty .md (its tests fail, as for a tool that produced nothing). The
    marker comes first: a write cut short leaves a folder the next run may replace."""
    import shutil
    target = bench.folder / name
    if target.exists() and not (target / CANDIDATE_MARKER).is_file():
        raise UsageError(f"{target} exists and was not written by {PROG}: pass --candidate "
                         f"with another name")
    empty = []
    try:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        (target / CANDIDATE_MARKER).write_text(json.dumps(
            {"written_by": PROG, "outputs": [r.spec for r in repeats]}, indent=1) + "\n")
        for number, repeat in enumerate(repeats, 1):
            for pdf, page in sorted(bench.pages() | set(repeat.texts)):
                text = repeat.texts.get((pdf, page))
                if text is None:
                    empty.append({"pdf": pdf, "page": page, "repeat": number,
                                  "reason": repeat.reasons.get((pdf, page), "missing: no row")})
                md = target / f"{pdf[:-len('.pdf')]}_pg{page}_repeat{number}.md"
                md.parent.mkdir(parents=True, exist_ok=True)
                md.write_text(text or "", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the candidate folder {target}: {exc}") from None
    return target, sorted(empty, key=lambda e: (e["pdf"], e["page"], e["repeat"]))


_SCORE_CI = re.compile(r"^\s+Average Score: [\d.]+% \(95% CI: \[([\d.]+)%, ([\d.]+)%\]\) "
                       r"over (\d+) tests")
_SCORE_TYPE = re.compile(r"^ {4}(\w+)\s*: ([\d.]+)% average pass rate over (\d+) tests$")
_SCORE_FILE = re.compile(r"^ {8}(\S.*?)\s*: ([\d.]+)% \((\d+)/(\d+) tests\)$")


def parse_scores(stdout: str) -> dict:
    """The figures of the scorer's summary (olmocr 0.4.27's wording), per type and per file;
    the headline is the mean of the per-file pass rates, from their counts."""
    if "FAILED (errors)" in stdout:
        errors = [line.strip() for line in stdout.splitlines() if "[ERROR]" in line]
        raise ScorerError(f"the scorer failed the candidate: "
                          f"{errors[0] if errors else stdout[-200:]}")
    ci, by_type, by_file = None, {}, {}
    for line in stdout.splitlines():
        if (m := _SCORE_CI.match(line)):
            ci = [float(m.group(1)) / 100, float(m.group(2)) / 100]
        elif (m := _SCORE_TYPE.match(line)):
            by_type[m.group(1)] = {"score": float(m.group(2)) / 100, "tests": int(m.group(3))}
        elif (m := _SCORE_FILE.match(line)):
            passed, total = int(m.group(3)), int(m.group(4))
            by_file[m.group(1)] = {"score": passed / total, "passed": passed, "tests": total}
    if ci is None or not by_type or not by_file:
        raise ScorerError(f"the scorer's summary was not understood (expected "
                          f"{OLMOCR_BENCH[0]}'s): {stdout.strip()[-200:]}")
    score = sum(f["score"] for f in by_file.values()) / len(by_file)
    return {"score": score, "ci95": ci, "by_type": by_type, "by_file": by_file}


def olmocr_bench(args, out) -> dict:
    import tempfile
    bench = read_benchmark(Path(args.olmocr_bench).expanduser())
    specs = [args.a, *args.b]
    repeats = [read_repeat(f"OUTPUT {n}", spec, bench, args) for n, spec in enumerate(specs, 1)]
    for repeat in repeats[1:]:
        first, this = (r.info and {k: r.info.get(k) for k in RUN_SETTINGS}
                       for r in (repeats[0], repeat))
        if first != this:
            diffs = settings_differences(first or {}, this or {}) or ["settings not recorded"]
            raise UsageError(f"{repeat.spec} was made with other settings than {repeats[0].spec} "
                             f"({'; '.join(diffs[:3])}): the repeats of a candidate share them")
    check_writable("--json", args.json)
    scorer_command()  # uv is there, before anything is written
    name = candidate_name(args)
    candidate, empty = write_candidate(bench, name, repeats)
    browser = run_scorer(["python", "-c", BROWSER_PROBE], f"installing {OLMOCR_BENCH[0]}")
    has_browser = "chromium: ok" in browser
    math = sum(t["type"] == "math" for ts in bench.tests.values() for t in ts)
    dropped = 0 if has_browser else math
    with tempfile.TemporaryDirectory(prefix="olmocr-bench-") as scratch:
        scratch = Path(scratch)
        # the scorer sees this candidate alone, and (without a browser) no math test
        (scratch / "pdfs").symlink_to((bench.folder / "pdfs").resolve(), target_is_directory=True)
        (scratch / name).symlink_to(candidate.resolve(), target_is_directory=True)
        for file, tests in bench.tests.items():
            kept = [line for t, line in zip(tests, bench.lines[file])
                    if has_browser or t["type"] != "math"]
            if kept:
                (scratch / file).write_text("\n".join(kept) + "\n", encoding="utf-8")
        failed_file = scratch / "failed.jsonl"
        # --force only without the math tests: a page that had nothing but math tests has no
        # test left, which the scorer otherwise refuses (every page's .md is written anyway)
        stdout = run_scorer(["python", "-m", "olmocr.bench.benchmark", "--dir", str(scratch),
                             "--candidate", name, "--output_failed", str(failed_file),
                             *([] if not dropped else ["--force"])],
                            f"scoring with {OLMOCR_BENCH[0]}")
        failed = [json.loads(line) for line in failed_file.read_text().splitlines()
                  if line.strip()] if failed_file.exists() else []
    result = {"mode": "olmocr-bench", "scorer": " ".join(OLMOCR_BENCH),
              "scorer_dependencies_as_of": OLMOCR_BENCH_AS_OF, "benchmark": str(
        bench.folder.resolve()), "candidate": str(candidate.resolve()), "repeats": len(repeats),
        "outputs": specs, **parse_scores(stdout),
        "comparable": not dropped, "math_tests": "scored" if not dropped else "left out",
        "math_tests_left_out": dropped,
        "failed_tests": [{k: t.get(k) for k in ("id", "type", "pdf", "page")} for t in failed],
        "empty_pages": empty, "ignored_rows": [r.ignored for r in repeats],
        "settings": repeats[0].info}
    if dropped:
        result["browser"] = clip(browser.strip().splitlines()[-1], 200) if browser.strip() else None
        result["browser_install"] = browser_install_command()
    write_json(args, result)
    print_bench(result, out)
    return result


def print_bench(result: dict, out) -> None:
    def w(line: str = "") -> None:
        print(line, file=out)

    w(f"olmOCR-Bench {result['benchmark']}, scored by {OLMOCR_BENCH[0]} (the official scorer; "
      f"its dependencies as published by {OLMOCR_BENCH_AS_OF[:10]})")
    w(f"candidate {result['candidate']}: {result['repeats']} repeat(s) "
      f"({', '.join(result['outputs'])}); a test passes when most of its repeats pass")
    if not result["comparable"]:
        w()
        w(f"Playwright's Chromium is not installed ({result['browser']}): the "
          f"{result['math_tests_left_out']} math test(s) were left out, so the overall score is "
          f"NOT comparable to published figures. Install the browser, then run this again:")
        w(f"  {result['browser_install']}")
    w()
    lo, hi = result["ci95"]
    label = "" if result["comparable"] else "  (without math tests: not comparable)"
    w(f"overall {result['score']:.1%} (95% CI {lo:.1%} to {hi:.1%}): the mean of the per-file "
      f"pass rates{label}")
    w()
    w("by test type (mean pass rate over repeats):")
    for kind, f in sorted(result["by_type"].items()):
        w(f"  {kind:<10} {f['score']:>6.1%}  {f['tests']:>5} tests")
    w("by test file:")
    for file, f in sorted(result["by_file"].items()):
        w(f"  {clip(file, 30):<30} {f['score']:>6.1%}  {f['passed']:>5}/{f['tests']} tests")
    if result["empty_pages"]:
        w()
        w(f"pages written empty, their tests failed ({len(result['empty_pages'])}):")
        for page in result["empty_pages"][:20]:
            w(f"  {page['pdf']} page {page['page']}, repeat {page['repeat']}: "
              f"{clip(page['reason'], 80)}")
        if len(result["empty_pages"]) > 20:
            w(f"  ... ({len(result['empty_pages']) - 20} more in --json)")
    if any(result["ignored_rows"]):
        w(f"rows that are no page of the benchmark's PDFs, ignored: "
          f"{', '.join(map(str, result['ignored_rows']))} (per output)")
    w()
    info = result["settings"]
    if not info:
        w("settings: not recorded (the output has no inference_info)")
        return
    w(f"settings (inference_info): model {info.get('model')}, revision "
      f"{info.get('model_revision') or 'not recorded'}, script {info.get('script')}")
    if info.get("pdf_dpi") is not None:
        w(f"  PDF pages rendered at up to {info['pdf_dpi']} DPI (the run manifest's --pdf-dpi)")
    for key, value in (info.get("settings") or {}).items():
        shown = json.dumps(value, ensure_ascii=False, default=str)
        long = isinstance(value, str) and len(shown) > 100
        w(f"  {key}: {clip(shown, 100)}{f' ({len(value)} characters)' if long else ''}")


# ---- main --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("a", metavar="A", help="a Hub dataset id or a local output/parquet/saved dataset")
    parser.add_argument("b", metavar="B", nargs="*",
                        help="a second run, for parity (or, with --reference, a second system); "
                             "with --olmocr-bench, more repeats")
    parser.add_argument("--column", default="markdown", metavar="COLUMN", help="text column of A (default: markdown)")
    parser.add_argument("--column-b", default=None, metavar="COLUMN", help="text column of B (default: --column)")
    parser.add_argument("--key", default=None, metavar="COL[,COL]", type=lambda s: [c.strip() for c in s.split(",") if c.strip()],
                        help="column(s) that identify a row on both sides, comma-separated "
                             "(default: the run manifest's row identity, input_digest, else "
                             "file_name [+ page_number], else row order when no run was shuffled)")
    parser.add_argument("--reference", default=None, metavar="DATASET",
                        help="ground-truth dataset, joined by the key (accuracy mode)")
    parser.add_argument("--reference-column", default=None, metavar="COLUMN",
                        help="ground-truth text column: in A when no --reference is given, else "
                             "in the reference dataset (default there: text)")
    parser.add_argument("--min-reference-chars", type=int, default=20, metavar="N",
                        help="pages count when the normalised reference has at least this many "
                             "characters (default: 20)")
    parser.add_argument("--normalise", "--normalize", default="reading", choices=sorted(NORMALISATIONS), metavar="NAME",
                        help="text normalisation before distances: diplomatic or reading (default: reading)")
    parser.add_argument("--by", default=None, metavar="COLUMN",
                        help="break the figures down by this column (a volume, a language)")
    parser.add_argument("--olmocr-bench", default=None, metavar="DIR",
                        help="score A (and B...: more repeats) on olmOCR-Bench with its official "
                             "scorer: DIR is the benchmark's folder (*.jsonl, pdfs/)")
    parser.add_argument("--candidate", default=None, metavar="NAME",
                        help="with --olmocr-bench: the candidate folder written in DIR "
                             "(default: A's folder name)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="write a PNG histogram of per-page CER (accuracy) or similarity (parity)")
    parser.add_argument("--rows", default=None, metavar="PATH",
                        help="write per-row figures (.csv, else JSON lines)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="processes that score rows, on Linux (default: one per core)")
    parser.add_argument("--show", type=int, default=5, metavar="N", help="worst pairs or pages shown, "
                        "in the terminal and in --html (default: 5)")
    parser.add_argument("--html", default=None, metavar="PATH",
                        help="write REPORT.html: each page shown beside its text (rendered and as "
                        "source), errors and flags, the differences marked; one file that opens "
                        "offline. With A alone, a look at one run (its first --show pages)")
    parser.add_argument("--input", default=None, metavar="PATH",
                        help="--html of PDF pages: the run's input (a local folder or .pdf), to "
                        "render the pages from (an output keeps no PDF bytes)")
    parser.add_argument("--image-column", default=None, metavar="COLUMN",
                        help="--html: A's page image column (default: the run's, else image)")
    parser.add_argument("--html-page-px", type=int, default=1600, metavar="PX",
                        help="--html: the long side of the view a thumbnail opens (default: "
                        "1600; 0: thumbnails only, a smaller file)")
    parser.add_argument("--split", default="train", help="split of Hub or saved datasets (default: train)")
    parser.add_argument("--config", default=None, help="Hub dataset config")
    parser.add_argument("--revision", default=None, help="Hub dataset revision")
    parser.add_argument("--hf-token", default=None, help="Hub token (default: HF_TOKEN or the cached login)")
    return parser


def run(args, out=sys.stdout) -> dict:
    if args.olmocr_bench is not None:
        if args.reference is not None or args.reference_column is not None:
            raise UsageError("--olmocr-bench scores against the benchmark's tests: no --reference")
        other = [f"--{o}" for o in ("key", "by", "plot", "rows") if getattr(args, o)]
        if other:
            raise UsageError(f"{' and '.join(other)} {'does' if len(other) == 1 else 'do'} not go "
                             f"with --olmocr-bench (its figures are the scorer's; --json writes "
                             f"them)")
        return olmocr_bench(args, out)
    if args.candidate is not None:
        raise UsageError("--candidate goes with --olmocr-bench")
    if len(args.b) > 1:
        raise UsageError(f"parity and accuracy take one or two outputs, not {1 + len(args.b)} "
                         f"(several repeats are for --olmocr-bench)")
    args.b = args.b[0] if args.b else None
    norm = NORMALISATIONS[args.normalise]
    for option in ("input", "image_column"):
        if getattr(args, option) is not None and not args.html:
            raise UsageError(f"--{option.replace('_', '-')} goes with --html")
    accuracy_mode = args.reference is not None or args.reference_column is not None
    if not accuracy_mode and args.b is None and not args.html:
        raise UsageError("give B to compare two runs, or --reference-column / --reference for "
                         "accuracy against ground truth, or --html to look at one run (see --help)")
    for option, low in (("min_reference_chars", 0), ("workers", 1), ("show", 0), ("html_page_px", 0)):
        if getattr(args, option) < low:
            raise UsageError(f"--{option.replace('_', '-')} must be >= {low}")
    for option in ("json", "plot", "rows", "html"):  # before the comparison runs, not after it
        check_writable(f"--{option}", getattr(args, option))
    if not accuracy_mode and args.b is None:
        return look(args, out)
    started = time.perf_counter()
    column_b = args.column_b or args.column
    extra = list(args.key or []) + list(DEFAULT_KEY) + [ROW_IDENTITY] + ([args.by] if args.by else [])
    if not accuracy_mode:
        a = load_side("A", args.a, side_columns(args.column) + extra, args)
        b = load_side("B", args.b, side_columns(column_b) + extra + (a.manifest_key or []), args)
        loaded = time.perf_counter()
        report = parity(a, b, args, norm)
        result = report["result"]
        result["seconds"] = round(time.perf_counter() - started, 3)
        result["seconds_loading"] = round(loaded - started, 3)
        result["worker_processes"] = WORKERS_USED["processes"]
        if args.plot:
            rest = [r["similarity"] for r in report["rows"] if r.get("identical") is False]
            write_plot(args.plot, f"similarity of the {len(rest)} non-identical pages "
                       f"({norm.label}; {result['identical']}/{result['rows_compared']} byte-identical)",
                       {"A vs B": rest}, "similarity (1 - Levenshtein / longer length)")
        if args.rows:
            write_rows(args.rows, [{k: v for k, v in r.items() if k != "group" or args.by}
                                   for r in report["rows"]])
        write_json(args, result)
        print_parity(report, args, out)
        if args.html:
            write_html_report(args.html, f"{a.description} against {b.description}", [
                f"Parity, matched by {result['matched_by']}: {result['identical']} of "
                f"{result['rows_compared']} pages byte-identical; similarity ({norm.label}) of the "
                f"others: median {fmt(result['similarity_median'])}, min {fmt(result['similarity_min'])}.",
                f"The {min(args.show, len(report['rows']))} worst pages of {len(report['rows'])}, "
                f"worst first (--show)."], report_pages_parity(report, a, args), a, args)
            print(f"report: {args.html}", file=out)
    else:
        ref_column = args.reference_column or "text"
        a = load_side("A", args.a, side_columns(args.column) + extra
                      + ([] if args.reference else [ref_column]), args)
        if args.reference:
            ref = load_side("reference", args.reference,
                            [ref_column] + extra + (a.manifest_key or []), args)
        else:
            ref = a
        systems = [("A", a, args.column)]
        if args.b is not None:
            systems.append(("B", load_side("B", args.b, side_columns(column_b) + extra, args), column_b))
        loaded = time.perf_counter()
        result = {"mode": "accuracy", "normalisation": norm.label,
                  "normalisation_summary": norm.summary, "characters": CHARACTERS_NOTE,
                  "reference": ref.description, "reference_column": ref_column,
                  "min_reference_chars": args.min_reference_chars}
        shown = {"systems": {}, "details": {}, "normalisation": norm.label,
                 "normalisation_name": norm.name, "normalisation_summary": norm.summary,
                 "reference": ref.description, "reference_column": ref_column,
                 "min_reference_chars": args.min_reference_chars}
        for label, side, column in systems:
            if side is ref:
                match = Match([(i, i) for i in range(side.num_rows)], "row (the reference is a column of A)", 0, 0, None)
            else:
                match = match_rows(side, ref, args.key)
            group_of = _group_lookup(args.by, side, ref)
            detail = accuracy(side, column, ref, ref_column, match, args, norm, group_of)
            figures = detail["result"]
            if label == "A":
                result.update({"a": side.description, "column": column, "matched_by": match.how,
                               **figures})
            else:
                result["b"] = {"source": side.description, "column": column,
                               "matched_by": match.how, **figures}
            shown["systems"][label] = {"source": side.description, "column": column,
                                       "matched_by": match.how, "figures": figures}
            shown["details"][label] = detail
        result["seconds"] = round(time.perf_counter() - started, 3)
        result["seconds_loading"] = round(loaded - started, 3)
        result["worker_processes"] = WORKERS_USED["processes"]
        if args.plot:
            # what the headline counts (a looping page at 1), and anything above 1 drawn at 1
            series = {f"{label} ({shown['systems'][label]['source']})":
                      [min(r["cer"], 1.0) for r in shown["details"][label]["rows"] if "cer" in r]
                      for label in shown["systems"]}
            write_plot(args.plot, f"CER per page ({norm.label}; reference >= "
                       f"{args.min_reference_chars} chars)", series,
                       "CER per page (looping pages, and any page above 1, drawn at 1)")
        if args.rows:
            rows = []
            for label in shown["systems"]:
                for r in shown["details"][label]["rows"]:
                    rows.append({"system": label, **{k: v for k, v in r.items()
                                                     if k != "group" or args.by}})
            write_rows(args.rows, rows)
        write_json(args, result)
        print_accuracy(shown, args, out)
        if args.html:
            rows = len(shown["details"]["A"]["rows"])
            write_html_report(args.html, f"{a.description} against {ref.description} [{ref_column}]", [
                f"Accuracy against [{ref_column}] of {ref.description} ({norm.label}): CER "
                f"{fmt(result.get('cer_micro'))} (pooled), WER {fmt(result.get('wer_micro'))}.",
                f"The {min(args.show, rows)} worst pages of {rows} by A's CER, worst first (--show)."],
                report_pages_accuracy(shown, a, args), a, args)
            print(f"report: {args.html}", file=out)
    return result


def look(args, out) -> dict:
    """--html with A alone: its first --show pages beside their text, in input order."""
    extra = list(DEFAULT_KEY)
    a = load_side("A", args.a, side_columns(args.column) + extra, args)
    texts = read_texts(a, args.column)
    counts = {"rows": a.num_rows, "text": sum(t is not None for t in texts.text),
              "error": sum(texts.failed(i) for i in range(a.num_rows)),
              "skipped": sum(texts.skipped(i) for i in range(a.num_rows)),
              "looping": sum(t is not None and is_looping(t, f) for t, f in zip(texts.text, texts.finish))}
    result = {"mode": "look", "a": a.description, "column": args.column, **counts}
    write_json(args, result)
    summary = (f"{counts['rows']} rows: {counts['text']} with text ({counts['looping']} looping), "
               f"{counts['error']} errors, {counts['skipped']} not sent")
    write_html_report(args.html, f"{a.description} [{args.column}]", [
        summary + ".", f"The first {min(args.show, a.num_rows)} pages, in input order (--show)."],
        report_pages_look(a, texts, args), a, args)
    print(f"{a.description} [{args.column}]: {summary}\nreport: {args.html}", file=out)
    return result


def write_json(args, result: dict) -> None:
    """Written before the table is printed, so a closed pipe (`| head`) never loses it."""
    if args.json:
        try:
            output_file("--json", args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write --json {args.json}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ScorerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
