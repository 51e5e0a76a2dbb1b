"""paddleocr-vl-server.py: its OTSL-to-HTML clean-up, its requests and its context budget.

Fixtures follow the output format MODEL-FACTS.md documents for the model (section
"PaddlePaddle/PaddleOCR-VL", "What the layout stage adds" and "Output of a raw `OCR:` request",
source keys [PX-pipe] and [R-P16y]): a table answer is OTSL with six tags, `<fcel> <ecel> <lcel>
<ucel> <xcel> <nl>`, converted to HTML, the raw text kept when conversion yields nothing. The
tags' meanings are OTSL's own (Lysak et al. 2023): a cell with text, an empty cell, a cell merged
with its left neighbour, with the one above, with both, the end of a row. No source here shows a
whole answer of this model, so the fixtures are built from that description.
"""

from __future__ import annotations

import json
import random
import time
import types

import pytest

from conftest import load_output, load_script, run_script, write_image_folder

SCRIPT = "paddleocr-vl-server.py"


@pytest.fixture(scope="module")
def paddle():
    return load_script(SCRIPT)


def args(task: str = "ocr", keep_raw: bool = False, max_tokens: int = 8192):
    return types.SimpleNamespace(task=task, keep_raw=keep_raw, max_tokens=max_tokens)


def test_a_table_answer_in_otsl_becomes_an_html_table(paddle):
    raw = "<fcel>Name<fcel>Score<nl><fcel>Ann<fcel>91<nl><fcel>Bo<ecel><nl>"
    text, extras = paddle.postprocess(raw, args("table"))
    assert text == ("<table><tr><td>Name</td><td>Score</td></tr><tr><td>Ann</td><td>91</td></tr>"
                    "<tr><td>Bo</td><td></td></tr></table>")
    assert extras == {}


def test_a_cells_text_is_text_in_the_html_table(paddle):
    """A cell reading `x < 5 & y > 2` (a comparison in a table of conditions) is the cell's text:
    written into the HTML table as is, its `<` would open a tag and hide the rest of the row."""
    raw = "<fcel>x < 5 & y > 2<fcel><b>bold?</b><nl>"
    text, _ = paddle.postprocess(raw, args("table"))
    assert text == ("<table><tr><td>x &lt; 5 &amp; y &gt; 2</td>"
                    "<td>&lt;b&gt;bold?&lt;/b&gt;</td></tr></table>")


def test_merged_cells_become_colspan_and_rowspan(paddle):
    """lcel extends the cell on its left, ucel the one above, xcel both: a header over two
    columns, a label over two rows, and a 2 x 2 block."""
    raw = ("<fcel>Region<fcel>2023<lcel><nl>"
           "<ucel><fcel>H1<fcel>H2<nl>"
           "<fcel>North<fcel>big<lcel><nl>"
           "<fcel>South<ucel><xcel><nl>")
    text, _ = paddle.postprocess(raw, args("table"))
    assert text == ('<table><tr><td rowspan="2">Region</td><td colspan="2">2023</td></tr>'
                    "<tr><td>H1</td><td>H2</td></tr>"
                    '<tr><td>North</td><td rowspan="2" colspan="2">big</td></tr>'
                    "<tr><td>South</td></tr></table>")


def test_an_ocr_answer_keeps_its_text_around_a_table(paddle):
    """A whole page under `OCR:` may hold a table (MODEL-FACTS: the answer for a table is OTSL
    whatever asked for it): the text before and after stays, the table becomes HTML."""
    raw = ("# Results\n\nThe scores were:\n"
           "<fcel>Name<fcel>Score<nl>\n<fcel>Ann<fcel>91<nl>\n\nNotes follow.\n\n"
           "<fcel>a<nl>")
    text, _ = paddle.postprocess(raw, args("ocr"))
    assert text == ("# Results\n\nThe scores were:\n"
                    "<table><tr><td>Name</td><td>Score</td></tr><tr><td>Ann</td><td>91</td></tr>"
                    "</table>\n\nNotes follow.\n\n<table><tr><td>a</td></tr></table>")


def test_text_after_a_row_end_is_kept_between_two_tables(paddle):
    """Text after an `<nl>` and before the next tag belongs to no cell (OTSL: `<nl>` ends a
    row, a cell's text follows its tag), even with a single newline around it: it ends the
    table and stays as the model wrote it, between the two."""
    for caption in ("Table 2: totals", "  (continued)  "):
        raw = f"<fcel>a<fcel>b<nl>\n{caption}\n<fcel>c<fcel>d<nl>"
        text, _ = paddle.postprocess(raw, args("ocr"))
        assert text == ("<table><tr><td>a</td><td>b</td></tr></table>"
                        f"\n{caption}\n<table><tr><td>c</td><td>d</td></tr></table>")


def test_an_answer_cut_by_max_tokens_keeps_every_cell_it_has(paddle):
    raw = "Intro\n\n<fcel>A<fcel>B<nl><fcel>1<fcel>2<nl><fcel>3<fcel>fou"
    text, _ = paddle.postprocess(raw, args("ocr"))
    assert text == ("Intro\n\n<table><tr><td>A</td><td>B</td></tr><tr><td>1</td><td>2</td></tr>"
                    "<tr><td>3</td><td>fou</td></tr></table>")
    # cut inside a tag: the fragment is text after the table, not lost
    text, _ = paddle.postprocess("<fcel>A<nl><fc", args("table"))
    assert text == "<table><tr><td>A</td></tr></table><fc"


def test_a_malformed_table_loses_no_text_and_one_with_no_cell_stays_raw(paddle):
    """Merges with nothing to merge into (a row that starts with lcel, a first row of ucel),
    ragged rows: each such tag is a cell of its own; a table of merges only converts to
    nothing, so the model's text is kept as written."""
    text, _ = paddle.postprocess("<ucel>up<fcel>x<nl><lcel>left<nl><fcel>1<fcel>2<fcel>3<nl>",
                                 args("table"))
    assert text == ("<table><tr><td>up</td><td>x</td></tr><tr><td>left</td></tr>"
                    "<tr><td>1</td><td>2</td><td>3</td></tr></table>")
    for raw in ("<lcel><ucel><nl>", "<nl><nl>", "<xcel>x"):
        assert paddle.postprocess(raw, args("table"))[0] == raw


def test_empty_answer_and_plain_text(paddle):
    assert paddle.postprocess("", args("ocr")) == ("", {})
    assert paddle.postprocess("  \\frac{a}{b}  ", args("formula"))[0] == "\\frac{a}{b}"
    assert paddle.postprocess("", args("table", keep_raw=True)) == ("", {"raw": ""})


def test_a_chart_answer_is_kept_exactly_as_written(paddle):
    """Its format is not documented here (MODEL-FACTS lists the prompt, not the answer)."""
    raw = " Month | Sales\n<fcel>Jan<fcel>3<nl>\n"
    assert paddle.postprocess(raw, args("chart", keep_raw=True)) == (raw, {"raw": raw})


def test_the_parser_is_total_and_linear_on_degenerate_answers(paddle):
    tokens = ["<fcel>", "<ecel>", "<lcel>", "<ucel>", "<xcel>", "<nl>", "<fc", "cel>", "x",
              " ", "\n", "\n\n", "<", ">", "é", "\x00", "<table>"]
    rng = random.Random(42)
    samples = ["<fcel>" * 20000, "<lcel>" * 20000, "<fcel>x" + "<nl><ucel>" * 10000,
               ("<fcel>a" * 150 + "<nl>") * 150, "<nl>" * 20000, "\n\n".join(["<fcel>x<nl>"] * 5000)]
    samples += ["".join(rng.choice(tokens) for _ in range(rng.randrange(1, 300))) for _ in range(500)]
    started = time.monotonic()
    for raw in samples:
        for task in ("ocr", "table"):
            text, _ = paddle.postprocess(raw, args(task))
            assert isinstance(text, str)
    assert time.monotonic() - started < 20, "the OTSL conversion went quadratic"


def test_each_task_sends_its_prompt_after_the_image_with_the_pipelines_bounds(paddle):
    """MODEL-PROMPTS.json "PaddlePaddle/PaddleOCR-VL-1.5|1.6", character for character; the
    bounds as the pipeline's vllm-server client sends them ([PX-pipe], [PX-predictor]:
    `extra_body.mm_processor_kwargs`, min_pixels 112896, max_pixels 1003520)."""
    prompts = {"ocr": "OCR:", "table": "Table Recognition:", "formula": "Formula Recognition:",
               "chart": "Chart Recognition:"}
    assert paddle.TASKS == prompts and paddle.DEFAULT_TASK == "ocr"
    for task, prompt in prompts.items():
        body = paddle.build_request("data:image/jpeg;base64,AAAA", args(task, max_tokens=77))
        (message,) = body["messages"]
        assert [part["type"] for part in message["content"]] == ["image_url", "text"]
        assert message["content"][1]["text"] == prompt
        assert body["mm_processor_kwargs"] == {"min_pixels": 112896, "max_pixels": 1003520}
        assert body["temperature"] == 0 and body["max_tokens"] == 77


def test_the_context_check_counts_the_largest_page_the_bounds_allow(paddle):
    """28 px per image token (14 px patches merged 2 x 2): 1,003,520 px is at most 1,280
    tokens, whatever the page's shape, and the client sends the processor's own size."""
    assert paddle.image_token_budget() == 1280 + paddle.PROMPT_TEXT_TOKENS
    assert paddle.image_token_budget() + paddle.DEFAULT_MAX_TOKENS <= paddle.MAX_MODEL_LEN
    for width, height in [(2480, 3508), (5000, 700), (300, 300), (1654, 2339), (100, 6000)]:
        w, h = paddle.target_size(width, height)
        assert w % 28 == 0 and h % 28 == 0
        assert 112896 <= w * h <= 1003520 and (w // 28) * (h // 28) <= 1280


def test_a_run_writes_html_tables_the_raw_answer_and_the_layout_warning(tmp_path, stub_server,
                                                                        paddle):
    """Against the stub answering in OTSL: the Markdown column holds the HTML table, the raw
    column the answer as written, each request the task prompt and the bounds, and the card
    the warning about the layout stage this script leaves out."""
    raw = "<fcel>Name<fcel>Score<nl><fcel>Ann<fcel>91<nl>"
    (tmp_path / "answer.txt").write_text(raw, encoding="utf-8")
    stub = stub_server("--model", paddle.MODEL_ID, "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    out = tmp_path / "out"
    run = run_script(SCRIPT, str(tmp_path / "in"), str(out), "--server", stub.url, "--task",
                     "table", "--keep-raw", "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    assert ds["markdown"] == [paddle.postprocess(raw, args("table"))[0]] * 2
    assert ds["markdown"][0].startswith("<table><tr><td>Name</td>")
    assert ds["markdown_raw"] == [raw, raw]
    assert {tuple(r["texts"]) for r in stub.requests()} == {("Table Recognition:",)}
    assert all(r["mm_processor_kwargs"] == {"min_pixels": 112896, "max_pixels": 1003520}
               for r in stub.requests())
    info = json.loads(ds["inference_info"][0])[-1]
    assert "Table Recognition:" in json.dumps(info)
    card = (out / "README.md").read_text()
    assert paddle.MODEL_CARD_NOTE in card and "PP-DocLayoutV2" in card
    assert "PP-DocLayoutV2" in paddle.__doc__ and "layout-off" in paddle.__doc__


@pytest.mark.parametrize("version, shebang, serve_args, expected", [
    ("0.32.0+cpu", "python", "", ["--trust-request-mm-kwargs"]),
    ("0.33.1", "python", "", ["--trust-request-mm-kwargs"]),
    ("0.30.0", "python", "", []),  # the image's release: no such flag, it takes the bounds
    ("0.32.0", "python", "--trust-request-mm-kwargs", []),  # given already
    ("0.32.0", "bash", "", []),  # not a Python entry point: unknown, no flag
])
def test_a_spawned_server_trusts_the_per_request_bounds_where_its_vllm_needs_it(
        tmp_path, monkeypatch, paddle, version, shebang, serve_args, expected):
    """vLLM 0.32 answers 400 to per-request mm_processor_kwargs unless the server was started
    with --trust-request-mm-kwargs (seen on the CI engine); 0.30.0 has no such flag. The
    version is read from the package metadata of the `vllm` command's own interpreter."""
    import os
    import shutil
    import sys

    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    interpreter = sys.executable if shebang == "python" else shutil.which("bash")
    (bin_dir / "vllm").write_text(f"#!{interpreter}\n")
    (bin_dir / "vllm").chmod(0o755)
    metadata = site / f"vllm-{version}.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert paddle.spawn_args(types.SimpleNamespace(serve_args=serve_args)) == expected


def test_no_vllm_command_means_no_flag(tmp_path, monkeypatch, paddle):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert paddle.local_vllm_version() is None
    assert paddle.spawn_args(types.SimpleNamespace(serve_args="")) == []
