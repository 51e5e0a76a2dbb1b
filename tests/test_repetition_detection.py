"""Repetition detection never cuts a legitimately repetitive page (issue #29, item 2).

tests/repetitive_pages.py holds the pages (blank forms up to 60 identical rows, separator rows,
LaTeX arrays, dot leaders, ruled lines, number columns, running headers); each script's
REPETITION_DETECTION (P, C) goes, with every page tokenized three tokenizer-independent ways,
through vLLM's own check_sequence_repetition in the CPU engine's environment (no engine is
started: the function is imported). The margin is stated in units no tokenizer changes:
identical rows, and characters in a run counted one token each.
"""

from __future__ import annotations

import json
import subprocess

from conftest import SERVER_SCRIPTS, TESTS, load_script
from engine import engine_or_skip
import engine_env
import repetitive_pages

SCRIPTS = sorted({*SERVER_SCRIPTS, "ovis-ocr2.py", "lighton-ocr3.py"})


def engine_check(*numbers: int) -> dict:
    engine_or_skip()
    run = subprocess.run([str(engine_env.python()), str(TESTS / "repetitive_pages.py"),
                          *map(str, numbers)], capture_output=True, text=True, timeout=900,
                         env=engine_env.engine_environ())
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_no_script_cuts_a_legitimately_repetitive_page_and_the_fixture_binds():
    chosen = {tuple(load_script(s).REPETITION_DETECTION) for s in SCRIPTS}
    report = engine_check(*[n for pc in sorted(chosen) for n in pc], 32, repetitive_pages.ROWS)
    for p, c in chosen:
        result = report[f"{p}:{c}"]
        assert result["cut"] == {}, (p, c, result["cut"])
        # the margin: C above the most identical rows (or characters in a run) a page holds
        assert result["least_safe_min_count"] == repetitive_pages.ROWS + 1 <= c
    # one C lower and the fixture's blank forms, ruled lines and zero columns are cut
    cut = report[f"32:{repetitive_pages.ROWS}"]["cut"]
    for page in ("markdown blank form, 60 empty rows / a token per line",
                 "html blank form, 60 empty rows (one line) / a token per tag, word or mark",
                 "ruled lines, 60 characters / a token per character",
                 "column of zeros / a token per line"):
        assert page in cut, sorted(cut)
