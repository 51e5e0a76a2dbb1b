"""Keep the copied helper blocks identical across the scripts.

    python tools/sync_helpers.py --check            # exit 1 and name the scripts that differ
    python tools/sync_helpers.py FROM_SCRIPT        # copy FROM_SCRIPT's blocks into every other

Each script is fetched and run alone by URL, so the helpers are copied, not imported. A block
runs from its BEGIN marker line to its END marker line, both included.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = ("COMMON HELPERS", "SERVER HELPERS", "OFFLINE HELPERS")


def block_pattern(name: str) -> re.Pattern:
    return re.compile(rf"^# ==== BEGIN {name}\b.*?^# ==== END {name} ====$", re.S | re.M)


def extract(text: str, name: str) -> str | None:
    match = block_pattern(name).search(text)
    return match.group(0) if match else None


# A top-level tool of the collection (ocr-compare.py) carries this line and no helper blocks:
# it is neither checked nor written to. tests/conftest.py reads the same marker.
TOOL_MARKER = re.compile(r'^SCRIPT_KIND = "tool"$', re.M)


def scripts() -> list[Path]:
    """The model scripts: every top-level script but the tools."""
    return sorted(p for p in ROOT.glob("*.py") if not TOOL_MARKER.search(p.read_text()))


def differences() -> list[str]:
    problems = []
    for name in BLOCKS:
        copies = {p.name: extract(p.read_text(), name) for p in scripts()}
        present = {k: v for k, v in copies.items() if v is not None}
        if not present:
            continue
        variants = sorted(set(present.values()), key=lambda v: -list(present.values()).count(v))
        if len(variants) > 1:
            majority = variants[0]
            odd = [k for k, v in present.items() if v != majority]
            problems.append(f"{name}: {', '.join(odd)} differ from the other copies")
    return problems


def propagate(source: Path) -> list[str]:
    text = source.read_text()
    changed = []
    for name in BLOCKS:
        block = extract(text, name)
        if block is None:
            continue
        for target in scripts():
            if target == source:
                continue
            target_text = target.read_text()
            if extract(target_text, name) is None:
                continue  # this script does not carry this block (offline scripts: no server block)
            new_text = block_pattern(name).sub(lambda _m: block, target_text, count=1)
            if new_text != target_text:
                target.write_text(new_text)
                changed.append(f"{target.name} ({name})")
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help="script whose blocks are copied to the others")
    parser.add_argument("--check", action="store_true", help="only report differing copies")
    args = parser.parse_args()
    if args.check or not args.source:
        problems = differences()
        for line in problems:
            print(line)
        print("helper blocks identical" if not problems else "run: python tools/sync_helpers.py SCRIPT")
        return 1 if problems else 0
    changed = propagate(ROOT / args.source)
    print("updated: " + ", ".join(changed) if changed else "every copy already matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
