"""The PATCH GRID HELPERS block: the image bound and token budget of processors that resize as
Qwen2-VL's does (`smart_resize`: both sides to a multiple of patch x merge, the area scaled into
[min_pixels, max_pixels]). GLM-OCR, PaddleOCR-VL, dots.mocr and olmOCR-2 (Qwen2.5-VL) resize
this way; a model section reads its processor's numbers off MODEL-FACTS and calls these, rather
than working the arithmetic out again from transformers' code.

    factor = patch_size * merge_size          # pixels per side of one image token: 14 * 2 = 28
    tokens = (width // factor) * (height // factor)   after the resize
    bound  = max_pixels // factor ** 2        # the most image tokens one image can take

A processor that counts a still image as `temporal_patch_size` frames (GLM-OCR: 2) applies its
pixel bounds to all frames together: divide them by that factor first (`per_frame`).

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it.
"""

import math

# ==== BEGIN PATCH GRID HELPERS (edit blocks/patch_grid.py, then run tools/sync_helpers.py) ====
# For the model sections whose processor resizes pages as Qwen2-VL's `smart_resize` does.
def per_frame(pixels: int, temporal_patch_size: int = 1) -> int:
    """A processor's pixel bound for one still image, when it counts the image as several frames."""
    return pixels // temporal_patch_size


def snap_to_patch_grid(width: int, height: int, factor: int, min_pixels: int = 0,
                       max_pixels: int | None = None) -> tuple[int, int]:
    """The size the processor resizes a width x height page to: each side rounded to a multiple
    of `factor`, then the area scaled down under max_pixels or up over min_pixels, keeping the
    aspect ratio. Sending a page at exactly this size means the server does not resample it."""
    new_w = max(factor, round(width / factor) * factor)
    new_h = max(factor, round(height / factor) * factor)
    if max_pixels and new_w * new_h > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        new_w = max(factor, math.floor(width / beta / factor) * factor)
        new_h = max(factor, math.floor(height / beta / factor) * factor)
    elif new_w * new_h < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        new_w = math.ceil(width * beta / factor) * factor
        new_h = math.ceil(height * beta / factor) * factor
    return new_w, new_h


def patch_grid_tokens(width: int, height: int, factor: int) -> int:
    """Image tokens of a page already on the grid (snap_to_patch_grid's size)."""
    return (width // factor) * (height // factor)


def max_patch_grid_tokens(max_pixels: int, factor: int) -> int:
    """The most image tokens one page can take under max_pixels: the context check's bound."""
    return max_pixels // (factor * factor)
# ==== END PATCH GRID HELPERS ====
