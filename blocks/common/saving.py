"""A finished row's path to disk: held failures, the part writer, the part files."""

import contextlib
import io
import itertools
import json
import os
import re
import threading
import time
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

from blocks.common.errors import EXIT_REFUSED, log, PageError, RunAborted
from blocks.common.inputs import (
    _TEXT_LAYER_COLUMNS, InputSource, result_column_names, RESULT_FIELDS, ROW_IDENTITY,
)
from blocks.common.jobs_command import rerun_advice
from blocks.common.loops import DegenerateCheck, loops
from blocks.common.model_options import POSTPROCESS_GETS_SIZE
from blocks.common.pages import _resolve_image_path, input_digest, read_cell_bytes
from blocks.common.pdf import input_features, input_rows
from blocks.common.plan import RowPlan
from blocks.common.rows import (
    error_row, exception_row, is_blank_row, joined_pages, PAGE, RowResult, SERVER,
)
from blocks.common.stats import RunStats
from blocks.common.store import OutputStore
from blocks.model import EXTRA_COLUMNS, postprocess

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
