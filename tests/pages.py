"""Synthetic page images for the tests (no pytest here: the engine-side tools import it)."""

from __future__ import annotations

import io
import random


def page_image(seed: int, size=(640, 820), mode="RGB", fmt="PNG") -> bytes:
    """A distinct synthetic page: a background colour and text-like bars from the seed."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", size, (rng.randrange(200, 256), rng.randrange(200, 256), rng.randrange(200, 256)))
    draw = ImageDraw.Draw(img)
    for line in range(rng.randrange(5, 25)):
        y = 40 + line * 28
        draw.rectangle([40, y, 40 + rng.randrange(100, size[0] - 80), y + 12], fill=(20, 20, 20))
    if mode != "RGB":
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()
