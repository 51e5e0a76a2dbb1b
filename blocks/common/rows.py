"""A page's result: its row, an error row with its cause, a document's pages joined."""

from dataclasses import dataclass
from dataclasses import field

from blocks.common.errors import PageError
from blocks.common.loops import CUT
from blocks.common.pages import BLANK_REASON, prepare_page, PreparedPage
from blocks.common.pdf import PdfPage
from blocks.model import EXTRA_COLUMNS

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
