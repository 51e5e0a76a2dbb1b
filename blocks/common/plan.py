"""Which rows are done: the journal of written parts, the plan of the rows to send."""

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from blocks.common.card import part_note
from blocks.common.errors import log, PageError
from blocks.common.inputs import InputSource, iter_image_cells
from blocks.common.pages import input_digest, read_cell_bytes
from blocks.common.pdf import PdfPage
from blocks.common.rows import is_blank_row, PAGE, RowResult, SERVER
from blocks.common.saving import part_name
from blocks.common.store import OutputStore

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
