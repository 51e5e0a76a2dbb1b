"""Regenerate the README's script table from models.json.

    python tools/render_readme.py           # rewrite README.md between the table markers
    python tools/render_readme.py --check   # exit 1 if README.md is stale

The table is generated, never edited by hand: tests/test_registry.py fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- BEGIN SCRIPT TABLE (tools/render_readme.py) -->", "<!-- END SCRIPT TABLE -->"


def table() -> str:
    registry = json.loads((ROOT / "models.json").read_text())
    lines = ["| script | model | shape | image | flavor | context (max_model_len / max_tokens) | prefix caching |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for entry in registry["scripts"]:
        image = entry["image"]
        notes = ([] if len(image) < 40 else ["vendor image"]) + (["moving tag"] if entry["image_tag_moving"] else [])
        image = f"`{image if len(image) < 40 else image.split('/')[-1]}`" + (f" ({', '.join(notes)})" if notes else "")
        lines.append(
            f"| [`{entry['script']}`]({entry['script']}) | [{entry['model']}](https://huggingface.co/{entry['model']}) "
            f"({entry['parameters']}, {entry['license']}) | {entry['shape']} | {image} | "
            f"`{entry['flavor']}` | {entry['max_model_len']:,} / {entry['max_tokens']:,} | "
            f"{'on' if entry['prefix_caching'] else 'off'} |")
    return "\n".join(lines)


def render(readme: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    path = ROOT / "README.md"
    current = path.read_text()
    fresh = render(current)
    if "--check" in sys.argv:
        if fresh != current:
            print("README.md's script table is stale: run python tools/render_readme.py")
            return 1
        print("README.md's script table matches models.json")
        return 0
    path.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
