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
    # a short dark bar in the page's corner (drawn, no text layer): ink, so the page is sent;
    # False: a page of flat colour alone, blank (issue #44: blank pages are not sent)
    mark: bool = True


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
        if page.mark:
            c.setFillColorRGB(0, 0, 0)
            c.rect(page.width * 0.08, page.height * 0.06, page.width * 0.06, page.height * 0.008,
                   fill=1, stroke=0)
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


def raw_image_pdf(colours: list[tuple], side: int = 200) -> bytes:
    """A PDF of flat-colour pages, each an uncompressed RGB image (as some scanners write them):
    PDFs of one page count and side have one size, and the same last 64 KiB whatever the colours
    of the pages before the last."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                   b" ".join(b"%d 0 R" % (3 + 3 * i) for i in range(len(colours))), len(colours))]
    for i, colour in enumerate(colours):
        content = b"q %d 0 0 %d 0 0 cm /Im0 Do Q" % (side, side)
        pixels = bytearray(bytes(colour) * side * side)
        for row in range(side // 20, side // 20 + 3):  # a short dark bar: ink (see Page.mark)
            start = (row * side + side // 10) * 3
            pixels[start:start + 3 * (side // 8)] = bytes(3 * (side // 8))
        pixels = bytes(pixels)
        objects += [
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /XObject << /Im0 "
            b"%d 0 R >> >> /Contents %d 0 R >>" % (side, side, 5 + 3 * i, 4 + 3 * i),
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
            b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
            b"/BitsPerComponent 8 /Length %d >>\nstream\n%s\nendstream" % (
                side, side, len(pixels), pixels)]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1,
                                                                              xref)
    return bytes(out)


def hanging_pdf(depth: int = 40) -> bytes:
    """A one-page PDF that PDFium never finishes rendering: forms nested `depth` deep, each
    drawing the next four times (4**depth draws), as a pathological real file can."""
    forms = []
    for level in range(depth):
        content = b"/X Do /X Do /X Do /X Do" if level < depth - 1 else b"0 0 1 rg 9 9 99 99 re f"
        resources = b"/Resources << /XObject << /X %d 0 R >> >>" % (6 + level) \
            if level < depth - 1 else b""
        forms.append(b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] %s /Length %d >>\n"
                     b"stream\n%s\nendstream" % (resources, len(content), content))
    page = b"/X0 Do"
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject "
               b"<< /X0 5 0 R >> >> /Contents 4 0 R >>",
               b"<< /Length %d >>\nstream\n%s\nendstream" % (len(page), page), *forms]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1,
                                                                             xref)
    return bytes(out)
