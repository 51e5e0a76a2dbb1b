"""Assemble the scripts from their sources: the blocks in blocks/ and each script's own parts.

    python tools/sync_helpers.py            # write every script its sources assemble to
    python tools/sync_helpers.py --check    # exit 1 and name the scripts that differ
    python tools/sync_helpers.py SCRIPT     # take SCRIPT's blocks as their sources, then write
                                            # (for an edit made in a script, e.g. in a merge)

Writing never discards an edit made in a script: when one script's copy of a block differs from
the other scripts' copies, it writes nothing and names the script.

Each script is fetched and run alone by URL, so the blocks are copied into it, not imported
(SQLite's amalgamation: developers edit many files, users get one). A module of blocks/ holds
one block, from its `# ==== BEGIN NAME` line to its `# ==== END NAME ====` line; what comes
before that line (the docstring, the imports that tell ruff where names come from) stays out of
the scripts. A script carries the blocks whose BEGIN/END lines it has, each replaced whole by
its module's; the rest of the script (header, docstring, model section, main) is its own.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKS_DIR = ROOT / "blocks"
BEGIN = re.compile(r"^# ==== BEGIN ([A-Z0-9 -]+?) [(=]", re.M)


def block_pattern(name: str) -> re.Pattern:
    return re.compile(rf"^# ==== BEGIN {re.escape(name)} .*?^# ==== END {re.escape(name)} ====\n",
                      re.S | re.M)


def block_modules() -> dict[str, Path]:
    """Block name -> the module of blocks/ that holds it."""
    return {begin.group(1): module for module in sorted(BLOCKS_DIR.glob("*.py"))
            if (begin := BEGIN.search(module.read_text()))}


def block_sources() -> dict[str, str]:
    """Block name -> its text, from every module of blocks/ that holds a block."""
    sources = {}
    for module in block_modules().values():
        text = module.read_text()
        begin = BEGIN.search(text)
        block = block_pattern(begin.group(1)).search(text, begin.start())
        if block is None or block.end() != len(text):
            sys.exit(f"{module.relative_to(ROOT)}: the block must run from its BEGIN line to an "
                     f"END {begin.group(1)} ==== line that ends the file")
        sources[begin.group(1)] = block.group(0)
    return sources


# A top-level tool of the collection (ocr-compare.py) carries this line and no helper blocks:
# it is neither checked nor written to. tests/conftest.py reads the same marker.
TOOL_MARKER = re.compile(r'^SCRIPT_KIND = "tool"$', re.M)


def scripts() -> list[Path]:
    """The model scripts: every top-level script but the tools."""
    return sorted(p for p in ROOT.glob("*.py") if not TOOL_MARKER.search(p.read_text()))


def assemble(text: str, sources: dict[str, str]) -> str:
    """The script text with each of its blocks replaced by its source."""
    for name in BEGIN.findall(text):
        if name not in sources:
            raise KeyError(f"no module of blocks/ holds the block {name}")
        text, found = block_pattern(name).subn(lambda _m: sources[name], text, count=1)
        if not found:
            raise KeyError(f"its BEGIN {name} line has no END {name} ==== line after it")
    return text


def adopt(script: Path) -> list[str]:
    """Write each block of `script` into its module, the part above its BEGIN line kept."""
    text, modules, changed = script.read_text(), block_modules(), []
    for name in BEGIN.findall(text):
        block = block_pattern(name).search(text)
        if block is None:
            sys.exit(f"{script.name}: its BEGIN {name} line has no END {name} ==== line after it")
        if name not in modules:
            sys.exit(f"{script.name}: no module of blocks/ holds the block {name}")
        module = modules[name]
        source = module.read_text()
        new = source[:BEGIN.search(source).start()] + block.group(0)
        if new != source:
            module.write_text(new)
            changed.append(str(module.relative_to(ROOT)))
    return changed


def edited_copies(texts: dict[str, str], sources: dict[str, str]) -> list[tuple[str, str]]:
    """(script, block) for each copy of a block that differs from its source where the scripts
    carrying that block do not all hold the same copy: an edit made in that script (or a copy
    of a script for a new model, edited in a part it shares with its model's other script)."""
    copies: dict[str, dict[str, list[str]]] = {}
    for script, text in texts.items():
        for name in BEGIN.findall(text):
            copy = block_pattern(name).search(text)
            if copy and copy.group(0).count("\n") > 2:  # BEGIN and END alone: a block to fill in
                copies.setdefault(name, {}).setdefault(copy.group(0), []).append(script)
    return [(script, name) for name, by_copy in copies.items() if len(by_copy) > 1
            for copy, holders in by_copy.items() if copy != sources.get(name)
            for script in holders]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a script differs from its sources")
    parser.add_argument("script", nargs="?", type=Path,
                        help="a script whose blocks were edited: they become the sources")
    args = parser.parse_args()
    if args.script and args.script.name not in {s.name for s in scripts()}:
        parser.error(f"{args.script}: not a model script of {ROOT}")
    if args.script and not args.check:
        changed = adopt(ROOT / args.script.name)
        print("sources taken from " + args.script.name + ": " + (", ".join(changed) or "none changed"))
    sources = block_sources()
    edited = [] if args.script or args.check else \
        edited_copies({s.name: s.read_text() for s in scripts()}, sources)
    for script, name in edited:
        print(f"{script}: its {name} block differs from the other scripts' copies: an edit made in "
              f"the script, which writing would discard. Keep it for every script that carries "
              f"the block: python tools/sync_helpers.py {script}; drop it: git checkout {script}; "
              f"in a script copied for a new model, delete the block's BEGIN and END lines "
              f"to make a model part the script's own.")
    if edited:
        return 1
    stale = []
    for script in scripts():
        text = script.read_text()
        try:
            assembled = assemble(text, sources)
        except KeyError as problem:
            print(f"{script.name}: {problem.args[0]}")
            return 1
        if assembled != text:
            stale.append(script.name)
            if not args.check:
                script.write_text(assembled)
    if args.check:
        for name in stale:
            print(f"{name} differs from what its sources assemble to")
        print("run: python tools/sync_helpers.py (after an edit in blocks/), or python "
              "tools/sync_helpers.py SCRIPT (after an edit of SCRIPT's blocks, e.g. by a merge: "
              "a bare run would put the sources back over it)" if stale
              else "every script matches its sources")
        return 1 if stale else 0
    print("assembled: " + ", ".join(stale) if stale else "every script already matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
