"""The blank-page rule (blocks/blank_page.py) on pages made for it (tests/blank_pages.py). The
rule's constants were set on seeds 0-7 of these makers; the seeds here (100 on) were not looked
at then. What must be skipped: white paper, scanner noise, paper texture, a dark scan border.
What must be sent: a lone page number, one faint pencil line, light small text, a light
watermark; bleed-through from the other side is sent (a rule that never skips text cannot tell
show-through from faint print). And every page with text of the kind the tests' PDFs hold, at
the DPIs the scripts render."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from blocks import blank_page  # noqa: E402
import blank_pages  # noqa: E402
from conftest import record_figure  # noqa: E402
from pdfs import Page, make_pdf  # noqa: E402

SEEDS = range(100, 104)


def blank(data: bytes) -> bool:
    return blank_page.is_blank(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("kind", sorted(blank_pages.SKIP))
def test_plainly_blank_pages_are_skipped(kind):
    make = blank_pages.SKIP[kind]
    assert [blank(make(seed)) for seed in SEEDS] == [True] * len(SEEDS)


@pytest.mark.parametrize("kind", sorted(blank_pages.SEND) + ["bleed-through"])
def test_pages_with_any_ink_are_sent(kind):
    make = blank_pages.SEND.get(kind, blank_pages.bleed_through)
    assert [blank(make(seed)) for seed in SEEDS] == [False] * len(SEEDS)


@pytest.mark.parametrize("fmt,size", [("PNG", (1240, 1754)), ("JPEG", (1700, 2200)),
                                      ("PNG", (640, 820)), ("JPEG", (4960, 7016))])
def test_the_rule_holds_at_other_scales_and_formats(fmt, size):
    """150 and 200 dpi, a small page, 600 dpi: the same pages, another size and format."""
    scale = size[0] / blank_pages.A4_300[0]
    for seed in SEEDS[:2]:
        for make, expected in ((blank_pages.white, True), (blank_pages.scanner_noise, True),
                               (blank_pages.light_small_text, False), (blank_pages.page_number, False)):
            page = Image.open(io.BytesIO(make(seed))).resize(size)
            out = io.BytesIO()
            page.save(out, fmt)
            assert blank(out.getvalue()) is expected, (make.__name__, seed, size, scale)


def rendered_pages(pdf: bytes, dpi: int) -> list[Image.Image]:
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(pdf)
    return [page.render(scale=dpi / 72).to_pil() for page in document]


@pytest.mark.parametrize("dpi", [72, 150, 400])
def test_every_test_pdf_page_with_text_is_sent(dpi):
    """The pages the tests' PDFs hold (tests/pdfs.py: 11 pt Helvetica on white or a flat
    colour), from a single word to full lines, and flat pages without text or mark (blank)."""
    from pdfs import colour_of

    texts = ["x", "first", "A line of text.", "Short caption", "x" * 200, "secret",
             "\n".join(f"line {i} of a page of prose" for i in range(40))]
    pages = [Page(text=t) for t in texts] + [Page(colour=colour_of(i), text=f"page {i + 1}")
                                            for i in range(6)]
    for image, page in zip(rendered_pages(make_pdf(pages), dpi), pages):
        assert not blank_page.is_blank(image), (page.text, dpi)
    flat = [Page(mark=False), Page(colour=colour_of(3), mark=False),
            Page(colour=(0.3, 0.3, 0.3), mark=False)]
    assert all(blank_page.is_blank(image) for image in rendered_pages(make_pdf(flat), dpi))


def text_page(points: float, grey: int, dpi: int = 300, paper: int = 245) -> Image.Image:
    """One word of `points` pt at `grey` on `paper`, a scan at `dpi` (blurred, JPEG)."""
    from PIL import ImageFilter

    size = (int(8.27 * dpi), int(11.69 * dpi))
    page = Image.new("L", size, paper)
    ImageDraw.Draw(page).text((size[0] // 3, size[1] // 2), "word",
                              fill=grey, font=ImageFont.load_default(size=max(1, round(points * dpi / 72))))
    out = io.BytesIO()
    page.filter(ImageFilter.GaussianBlur(0.7)).convert("RGB").save(out, "JPEG", quality=88)
    return Image.open(io.BytesIO(out.getvalue()))


def test_the_faintest_and_smallest_text_still_sent():
    """Figures for the closing note: one word on a white page at 300 dpi, by point size and by
    its contrast with the paper (grey levels): the smallest and the faintest the rule sends."""
    smallest = next(points for points in (2, 3, 4, 5, 6) if not blank_page.is_blank(text_page(points, 20)))
    faintest = next(contrast for contrast in range(4, 80, 4)
                    if not blank_page.is_blank(text_page(10, 245 - contrast)))
    record_figure(f"blank-page rule: the smallest black word sent {smallest} pt, the faintest "
                  f"10 pt word sent {faintest} grey levels below the paper (300 dpi A4 JPEG)")
    assert smallest <= 4 and faintest <= 40
