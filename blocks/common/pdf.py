"""PDF documents: a row per page, counted unrendered, rendered in their own process."""

import contextlib
import ctypes
import hashlib
import multiprocessing
import os
import queue
import re
import signal
import sys
from dataclasses import dataclass
from dataclasses import field

from blocks.blank_page import is_blank
from blocks.common.errors import fail, PageError
from blocks.common.inputs import InputSource
from blocks.common.pages import (
    cell_source, encode_page, input_digest, judges_blank, PDF_MAX_PIXELS, PreparedPage,
    sent_size,
)

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
