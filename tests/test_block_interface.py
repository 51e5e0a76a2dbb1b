"""The blocks meet the model section and each other only at run time (#43 item 4): no statement
that runs as a script loads reads a name defined further down, and the optional model-section
names the blocks read with `globals().get` are the ones blocks/model.py lists."""

from __future__ import annotations

import ast
import builtins
import re

import pytest

from conftest import ALL_SCRIPTS, ROOT

MODULE_NAMES = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__loader__"}


def _function_header(node) -> list[ast.AST]:
    """What runs where a def or lambda is: its decorators, defaults and annotations."""
    args = node.args
    parts = [*getattr(node, "decorator_list", []), *args.defaults,
             *[d for d in args.kw_defaults if d is not None]]
    if not isinstance(node, ast.Lambda):
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        parts += [a.annotation for a in every if a is not None and a.annotation is not None]
        parts += [node.returns] if node.returns else []
    return parts


def _reads(node, local: frozenset = frozenset()) -> list[tuple[int, str]]:
    """(line, name) of every name an expression or statement reads as it runs, not the bodies
    of the functions it defines; a comprehension's own variables are not reads."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return [read for part in _function_header(node) for read in _reads(part, local)]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        own = local | {n.id for gen in node.generators for n in ast.walk(gen.target)
                       if isinstance(n, ast.Name)}
        return [read for child in ast.iter_child_nodes(node) for read in _reads(child, own)]
    if isinstance(node, ast.Name):
        return [(node.lineno, node.id)] if isinstance(node.ctx, ast.Load) and \
            node.id not in local else []
    return [read for child in ast.iter_child_nodes(node) for read in _reads(child, local)]


def _defines(node) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)}
    names |= {n.name for n in ast.walk(node) if isinstance(n, ast.ExceptHandler) and n.name}
    return names | {n.name for n in ast.walk(node) if isinstance(n, (
        ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def forward_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every read, at load time, of a name not defined above it (nor a builtin)."""
    defined, found = set(MODULE_NAMES), []

    def check(statements, scope: set) -> None:
        for node in statements:
            if isinstance(node, ast.ClassDef):  # its body runs now, in its own namespace
                heads = [*node.decorator_list, *node.bases, *node.keywords]
                check(node.body, set(scope))
            elif isinstance(node, (ast.If, ast.Try, ast.For, ast.While, ast.With)):
                heads = [getattr(node, attr, None) for attr in ("test", "iter")]
                heads += [item.context_expr for item in getattr(node, "items", [])]
                heads += [handler.type for handler in getattr(node, "handlers", [])]
                scope |= _defines(node) if isinstance(node, (ast.For, ast.With)) else set()
                for handler in getattr(node, "handlers", []):
                    check(handler.body, scope | ({handler.name} if handler.name else set()))
                for body in ("body", "orelse", "finalbody"):
                    check(getattr(node, body, []), scope)
            else:
                heads = [node]
            found.extend(r for part in heads if part is not None for r in _reads(part)
                         if r[1] not in scope)
            scope |= _defines(node)

    check(ast.parse(source).body, defined)
    return found


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_no_statement_run_at_load_reads_a_name_defined_further_down(script):
    """A module-level statement (class bodies, decorators, defaults and annotations included)
    that read a name defined below it tied the blocks to their order in the script: it works
    only while every script carries them in that order (`WINDOW = Window`, rebound by another
    block; a model section using `re` that the common block imports)."""
    source = (ROOT / script).read_text()
    lines = source.splitlines()
    assert [(lines[line - 1].strip(), name) for line, name in forward_reads(source)] == []


def test_the_forward_read_check_sees_what_runs_at_load_and_nothing_else():
    source = ("import os\n"
              "def f(a=LATER_DEFAULT, *, b: LATER_TYPE = 1) -> os.PathLike:\n    return later()\n"
              "@later_decorator\nclass C(LaterBase):\n    x = later_value\n    y = x\n"
              "    def m(self):\n        return later()\n"
              "z = [v for v in range(3)] + [w for w in later_list]\n"
              "g = lambda q=later_lambda: later()\n"
              "try:\n    import json\nexcept ImportError:\n    json = None\n"
              "t = json\n"
              "LATER_DEFAULT = LATER_TYPE = later = later_decorator = LaterBase = later_value = 1\n"
              "later_list = later_lambda = 2\n")
    names = {name for _, name in forward_reads(source)}
    assert names == {"LATER_DEFAULT", "LATER_TYPE", "later_decorator", "LaterBase",
                     "later_value", "later_list", "later_lambda"}


def optional_names_read() -> dict:
    """NAME -> its default, of every `globals().get("NAME"[, default])` in blocks/."""
    found = {}
    for path in sorted((ROOT / "blocks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "get" and isinstance(node.func.value, ast.Call) and \
                    getattr(node.func.value.func, "id", "") == "globals":
                name, *default = node.args
                found[name.value] = ast.literal_eval(default[0]) if default else None
    return found


def test_model_py_lists_every_optional_name_once_with_its_default():
    """blocks/model.py's docstring lists each optional model-section name a block reads with
    `globals().get(NAME, default)`, once, with the default the block uses: a new optional name
    (or a changed default) is found there, not by copying another script."""
    doc = ast.get_docstring(ast.parse((ROOT / "blocks" / "model.py").read_text()))
    listed = re.findall(r"^    ([A-Z][A-Z0-9_]+) = (.+?)  # ", doc, re.M)
    names = [name for name, _ in listed]
    assert len(names) == len(set(names)), names
    assert {name: ast.literal_eval(default) for name, default in listed} == optional_names_read()


def _callers(name: str) -> set[str]:
    """The functions of the blocks (model sections aside) that call `name` or `.name`."""
    found = set()
    for path in [*(ROOT / "blocks").glob("*/*.py"), *(ROOT / "blocks").glob("[a-z]*.py")]:
        if path.name == "model.py" or "MODEL (source" in path.read_text():
            continue
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found |= {f"{path.stem}.{func.name}" for call in ast.walk(func)
                          if isinstance(call, ast.Call) and name in (
                              getattr(call.func, "id", None), getattr(call.func, "attr", None))}
    return found


def test_one_function_decides_a_page_s_sent_size_and_one_resizes_it():
    """Images and PDF pages alike (#43 item 2): the model's target_size was asked in
    pages.prepare_page and in pdf._render_pdf_page, each with its own rules around it."""
    assert _callers("target_size") == {"pages.sent_size"}
    assert _callers("sent_size") == {"pages.prepare_page", "pdf._render_pdf_page"}
    assert _callers("encode_page") == {"pages.prepare_page", "pdf._render_pdf_page"}
