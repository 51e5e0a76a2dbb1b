"""Synthetic page images for the tests (no pytest here: the engine-side tools import it)."""

from __future__ import annotations

import io
import random


def page_image(seed: int, size=(640, 820), mode="RGB", fmt="PNG", grain: int = 0) -> bytes:
    """A distinct synthetic page: a background colour and text-like bars from the seed; with
    `grain`, paper noise of that amplitude, so that it encodes to the size of a real scan."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", size, (rng.randrange(200, 256), rng.randrange(200, 256), rng.randrange(200, 256)))
    draw = ImageDraw.Draw(img)
    for line in range(rng.randrange(5, 25)):
        y = 40 + line * 28
        draw.rectangle([40, y, 40 + rng.randrange(100, size[0] - 80), y + 12], fill=(20, 20, 20))
    if grain:
        import numpy as np

        noise = np.random.default_rng(seed).integers(-grain, grain + 1, (size[1], size[0], 1))
        pixels = np.asarray(img, dtype=np.int16) + noise
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def scan_page(seed: int, size=(2480, 3508), fmt="JPEG", quality: int = 90) -> bytes:
    """A page shaped like a real scan: off-white paper with fibre grain, dense lines of printed
    words at a size proportional to the page (about 60 lines), softened as a scanner's optics
    do, then a little sensor noise.
    Fine detail is what separates resampling filters; the bars of page_image have too little."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont
    import numpy as np

    rng = random.Random(seed)
    width, height = size
    img = Image.new("L", size, rng.randrange(225, 245))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=max(8, height // 90))
    words = ["the", "of", "page", "scanned", "Report", "1923", "archive", "vol.", "quantum",
             "Table", "x=3.14", "and", "minutes", "BOARD", "revenue", "§12", "lorem", "ipsum"]
    margin, line_height = width // 12, height // 64
    for y in range(margin, height - margin, line_height):
        line = " ".join(rng.choice(words) for _ in range(rng.randrange(8, 24)))
        draw.text((margin, y), line, fill=rng.randrange(10, 60), font=font)
    noise = np.random.default_rng(seed)
    paper = np.asarray(img, dtype=np.float32) + noise.normal(0, 8, (height, width))  # fibres
    img = Image.fromarray(np.clip(paper, 0, 255).astype(np.uint8), "L")
    img = img.filter(ImageFilter.GaussianBlur(max(0.6, height / 4000)))  # the scanner's optics
    pixels = np.asarray(img, dtype=np.float32) + noise.normal(0, 2, (height, width))  # sensor
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    img = Image.fromarray(np.stack([pixels] * 3, axis=-1), "RGB")
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return out.getvalue()


def with_ink(img):
    """A flat test page with a short dark bar in its corner: ink, so the blank-page rule sends
    it (issue #44); the page's mean colour barely moves (the stub's --answer-map reads it)."""
    from PIL import ImageDraw

    width, height = img.size
    top = max(height // 20, min(height // 3, 10))  # off the edge of a thin strip too
    ImageDraw.Draw(img).rectangle([width // 12, top, width // 12 + max(4, width // 10),
                                   top + max(3, height // 150)], fill="black" if img.mode in (
                                       "RGB", "L") else 0)
    return img
