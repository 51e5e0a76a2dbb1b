"""The input: which files or Hub rows are the pages, opened as one dataset."""

import contextlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from blocks.common.errors import fail, log
from blocks.common.model_options import MODEL_REVISION
from blocks.common.pages import _resolve_image_path, hub_download_folder
from blocks.common.pdf import count_pdf_pages, find_pdf_column, PDF_COLUMNS
from blocks.model import EXTRA_COLUMNS, MODEL_ID

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
