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

Writing and --check also refuse a script whose model section (its own text and its model parts,
`BEGIN ... MODEL`) lacks a name blocks/model.py requires of its shape, naming it; and write,
below each script's docstring, its map: the model section, each block and module, main(), and
the functions a page passes through (PAGE_PATH), with their lines in the script.
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
        parts.append(f"# ---- {module}.py: {first_line}\n{body}")
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


class Refused(Exception):
    """What stops the assembler for one script: each argument a line to print after its name."""


def assemble(text: str, sources: dict[str, str]) -> str:
    """The script text with each of its blocks replaced by its source, and its map rewritten."""
    text = MAP.sub("", text, count=1)
    for name in BEGIN.findall(text):
        if name not in sources:
            raise Refused(f"no module of blocks/ holds the block {name}")
        text, found = block_pattern(name).subn(lambda _m: sources[name], text, count=1)
        if not found:
            raise Refused(f"its BEGIN {name} line has no END {name} ==== line after it")
    lacking = lacking_model_names(text)
    if lacking:
        raise Refused(*(f"its model section lacks {name} (blocks/model.py: {comment})"
                        for name, comment in lacking.items()))
    return with_map(text)


# blocks/model.py's groups of names (the comment line that opens each) and the shapes they are for
MODEL_GROUPS = {"Every script": {"server", "saturate", "offline"},
                "Server scripts": {"server", "saturate"}, "Offline scripts": {"offline"}}


def names_model_py_requires(shape: str | None) -> dict[str, str]:
    """blocks/model.py's names for a script of this shape (None: unknown, the names every script
    needs), each with its comment (a function's: its docstring's first line)."""
    source = (BLOCKS_DIR / "model.py").read_text()
    lines = source.splitlines()
    groups = [(number, name) for number, line in enumerate(lines, 1)
              for name in MODEL_GROUPS if line.startswith(f"# {name}")]
    required = {}
    for node in ast.parse(source).body:
        group = [name for number, name in groups if number < node.lineno][-1:]
        if group and (shape in MODEL_GROUPS[group[0]] or group[0] == "Every script"):
            required |= dict.fromkeys(bound_names(node), name_comment(node, lines))
    return required


def bound_names(node: ast.stmt) -> set[str]:
    """The top-level names a statement defines: a function, a class, an assignment's targets."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
    return {target.id for target in targets if isinstance(target, ast.Name)}


def name_comment(node: ast.stmt, lines: list[str]) -> str:
    """What blocks/model.py says of a name: a function's docstring's first line; an assignment's
    comment on its line and the comment lines right below it."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return (ast.get_docstring(node) or "").split("\n")[0]
    _, _, comment = lines[node.end_lineno - 1].partition("  # ")
    said = [comment] if comment else []
    for line in lines[node.end_lineno:] if said else []:
        if not line.startswith("#"):
            break
        said.append(line.lstrip("# "))
    return " ".join(said)


def own_text(text: str) -> str:
    """A script without its helper blocks: its header, docstring, model section (with the part
    it shares with its model's other script, BEGIN ... MODEL) and main()."""
    for name in BEGIN.findall(text):
        if not name.endswith(" MODEL"):
            text = block_pattern(name).sub("", text, count=1)
    return text


def model_section_names(text: str) -> set[str]:
    """The top-level names a script defines outside its helper blocks."""
    return {name for node in ast.parse(own_text(text)).body for name in bound_names(node)}


def script_shape(text: str) -> str | None:
    """The SCRIPT_SHAPE a script's model section sets, if it sets one."""
    for node in ast.parse(own_text(text)).body:
        if "SCRIPT_SHAPE" in bound_names(node) and isinstance(node.value, ast.Constant):
            return node.value.value
    return None


def lacking_model_names(text: str) -> dict[str, str]:
    """The names blocks/model.py requires of the script's shape that its model section lacks,
    each with what blocks/model.py says of it."""
    required = names_model_py_requires(script_shape(text))
    defined = model_section_names(text)
    return {name: comment for name, comment in sorted(required.items()) if name not in defined}


MAP_BEGIN, MAP_END = "# ==== MAP (written by tools/sync_helpers.py) ====", "# ==== END MAP ===="
MAP = re.compile(rf"(?:^\n)?^{re.escape(MAP_BEGIN)}\n.*?^{re.escape(MAP_END)}\n", re.S | re.M)

# A page's path through a script, for its map: each step and the functions that take it, in a
# server or saturate script and in an offline one (`Class.method` for a method). The assembler
# refuses a script that lacks one: a function renamed in blocks/ is renamed here too.
PAGE_PATH = {
    "cell": (["iter_image_cells"], ["iter_image_cells"]),
    "prepared page": (["read_page", "prepare_page"], ["read_page", "prepare_page"]),
    "request": (["request_body"], ["generate_batch"]),
    "answer": (["send_page", "read_completion"], ["generate_batch"]),
    "finished row": (["finish_row"], ["finish_row"]),
    "journal": (["Journal.append"], ["Journal.append"]),
    "part": (["write_part"], ["write_part"]),
    "commit": (["OutputStore.publish", "OutputStore.commit"],) * 2,
    "card": (["build_card"], ["build_card"]),
}
MODULES_A_LINE = 3


def with_map(text: str) -> str:
    """The script with its map below its docstring, its line numbers those of the result."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise Refused(f"line {error.lineno}: {error.msg}") from None
    if not (tree.body and isinstance(tree.body[0], ast.Expr)
            and isinstance(tree.body[0].value, ast.Constant)):
        raise Refused("no docstring for the map to follow")
    below = tree.body[0].end_lineno
    lines = text.splitlines(keepends=True)
    size = len(map_lines(text, tree, 0)) + 1  # the map and the blank line above it
    page_map = "\n" + "\n".join(map_lines(text, tree, size)) + "\n"
    return "".join(lines[:below]) + page_map + "".join(lines[below:])


def map_lines(text: str, tree: ast.Module, shift: int) -> list[str]:
    return [MAP_BEGIN, "# Its parts (edit a block in its source, then run the assembler):",
            *part_lines(text, tree, shift),
            "# A page's path, by the functions that take it:",
            *path_lines(tree, script_shape(text), shift), MAP_END]


def part_lines(text: str, tree: ast.Module, shift: int) -> list[str]:
    """The model section, each block (its source, its modules) and main(), in the script's order."""
    lines = text.splitlines()
    starts = [(number, f"model section  L{number + shift}")
              for number, line in enumerate(lines, 1) if line.startswith("# Model section")][:1]
    for begin in BEGIN.finditer(text):
        first = text.count("\n", 0, begin.start()) + 1
        end = first + block_pattern(begin.group(1)).search(text, begin.start()).group(0).count("\n")
        source = re.findall(r"blocks/[\w/.]*", lines[first - 1])[:1]
        where = [begin.group(1), *source, f"L{first + shift}-{end - 1 + shift}"]
        starts.append((first, "  ".join(where)))
        starts += [(first, line) for line in module_lines(lines[first:end - 1], first, shift)]
    mains = [node.lineno for node in tree.body if isinstance(node, ast.FunctionDef)
             and node.name == "main"]
    starts += [(number, f"main()  L{number + shift}") for number in mains[-1:]]
    return [f"#   {entry}" for _, entry in sorted(starts, key=lambda start: start[0])]


def module_lines(block: list[str], first: int, shift: int) -> list[str]:
    """A package's modules, by their banners: `name.py L123`, a few to a line."""
    cells = [f"{banner.group(1)}.py L{first + offset + 1 + shift}"
             for offset, line in enumerate(block) if (banner := BANNER.match(line + "\n"))]
    width = max(map(len, cells), default=0) + 2
    return ["  " + "".join(cell.ljust(width) for cell in cells[i:i + MODULES_A_LINE]).rstrip()
            for i in range(0, len(cells), MODULES_A_LINE)]


def path_lines(tree: ast.Module, shape: str | None, shift: int) -> list[str]:
    defs = def_lines(tree)
    width = max(map(len, PAGE_PATH)) + 2
    lines = []
    for step, (server, offline) in PAGE_PATH.items():
        names = offline if shape == "offline" else server
        missing = [name for name in names if name not in defs]
        if missing:
            raise Refused(f"the map's step {step!r} names {', '.join(missing)}, which the script "
                          f"does not define (PAGE_PATH in tools/sync_helpers.py)")
        where = ", ".join(f"{name} L{defs[name] + shift}" for name in names)
        lines.append(f"#   {step.ljust(width)}{where}")
    return lines


def def_lines(tree: ast.Module) -> dict[str, int]:
    """Each top-level function and class, and each method as Class.method -> its def line (the
    last definition of a name: the one that runs)."""
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node.lineno
        for method in node.body if isinstance(node, ast.ClassDef) else []:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[f"{node.name}.{method.name}"] = method.lineno
    return defs


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


def assemble_all(sources: dict[str, str]) -> dict[Path, str] | None:
    """Each script -> what its sources assemble to; None, each refusal printed, if one is refused."""
    assembled, refused = {}, []
    for script in scripts():
        try:
            assembled[script] = assemble(script.read_text(), sources)
        except Refused as problem:
            refused += [f"{script.name}: {line}" for line in problem.args]
    if refused:
        print("\n".join(refused))
        return None
    return assembled


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
    assembled = assemble_all(sources)
    if assembled is None:
        return 1
    stale = [script for script, text in assembled.items() if text != script.read_text()]
    if args.check:
        for script in stale:
            print(f"{script.name} differs from what its sources assemble to")
        print("run: python tools/sync_helpers.py (after an edit in blocks/), or python "
              "tools/sync_helpers.py SCRIPT (after an edit of SCRIPT's blocks, e.g. by a merge: "
              "a bare run would put the sources back over it)" if stale
              else "every script matches its sources")
        return 1 if stale else 0
    for script in stale:
        script.write_text(assembled[script])
    print("assembled: " + ", ".join(script.name for script in stale) if stale
          else "every script already matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
