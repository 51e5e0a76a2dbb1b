"""Loop checks: an answer repeating itself, cut or sent again; the first pages' check."""

import zlib

from blocks.common.errors import EXIT_DEGENERATE, RunAborted
from blocks.common.model_options import REPETITION_DETECTION
from blocks.common.rows import error_row, RowResult, SERVER
from blocks.model import JOB_IMAGE, MODEL_ID

CUT = ("length", "repetition")  # an answer the engine ended: at max_tokens, or by its detection


def repeated_tail(text: str, max_period: int = 200) -> tuple[int, int]:
    """(period, repeats) of the longest run of one unit repeated at the end of text."""
    best = (0, 0)
    for period in range(1, min(max_period, len(text) // 2) + 1):
        unit = text[-period:]
        repeats, end = 1, len(text) - period
        while end >= period and text[end - period:end] == unit:
            repeats += 1
            end -= period
        if repeats >= 2 and repeats * period > best[0] * best[1]:
            best = (period, repeats)
    return best


def text_before_loop(text: str) -> int:
    """The characters before the repeating tail, with one copy of its unit."""
    period, repeats = repeated_tail(text, 1000)
    return len(text) - period * (repeats - 1) if repeats else len(text)


def cut_at_loop(text: str, finish_reason: str | None) -> str:
    """An answer that repetition detection ended keeps its text up to one copy of the loop."""
    return text[:text_before_loop(text)] if text and finish_reason == "repetition" else text


def looks_degenerate(text: str | None) -> bool:
    """Empty, one or two characters over and over, or mostly a repetition loop."""
    if not text or not text.strip():
        return True
    visible = [c for c in text if not c.isspace()]
    period, repeats = repeated_tail(text) if len(text) >= 40 else (0, 0)
    return len(visible) >= 8 and len(set(visible)) <= 2 or \
        repeats >= 5 and period * repeats >= len(text) * 0.5 or \
        len(text) >= 200 and len(zlib.compress(text.encode())) < len(text.encode()) * 0.05


def loops(text: str | None, finish_reason: str | None) -> bool:
    """An answer to send again: cut by the engine (detection, or max_tokens) in a loop."""
    if finish_reason not in CUT or not text or not text.strip():
        return False
    period, repeats = repeated_tail(text)
    return finish_reason == "repetition" or looks_degenerate(text) or \
        (repeats >= 5 and period * repeats >= 100)


def repetition_detection(args) -> dict | None:
    return dict(zip(("max_pattern_size", "min_count"), REPETITION_DETECTION)) \
        if getattr(args, "repetition_detection", False) else None  # a bare namespace: off


def loop_seed(index: int, attempt: int) -> int:
    """The same row and attempt, the same seed: a rerun repeats the retry."""
    return zlib.crc32(f"{index}:{attempt}".encode()) & 0x7FFFFFFF


def kept_attempt(kept: "RowResult", retry: "RowResult") -> "RowResult":
    """The retry if it has text and does not loop, or more text before its loop."""
    if retry.error is not None:
        return kept if retry.error_kind != SERVER else error_row(  # a rerun redoes it
            f"the answer looped, and sending it again failed: {retry.error}", SERVER)
    attempts = (kept.attempts or 1) + 1
    if (retry.text or "").strip() and not loops(retry.text, retry.finish_reason) or \
            text_before_loop(retry.text or "") > text_before_loop(kept.text):
        kept = retry  # never a page's text traded for nothing
    kept.attempts = attempts
    return kept


class DegenerateCheck:
    """Stops the run when the first pages (at least 3) all came back broken, resent or refused."""

    def __init__(self, enabled: bool, pages: int, send: list):
        self.pages, self.seen, self.broken, self.cut = max(3, pages), 0, 0, 0
        self.error = None  # the last refusal's (a 400, a post-processing failure)
        self.first = set(send[:self.pages])  # the rows sent first: a refusal counts among them
        self.done, self.tripped = not (enabled and send), False

    def passed(self) -> bool:
        return self.done and not self.tripped

    def observe(self, result: "RowResult", index: int | None = None) -> None:
        if self.done or result.error and index is not None and index not in self.first:
            return  # a refusal is back at once, before the answers of the pages sent with it
        visible = "".join((result.text or "").split())  # a complete blank form is not broken
        self.seen += 1
        self.error = result.error or self.error
        self.cut += result.finish_reason == "length"
        looped = (result.attempts or 1) - result.resent > 1  # a resend asked for is no loop
        self.broken += looped or result.finish_reason in CUT or \
            not visible or len(visible) >= 8 and len(set(visible)) == 1
        if self.seen >= self.pages:
            self.finish()

    def finish(self) -> None:
        if self.done or self.seen < 3 or self.broken < self.seen:
            self.done = True
            return
        self.done = self.tripped = True
        cut = f"; {self.cut} were cut at --max-tokens: raise it if the pages hold more text" \
            if self.cut else f"; the last refusal: {self.error[:300]}" if self.error else ""
        raise RunAborted(
            f"the first {self.seen} pages all came back degenerate (empty, looping, cut or "
            f"refused){cut}: a wrong model / engine pair looks like this (validated: {MODEL_ID} "
            f"on {JOB_IMAGE}). Check --model and the image, or pass --no-sanity-check to write "
            f"such output anyway.", code=EXIT_DEGENERATE)
