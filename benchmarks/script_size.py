"""Each model script's size after its model section (main() and the helper blocks: what a user
copies but does not edit), now and at a git ref, side by side. Issue #43's budget: no growth.

    python benchmarks/script_size.py --baseline c6ff1f5
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the first line past the model section: a helper or main block's BEGIN line, or `def main(`
PAST_MODEL = re.compile(r"^(# ==== BEGIN [A-Z0-9 -]+ (HELPERS|MAIN) |def main\()", re.M)


def after_model_section(text: str) -> tuple[int, int]:
    """(lines, bytes) from the end of the model section to the end of the script."""
    tail = text[PAST_MODEL.search(text).start():]
    return tail.count("\n"), len(tail.encode())


def scripts_at(ref: str | None) -> dict[str, str]:
    if ref is None:
        return {p.name: p.read_text() for p in sorted(ROOT.glob("*.py"))
                if 'SCRIPT_KIND = "tool"' not in p.read_text()}
    names = subprocess.run(["git", "ls-tree", "--name-only", ref], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    texts = {name: subprocess.run(["git", "show", f"{ref}:{name}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
             for name in names if name.endswith(".py")}
    return {name: text for name, text in texts.items() if 'SCRIPT_KIND = "tool"' not in text}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="GIT_REF", required=True)
    options = parser.parse_args()
    now, then = scripts_at(None), scripts_at(options.baseline)
    print(f"{'script':28} {'lines then':>10} {'lines now':>10} {'bytes then':>11} {'bytes now':>10}")
    grew = []
    for name in sorted(now):
        lines, size = after_model_section(now[name])
        if name not in then:
            print(f"{name:28} {'-':>10} {lines:>10} {'-':>11} {size:>10}")
            continue
        old_lines, old_size = after_model_section(then[name])
        print(f"{name:28} {old_lines:>10} {lines:>10} {old_size:>11} {size:>10}")
        if lines > old_lines or size > old_size:
            grew.append(name)
    print("grew: " + (", ".join(grew) if grew else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
