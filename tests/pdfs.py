"""PDFs the tests make with reportlab: pages of known size, rotation, colour and text."""

from __future__ import annotations

import io
from dataclasses import dataclass


@dataclass
class Page:
    width: float = 612.0  # points (US Letter)
    height: float = 792.0
    rotation: int = 0  # the page's /Rotate
    colour: tuple = (1.0, 1.0, 1.0)  # the page's fill, RGB in 0..1
    text: str | None = None  # drawn as real text: the page's text layer


def make_pdf(pages: list[Page], password: str | None = None) -> bytes:
    from reportlab.lib import pdfencrypt
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    encrypt = pdfencrypt.StandardEncryption(password, canPrint=0) if password else None
    c = canvas.Canvas(buffer, encrypt=encrypt, invariant=1)
    for page in pages:
        c.setPageSize((page.width, page.height))
        c.setPageRotation(page.rotation)
        c.setFillColorRGB(*page.colour)
        c.rect(0, 0, page.width, page.height, fill=1, stroke=0)
        if page.text:
            c.setFillColorRGB(0, 0, 0)
            c.setFont("Helvetica", 11)
            for i, line in enumerate(page.text.splitlines()):
                c.drawString(36, page.height - 48 - 14 * i, line)
        c.showPage()
    c.save()
    return buffer.getvalue()


def zero_page_pdf() -> bytes:
    """A well-formed PDF whose page tree is empty."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument.new()
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def colour_of(page_index: int) -> tuple:
    """A distinct flat colour per page, far from white (0..1 floats)."""
    return ((page_index * 37 % 200 + 30) / 255, (page_index * 71 % 200 + 30) / 255,
            (page_index * 113 % 200 + 30) / 255)
