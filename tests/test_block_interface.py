"""The blocks meet the model section and each other only at run time (#43 item 4): no statement
that runs as a script loads reads a name defined further down, and the optional model-section
names the blocks read with `globals().get` are the ones blocks/model.py lists."""

from __future__ import annotations

import ast

from conftest import ROOT


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
