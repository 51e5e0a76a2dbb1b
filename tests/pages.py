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
