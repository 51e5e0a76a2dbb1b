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

A large block is a package of blocks/ (blocks/common/, blocks/server/): modules of one concern
each, which its __init__.py names in order (MODULES) under the block's name (BLOCK). The block is
its modules joined, each under a banner line (`# ---- name.py: ` and its docstring's first line),
each without its docstring and the imports below it (those say, for ruff and the tests, where
each name comes from). The block's own imports, once for all its modules, open its first module
below a comment line; ruff, on every script, finds one missing or unused.
"""

from __future__ import annotations

import argparse
import ast
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
    """Block name -> the module of blocks/ that holds it, or the package whose modules it joins."""
    modules = {begin.group(1): module for module in sorted(BLOCKS_DIR.glob("*.py"))
               if (begin := BEGIN.search(module.read_text()))}
    return modules | {package_layout(package)[0]: package for package in packages()}


def packages() -> list[Path]:
    return sorted(init.parent for init in BLOCKS_DIR.glob("*/__init__.py"))


def package_layout(package: Path) -> tuple[str, list[str]]:
    """A package's block name and its modules in order, from its __init__.py."""
    values = {node.targets[0].id: ast.literal_eval(node.value)
              for node in ast.parse((package / "__init__.py").read_text()).body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    return values["BLOCK"], values["MODULES"]


BANNER = re.compile(r"^# ---- (\w+)\.py: .*\n", re.M)


def split_module(path: Path) -> tuple[str, str, str]:
    """(the first line of its docstring, its header: docstring and imports from blocks/, its body)."""
    text = path.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    if not doc:
        sys.exit(f"{path.relative_to(ROOT)}: a module of a block opens with a docstring whose "
                 f"first line says what it is responsible for")
    lines = text.splitlines(keepends=True)
    end = tree.body[0].end_lineno
    for node in tree.body[1:]:  # the imports right below the docstring, up to a comment line
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or any(
                line.startswith("#") for line in lines[end:node.lineno - 1]):
            break
        end = node.end_lineno
    return doc.splitlines()[0], "".join(lines[:end]), "".join(lines[end:]).strip("\n") + "\n"


def package_source(package: Path) -> str:
    name, modules = package_layout(package)
    where = f"blocks/{package.name}/"
    parts = [block_imports(package)]
    for module in modules:
        first_line, _, body = split_module(package / f"{module}.py")
        parts.append(f"# ---- {module}.py: {first_line}\n\n{body}")
    return (f"# ==== BEGIN {name} (edit {where}, then run tools/sync_helpers.py) ====\n"
            + "\n\n".join(parts) + f"\n# ==== END {name} ====\n")


def block_imports(package: Path) -> str:
    """The package's __init__.py from below its docstring to its BLOCK line: the block's imports."""
    text = (package / "__init__.py").read_text()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    block_line = next(node.lineno for node in tree.body if isinstance(node, ast.Assign)
                      and getattr(node.targets[0], "id", "") == "BLOCK")
    return "".join(lines[tree.body[0].end_lineno:block_line - 1]).strip("\n") + "\n"


def adopt_package(package: Path, block: str) -> list[str]:
    """Write each module's part of a script's copy of a package's block back into the module."""
    chunks = BANNER.split(block.split("\n", 1)[1].rsplit("# ==== END", 1)[0])
    init, changed = package / "__init__.py", []
    text, imports = init.read_text(), block_imports(package)
    if chunks[0].strip("\n") + "\n" != imports:
        init.write_text(text.replace(imports, chunks[0].strip("\n") + "\n", 1))
        changed.append(str(init.relative_to(ROOT)))
    chunks = chunks[1:]
    for module, body in zip(chunks[::2], chunks[1::2]):
        path = package / f"{module}.py"
        if not path.exists():
            sys.exit(f"no module {path.relative_to(ROOT)} for the banner of {module}.py")
        _, header, _ = split_module(path)
        new = header.rstrip("\n") + "\n\n" + body.strip("\n") + "\n"
        if new != path.read_text():
            path.write_text(new)
            changed.append(str(path.relative_to(ROOT)))
    return changed


def block_sources() -> dict[str, str]:
    """Block name -> its text, from every module of blocks/ that holds a block."""
    sources = {package_layout(package)[0]: package_source(package) for package in packages()}
    for module in block_modules().values():
        if module.is_dir():
            continue
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
        if module.is_dir():
            changed += adopt_package(module, block.group(0))
            continue
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
