"""The GROUNDING HELPERS block of the scripts whose model answers with boxes (LightOnOCR-3 in
grounding mode, DeepSeek-OCR, HPD-Parsing): what their model sections share to parse them.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it.
"""

# ==== BEGIN GROUNDING HELPERS (edit blocks/grounding.py, then run tools/sync_helpers.py) ====
# For the model sections that parse boxes out of their model's answer.
def block_box(values, top: int) -> list[int] | None:
    """A parsed box as four ints in [0, top], or None (never an int32 overflow); never raises."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        return None
    if len(numbers) != 4 or not all(0 <= v <= top for v in numbers):  # NaN fails too
        return None
    return [int(v) for v in numbers]
# ==== END GROUNDING HELPERS ====
