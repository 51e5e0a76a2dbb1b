"""Pages made for the blank-page rule: what must be skipped, what must be sent, and
bleed-through (either). Seeded: a seed gives the same page."""
from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

A4_300 = (2480, 3508)


def paper(rng, size, tone=None, texture=0.0, noise=0.0):
    w, h = size
    tone = tone if tone is not None else rng.randrange(236, 252)
    base = np.full((h, w), float(tone), np.float32)
    if texture:  # fibres and blotches: low-frequency noise
        small = np.random.default_rng(rng.randrange(1 << 30)).normal(0, texture, (h // 16 + 1, w // 16 + 1))
        blot = Image.fromarray(small.astype(np.float32), "F").resize((w, h), Image.BICUBIC)
        base += np.asarray(blot)
        fine = np.random.default_rng(rng.randrange(1 << 30)).normal(0, texture / 2, (h // 3 + 1, w // 3 + 1))
        base += np.asarray(Image.fromarray(fine.astype(np.float32), "F").resize((w, h), Image.BICUBIC))
    if noise:
        base += np.random.default_rng(rng.randrange(1 << 30)).normal(0, noise, (h, w))
    return base


def finish(base, rng, fmt="JPEG"):
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "L")
    img = img.filter(ImageFilter.GaussianBlur(0.7))
    img = img.convert("RGB")
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 88} if fmt == "JPEG" else {}))
    return out.getvalue()


def draw_on(base, paint):
    """paint(draw, img) on an 'L' layer of ink darkness (0 none .. 255 full), then applied."""
    h, w = base.shape
    layer = Image.new("L", (w, h), 0)
    paint(ImageDraw.Draw(layer), layer)
    return layer


def apply_ink(base, layer, ink_level):
    """Ink of grey `ink_level` where the layer says, in proportion."""
    alpha = np.asarray(layer, np.float32) / 255
    return base * (1 - alpha) + ink_level * alpha


# ---- pages to skip ----------------------------------------------------------------------------

def white(seed, size=A4_300):
    rng = random.Random(seed)
    return finish(paper(rng, size, tone=rng.randrange(245, 256)), rng)


def scanner_noise(seed, size=A4_300):
    rng = random.Random(seed)
    return finish(paper(rng, size, noise=rng.uniform(3, 7)), rng)


def paper_texture(seed, size=A4_300):
    rng = random.Random(seed)
    return finish(paper(rng, size, tone=rng.randrange(215, 240), texture=rng.uniform(3, 6), noise=2), rng)


def dark_border(seed, size=A4_300):
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    layer = Image.new("L", size, 0)
    d = ImageDraw.Draw(layer)
    for side in rng.sample(["left", "right", "top", "bottom"], rng.randrange(1, 5)):
        depth, skew = int(rng.uniform(0.01, 0.06) * (w if side in ("left", "right") else h)), rng.randrange(0, 40)
        if side == "left":
            d.polygon([(0, 0), (depth, 0), (depth + skew, h), (0, h)], fill=255)
        elif side == "right":
            d.polygon([(w, 0), (w - depth - skew, 0), (w - depth, h), (w, h)], fill=255)
        elif side == "top":
            d.polygon([(0, 0), (w, 0), (w, depth + skew), (0, depth)], fill=255)
        else:
            d.polygon([(0, h), (w, h), (w, h - depth), (0, h - depth - skew)], fill=255)
    return finish(apply_ink(base, layer, rng.randrange(10, 60)), rng)


SKIP = {"white paper": white, "scanner noise": scanner_noise, "paper texture": paper_texture,
        "dark scan border": dark_border}


# ---- pages to send ----------------------------------------------------------------------------

def font(px):
    return ImageFont.load_default(size=px)


def page_number(seed, size=A4_300):
    """A lone page number, 9-10 pt, at the foot or the head of the page."""
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    px = int(rng.uniform(9, 10) / 72 * 300)
    layer = Image.new("L", size, 0)
    y = rng.choice([int(h * 0.95), int(h * 0.04)])
    ImageDraw.Draw(layer).text((rng.randrange(int(w * 0.1), int(w * 0.85)), y), str(rng.randrange(1, 400)),
                               fill=255, font=font(px))
    return finish(apply_ink(base, layer, rng.randrange(20, 70)), rng)


def pencil_line(seed, size=A4_300):
    """One faint pencil line: 2-3 px, 40-60 grey levels below the paper."""
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    layer = Image.new("L", size, 0)
    x0, y0 = rng.randrange(w // 10, w // 2), rng.randrange(h // 10, h * 9 // 10)
    length = rng.randrange(w // 5, w // 2)
    ImageDraw.Draw(layer).line([(x0, y0), (x0 + length, y0 + rng.randrange(-60, 60))],
                               fill=255, width=rng.randrange(2, 4))
    tone = base.mean() - rng.uniform(40, 60)
    return finish(apply_ink(base, layer, tone), rng)


def light_small_text(seed, size=A4_300):
    """A few lines of 6-7 pt text in light grey (90-110 levels below the paper)."""
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    px = int(rng.uniform(6, 7) / 72 * 300)
    layer = Image.new("L", size, 0)
    d = ImageDraw.Draw(layer)
    y = rng.randrange(h // 5, h * 3 // 4)
    for i in range(rng.randrange(1, 4)):
        d.text((w // 10, y + i * px * 2), "printed in a light grey, small " * 2, fill=255, font=font(px))
    return finish(apply_ink(base, layer, base.mean() - rng.uniform(90, 110)), rng)


def light_watermark(seed, size=A4_300):
    """A large diagonal word in a light grey (20-30 levels below the paper)."""
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    layer = Image.new("L", (w, w), 0)
    ImageDraw.Draw(layer).text((w // 10, w // 3), rng.choice(["DRAFT", "COPY", "CONFIDENTIAL"]),
                               fill=255, font=font(w // 7))
    layer = layer.rotate(rng.randrange(30, 60)).resize((w, h))
    return finish(apply_ink(base, layer, base.mean() - rng.uniform(20, 30)), rng)


SEND = {"lone page number": page_number, "one faint pencil line": pencil_line,
        "light small text": light_small_text, "light watermark": light_watermark}


def bleed_through(seed, size=A4_300):
    """The other side's text showing through: mirrored, blurred, 10-25 levels below the paper."""
    rng = random.Random(seed)
    base = paper(rng, size, noise=3)
    w, h = size
    layer = Image.new("L", size, 0)
    d = ImageDraw.Draw(layer)
    for y in range(h // 10, h * 9 // 10, h // 50):
        d.text((w // 10, y), "the text of the other side of the leaf " * 3, fill=255, font=font(h // 90))
    layer = layer.transpose(Image.FLIP_LEFT_RIGHT).filter(ImageFilter.GaussianBlur(3))
    return finish(apply_ink(base, layer, base.mean() - rng.uniform(25, 60)), rng)
