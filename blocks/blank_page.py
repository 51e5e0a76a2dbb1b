"""The BLANK PAGE HELPERS block: whether a page holds any ink, judged from the page alone before
it is sent (a VLM given a blank page invents text, and every page costs a GPU request).

The rule, at a reduced scale (a JPEG is decoded at the scale its DCT gives, a fraction of a full
decode): the paper's own level is the 90th percentile of brightness over tiles, smoothed, so
paper tone, texture and uneven light are not ink; a pixel is ink when it is darker than the paper
by INK_CONTRAST grey levels and by NOISE_FACTOR times the page's own noise (robust: a median of
absolute deviations); dark runs that touch the image's edge (a scan's border, a gutter's shadow)
are not ink; an ink pixel counts when two of its neighbours are ink too (an isolated speck of
noise does not); a page with fewer than MIN_INK_PIXELS such pixels is blank. Pages made for it
(tests/blank_pages.py, seeds apart from the ones it was tuned on) and every page of the tests'
PDFs that has text check it (tests/test_blank_pages.py).

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it.
"""

# ==== BEGIN BLANK PAGE HELPERS (edit blocks/blank_page.py, then run tools/sync_helpers.py) ====
# Whether a page holds any ink (see blocks/blank_page.py for the rule and its tests).
BLANK_JUDGE_SIDE = 900  # a page is judged at most this long on its long side (A4 at 300 dpi: 1/4)
BLANK_TILE = 24  # the paper's level: the 90th percentile of brightness over tiles of this side
INK_CONTRAST = 8  # grey levels below the paper, at the judging scale, at the least
INK_NOISE_FACTOR = 7  # ... and this many times the page's own noise (paper texture, the sensor)
MIN_INK_PIXELS = 8  # fewer ink pixels than this (each with two ink neighbours): a blank page


def judging_grey(img):
    """The page as grey int16 at most BLANK_JUDGE_SIDE long; a JPEG decoded at a DCT scale."""
    import numpy as np

    scale = -(-max(img.size) // BLANK_JUDGE_SIDE)
    if scale > 1 and getattr(img, "format", None) == "JPEG":  # a loaded one ignores it
        img.draft("L", (-(-img.width // scale), -(-img.height // scale)))
    factor = -(-max(img.size) // BLANK_JUDGE_SIDE)
    small = img.reduce(factor) if factor > 1 else img  # before any copy: a giant scan stays cheap
    return np.asarray(small.convert("L"), dtype=np.int16)


def paper_level(grey):
    """The paper's brightness under each pixel: a tile's 90th percentile, smoothed between tiles."""
    import numpy as np
    from PIL import Image

    h, w = grey.shape
    rows, cols = -(-h // BLANK_TILE), -(-w // BLANK_TILE)
    padded = np.pad(grey, ((0, rows * BLANK_TILE - h), (0, cols * BLANK_TILE - w)), mode="edge")
    tiles = padded.reshape(rows, BLANK_TILE, cols, BLANK_TILE).transpose(0, 2, 1, 3)
    tiles = tiles.reshape(rows, cols, -1)
    k = tiles.shape[2] * 9 // 10
    level = np.partition(tiles, k, axis=2)[:, :, k].astype(np.float32)
    return np.asarray(Image.fromarray(level, mode="F").resize((w, h), Image.BILINEAR))


def edge_runs(dark, pad: int = 3):
    """The dark runs touching the edge, per row and column (a scan's border), widened by `pad`."""
    import numpy as np

    runs = np.zeros_like(dark)
    for src, dst in ((dark, runs), (dark[:, ::-1], runs[:, ::-1]), (dark.T, runs.T),
                     (dark.T[:, ::-1], runs.T[:, ::-1])):
        length = np.where(src.all(axis=1), src.shape[1], np.argmin(src, axis=1))
        length = np.where(length > 0, length + pad, 0)
        dst |= np.arange(src.shape[1])[None, :] < length[:, None]
    return runs


def ink_pixels(grey) -> int:
    """Pixels darker than the paper by more than its noise, in a stroke, not at the border."""
    import numpy as np

    level = paper_level(grey)
    below = level - grey
    sample = below[::3, ::3]  # the noise, from a ninth of the pixels: as good, and cheaper
    sigma = 1.4826 * np.median(np.abs(sample - np.median(sample)))
    threshold = max(INK_CONTRAST, INK_NOISE_FACTOR * sigma)
    ink = below > threshold
    if not ink.any():
        return 0
    ink &= ~edge_runs(grey < np.median(level[::8, ::8]) - threshold)
    padded = np.pad(ink, 1).astype(np.int8)
    rows = padded[:-2] + padded[1:-1] + padded[2:]
    box = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]  # the 3x3 sum, the pixel itself included
    return int(np.count_nonzero(ink & (box >= 3)))


def is_blank(img) -> bool:
    """No ink on the page (a PIL image, loaded or not): the rule above."""
    return ink_pixels(judging_grey(img)) < MIN_INK_PIXELS
# ==== END BLANK PAGE HELPERS ====
