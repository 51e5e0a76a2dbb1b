"""blocks/patch_grid.py against the processor it stands for: transformers' own Qwen2-VL
`smart_resize`, run in the CPU engine's environment (no engine is started)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from blocks import patch_grid  # noqa: E402
from engine import engine_or_skip  # noqa: E402
import engine_env  # noqa: E402

# (factor, min_pixels, max_pixels) of the models MODEL-FACTS "Candidate models" lists:
# GLM-OCR per frame (12,544 / 9,633,792 over 2 frames), PaddleOCR-VL's pipeline, dots.mocr's
# parser constants, and a bound with no floor
BOUNDS = [(28, 6272, 4816896), (28, 112896, 1003520), (28, 3136, 11289600), (32, 0, 8294400)]

SMART_RESIZE = """
import json, sys
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
cases = json.loads(sys.argv[1])
print(json.dumps([list(smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi))
                  for w, h, f, lo, hi in cases]))
"""


def sample_pages(seed: int = 7, count: int = 300) -> list[tuple[int, int]]:
    """Page sizes from thumbnails to 600 dpi scans, portrait and landscape, aspect under 200."""
    rng = random.Random(seed)
    pages = [(rng.randint(40, 7200), rng.randint(40, 9600)) for _ in range(count)]
    return pages + [(1700, 2200), (2480, 3508), (6000, 4000), (28, 28), (100, 5000)]


def test_the_grid_size_is_the_processors_own():
    engine_or_skip()
    cases = [(w, h, f, lo, hi) for w, h in sample_pages() for f, lo, hi in BOUNDS]
    run = subprocess.run([str(engine_env.python()), "-c", SMART_RESIZE, json.dumps(cases)],
                         capture_output=True, text=True, env=engine_env.engine_environ(), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = json.loads(run.stdout.strip().splitlines()[-1])
    mismatches = [(case, (h, w), patch_grid.snap_to_patch_grid(*case))
                  for case, (h, w) in zip(cases, expected)
                  if patch_grid.snap_to_patch_grid(*case) != (w, h)]
    assert not mismatches, mismatches[:5]


@pytest.mark.parametrize("factor,min_pixels,max_pixels", BOUNDS)
def test_no_page_takes_more_tokens_than_the_bound(factor, min_pixels, max_pixels):
    bound = patch_grid.max_patch_grid_tokens(max_pixels, factor)
    for width, height in sample_pages():
        size = patch_grid.snap_to_patch_grid(width, height, factor, min_pixels, max_pixels)
        assert patch_grid.patch_grid_tokens(*size, factor) <= bound


def test_glm_ocrs_two_frames_give_its_documented_ceiling():
    """MODEL-FACTS, GLM-OCR: longest_edge 9,633,792 px over two frames, 28 px tokens: at most
    6,144 image tokens, reached by a 6000x4000 page (grid 128x192 of 14 px patches)."""
    max_pixels = patch_grid.per_frame(9633792, 2)
    assert patch_grid.max_patch_grid_tokens(max_pixels, 28) == 6144
    size = patch_grid.snap_to_patch_grid(6000, 4000, 28, patch_grid.per_frame(12544, 2), max_pixels)
    assert patch_grid.patch_grid_tokens(*size, 28) == 6144
