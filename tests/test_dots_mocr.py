"""dots-mocr-server.py's model section: its prompt, request, image cap and context budget, and
its parser of the model's JSON layout answer.

The fixtures follow the output schema MODEL-FACTS.md gives in "rednote-hilab/dots.mocr (and
dots.ocr)", "Output schema (layout modes)" [DM-layout `post_process_cells`] [DM-prompts]: a JSON
list of `{"bbox": [x1, y1, x2, y2], "category": <one of the 11>, "text": ...}` cells in reading
order, no text for Picture, boxes in the pixels of the image as the server resized it (Qwen2-VL
smart_resize, factor 28, 3,136 to 11,289,600 px). The Markdown rules are that section's
"Authors' Markdown (`layoutjson2md`)" [DM-fmt] [DM-parser] [DM-cleaner].
"""

from __future__ import annotations

import json
import types

import pytest

from conftest import ROOT, load_output, load_script, page_image, run_script, write_image_folder

SCRIPT = "dots-mocr-server.py"
SHARED_PROMPTS = ROOT.parent / "shared" / "MODEL-PROMPTS.json"

# A page sent at 1708x2212 (on the 28 px grid and under the bounds: the server keeps it).
SENT = (1708, 2212)
CELLS = [
    {"bbox": [84, 56, 1610, 112], "category": "Page-header", "text": "Journal of Examples, Vol. 3"},
    {"bbox": [168, 196, 1526, 280], "category": "Title", "text": "# A Study of Layout"},
    {"bbox": [168, 322, 1526, 560], "category": "Text",
     "text": "  The energy is `$E = mc^2$` as shown in Table 1.  "},
    {"bbox": [420, 600, 1274, 700], "category": "Formula", "text": "\\[\\int_0^1 x\\,dx = \\frac{1}{2}\\]"},
    {"bbox": [168, 740, 1526, 1200], "category": "Table",
     "text": "<table><tr><td>a</td><td>1</td></tr><tr><td>b</td><td>2</td></tr></table>"},
    {"bbox": [168, 1240, 1526, 1800], "category": "Picture"},
    {"bbox": [168, 1820, 1526, 1880], "category": "Caption", "text": "Figure 1: A picture."},
    {"bbox": [168, 1900, 1526, 2000], "category": "Picture"},
    {"bbox": [800, 2100, 900, 2150], "category": "Page-footer", "text": "3"},
]
DOTS_LAYOUT = json.dumps(CELLS, ensure_ascii=False)
EXPECTED_MARKDOWN = "\n\n".join([
    "Journal of Examples, Vol. 3",
    "# A Study of Layout",
    "The energy is $E = mc^2$ as shown in Table 1.",
    "$$\n\\int_0^1 x\\,dx = \\frac{1}{2}\n$$",
    "<table><tr><td>a</td><td>1</td></tr><tr><td>b</td><td>2</td></tr></table>",
    "![](images/0.jpg)",
    "Figure 1: A picture.",
    "![](images/1.jpg)",
    "3",
])


def args(**overrides):
    return types.SimpleNamespace(**{"keep_raw": False, "drop_margins": False,
                                    "max_pixels": None, **overrides})


@pytest.fixture(scope="module")
def dots():
    return load_script(SCRIPT)


def thousandths(box, size):
    return [int(v * 1000 / size[i % 2]) for i, v in enumerate(box)]


def test_the_layout_prompt_is_the_authors_character_for_character(dots):
    """MODEL-PROMPTS.json, dots.mocr, prompt_layout_all_en (888 characters, ends with a
    newline) [DM-prompts]; the authors' client puts the placeholder in front [DM-inf]."""
    assert len(dots.PROMPT) == 888 and dots.PROMPT.endswith("single JSON object.\n")
    if SHARED_PROMPTS.exists():
        prompts = json.loads(SHARED_PROMPTS.read_text())
        (entry,) = [v for k, v in prompts.items() if k.startswith("rednote-hilab/dots.mocr")]
        assert dots.PROMPT == entry["prompt_layout_all_en"]
    request = dots.build_request("data:image/png;base64,AAAA", args(max_tokens=100))
    (message,) = request["messages"]
    assert message["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "<|img|><|imgpad|><|endofimg|>" + dots.PROMPT}]
    assert (request["temperature"], request["top_p"], request["max_tokens"]) == (0.1, 1.0, 100)
    assert "--chat-template-content-format" in dots.SERVE_ARGS and "--trust-remote-code" in dots.SERVE_ARGS
    assert dots.SERVE_ARGS[dots.SERVE_ARGS.index("--chat-template-content-format") + 1] == "string"


def test_a_layout_answer_becomes_the_authors_markdown_and_page_blocks(dots):
    text, extras = dots.postprocess(DOTS_LAYOUT, args(), SENT)
    assert text == EXPECTED_MARKDOWN
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == [c["category"] for c in CELLS]
    assert [b["box"] for b in blocks] == [thousandths(c["bbox"], SENT) for c in CELLS]
    assert [b["text"] for b in blocks] == EXPECTED_MARKDOWN.split("\n\n")
    assert "raw" not in extras
    assert dots.postprocess(DOTS_LAYOUT, args(keep_raw=True), SENT)[1]["raw"] == DOTS_LAYOUT


def test_boxes_are_mapped_from_the_servers_resize_back_to_the_page(dots):
    """The box of the whole resized image is the whole page, whatever the size sent: on the
    grid, off it (the server rounds each side to 28 px), above the processor's bound (the
    server scales it down) or below its floor (it scales it up)."""
    for sent in [(1708, 2212), (1700, 2200), (4000, 5000), (30, 40), (2480, 3508)]:
        served = dots.snap_to_patch_grid(*sent, 28, 3136, 11289600)
        whole = json.dumps([{"bbox": [0, 0, *served], "category": "Text", "text": "x"},
                            {"bbox": [served[0] // 2, 0, served[0], served[1] // 4],
                             "category": "Text", "text": "y"}])
        blocks = dots.postprocess(whole, args(), sent)[1]["blocks"]
        assert blocks[0]["box"] == [0, 0, 1000, 1000], sent
        assert blocks[1]["box"] == [int(served[0] // 2 * 1000 / served[0]), 0, 1000,
                                    int(served[1] // 4 * 1000 / served[1])], sent
    outside = json.dumps([{"bbox": [0, 0, 1709, 100], "category": "Text", "text": "x"},
                          {"bbox": [0, 0, 10], "category": "Text", "text": "y"},
                          {"bbox": "nowhere", "category": "Text", "text": "z"}])
    text, extras = dots.postprocess(outside, args(), SENT)
    assert [b["box"] for b in extras["blocks"]] == [None, None, None] and text == "x\n\ny\n\nz"
    # no size (a caller that cannot say what it sent): the cells, without boxes
    assert [b["box"] for b in dots.postprocess(DOTS_LAYOUT, args())[1]["blocks"]] == [None] * 9


def test_drop_margins_leaves_headers_and_footers_out_of_the_markdown_only(dots):
    text, extras = dots.postprocess(DOTS_LAYOUT, args(drop_margins=True), SENT)
    kept = [part for part in EXPECTED_MARKDOWN.split("\n\n")
            if part not in ("Journal of Examples, Vol. 3", "3")]
    assert text == "\n\n".join(kept)
    assert [b["label"] for b in extras["blocks"]][::8] == ["Page-header", "Page-footer"]


def test_formula_cells_follow_the_authors_rules(dots):
    """$$...$$ and inline $...$ kept, \\[...\\] and bare LaTeX as a $$ block, document
    preamble commands removed [DM-fmt get_formula_in_markdown]."""
    cases = {
        "$$a^2 + b^2 = c^2$$": "$$a^2 + b^2 = c^2$$",
        "$x_i$": "$x_i$",
        "\\[ \\sum_i x_i \\]": "$$\n\\sum_i x_i\n$$",
        "E = mc^2": "$$\nE = mc^2\n$$",
        "\\documentclass{article}\n\\usepackage[utf8]{inputenc}\n\\begin{document}\n"
        "\\alpha + \\beta\n\\end{document}": "$$\n\\alpha + \\beta\n$$",
    }
    for formula, markdown in cases.items():
        raw = json.dumps([{"bbox": [0, 0, 28, 28], "category": "Formula", "text": formula}])
        assert dots.postprocess(raw, args(), SENT)[0] == markdown, formula


def complete_cells_before(cut: int) -> list[dict]:
    """The cells whose closing brace is inside DOTS_LAYOUT[:cut]."""
    ends, at = [], 1
    decoder = json.JSONDecoder()
    for _ in CELLS:
        _, end = decoder.raw_decode(DOTS_LAYOUT, DOTS_LAYOUT.index("{", at))
        ends.append(end)
        at = end
    return [cell for cell, end in zip(CELLS, ends) if end <= cut]


def test_an_answer_cut_anywhere_keeps_every_complete_cell(dots):
    """An answer cut by max_tokens at any character: the cells complete before the cut are the
    blocks, and their Markdown is the page's ([DM-cleaner]: the last incomplete element goes)."""
    for cut in range(len(DOTS_LAYOUT)):
        text, extras = dots.postprocess(DOTS_LAYOUT[:cut], args(), SENT)
        kept = complete_cells_before(cut)
        assert [b["box"] for b in extras["blocks"]] == [thousandths(c["bbox"], SENT) for c in kept], cut
        if kept:
            assert EXPECTED_MARKDOWN.startswith(text) and text.count("\n\n") == len(kept) - 1, cut
        else:
            assert extras["blocks"] == [] and text == DOTS_LAYOUT[:cut].strip(), cut


def test_a_broken_cell_costs_only_itself_and_repeats_are_kept_once(dots):
    """The cleaner's other repairs [DM-cleaner]: a cell broken in the middle (a bad delimiter)
    does not lose the cells after it; a loop that repeats a cell keeps one copy."""
    parts = [json.dumps(cell) for cell in CELLS]
    broken = "[" + ", ".join(parts[:3] + ['{"bbox": [1, 2, 3, 4], "category": "Text", "text": "a" "b"}']
                             + parts[3:]) + "]"
    text, extras = dots.postprocess(broken, args(), SENT)
    assert text == EXPECTED_MARKDOWN and len(extras["blocks"]) == len(CELLS)
    looping = "[" + ", ".join(parts + parts[-2:] * 5)  # cut while looping
    text, extras = dots.postprocess(looping, args(), SENT)
    assert text == EXPECTED_MARKDOWN and len(extras["blocks"]) == len(CELLS)


def test_a_malformed_or_empty_answer_keeps_its_text_and_never_raises(dots):
    for raw in ["I cannot read this page.", "{not json", "[1, 2, 3", "42", "\"just a string\""]:
        text, extras = dots.postprocess(raw, args(), SENT)
        assert text == raw.strip() and extras["blocks"] == [], raw
    assert dots.postprocess("", args(), SENT) == ("", {"blocks": []})
    assert dots.postprocess("  \n", args(), SENT) == ("", {"blocks": []})
    assert dots.postprocess("[]", args(), SENT) == ("", {"blocks": []})
    # cells of the wrong shape: skipped, or kept without what they lack
    odd = json.dumps([1, "two", {"category": 7, "text": None, "bbox": [0, 0, 28, 28]},
                      {"category": "Text", "text": "ok", "bbox": [0, 0, 1e308 * 10, 1]}])
    text, extras = dots.postprocess(odd, args(), SENT)
    assert text == "ok" and [b["label"] for b in extras["blocks"]] == ["", "Text"]
    assert [b["box"] for b in extras["blocks"]] == [[0, 0, 16, 12], None]


def test_a_json_list_without_a_cell_keeps_its_text(dots):
    """A whole JSON list holding no cell object (a list of lines, of numbers) is no layout
    answer: like any answer with no JSON cell, it is kept as written, not emptied."""
    for raw in ['["Hello world", "Second line"]', "[1, 2, 3]", '[["a"], null]']:
        text, extras = dots.postprocess(raw, args(), SENT)
        assert text == raw and extras["blocks"] == [], raw


def test_a_single_cell_object_is_a_page_of_one_cell(dots):
    """The prompt asks for "a single JSON object"; the authors' parser wants a list: one cell
    given as an object is read as a list of one."""
    text, extras = dots.postprocess(json.dumps(CELLS[1]), args(), SENT)
    assert text == "# A Study of Layout" and len(extras["blocks"]) == 1


def test_the_context_budget_counts_the_capped_page(dots):
    """Image tokens of the largest page under the cap, plus the prompt, plus max_tokens, fill
    the 24,000-token context exactly; no page size takes more image tokens than counted."""
    assert dots.MAX_MODEL_LEN == 24000
    assert dots.image_token_budget() == 8000 + dots.PROMPT_TEXT_TOKENS
    assert dots.DEFAULT_MAX_TOKENS + dots.image_token_budget() == dots.MAX_MODEL_LEN
    assert dots.PROMPT_TEXT_TOKENS >= len((dots.IMAGE_PLACEHOLDER + dots.PROMPT).encode())
    authors = args(max_pixels=11289600)
    assert dots.image_token_budget(authors) == 14400 + dots.PROMPT_TEXT_TOKENS
    import random
    rng = random.Random(5)
    pages = [(rng.randint(20, 9000), rng.randint(20, 9000)) for _ in range(400)]
    for cap_args in (args(), authors, args(max_pixels=1_000_000)):
        budget = dots.image_token_budget(cap_args) - dots.PROMPT_TEXT_TOKENS
        for page in pages + [(1700, 2200), (2480, 3508), (6000, 4000)]:
            sent = dots.target_size(*page, cap_args)
            served = dots.snap_to_patch_grid(*sent, 28, 3136, 11289600)
            assert dots.patch_grid_tokens(*served, 28) <= budget, (page, sent)
            if sent != page:  # a downscaled page is sent on the grid: the server keeps it
                assert served == sent


def test_the_authors_pixel_bound_needs_a_lower_max_tokens(tmp_path):
    write_image_folder(tmp_path / "in", 1, fmt="PNG")
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--max-pixels", "11289600",
                     "--server", "http://127.0.0.1:9")
    assert run.returncode == 2 and "Lower --max-tokens to at most 8619" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--max-pixels", "99999999")
    assert run.returncode == 2 and "11,289,600" in run.stderr and "Traceback" not in run.stderr


def test_the_licence_clause_is_quoted_in_the_docstring_registry_and_card(dots):
    """MODEL-FACTS.md, dots.mocr, "License" [DM-lic]: clause 3.3(c), quoted with its source."""
    clause = ("Licensees shall not use the tool for unauthorized digitization of publications/"
              "document scanning or bulk scraping of content. Any use involving publications or "
              "other copyright-protected materials must first obtain relevant permissions.")
    flat = lambda text: " ".join(text.split())  # noqa: E731
    assert clause in flat(dots.__doc__) and clause in flat(dots.MODEL_CARD_NOTE)
    assert "LICENSE AGREEMENT" in dots.MODEL_CARD_NOTE and "3.3(c)" in dots.MODEL_CARD_NOTE
    entry = next(e for e in json.loads((ROOT / "models.json").read_text())["scripts"]
                 if e["script"] == SCRIPT)
    assert clause in entry["notes"] and "3.3(c)" in entry["notes"]


def test_a_run_sends_each_page_once_and_writes_blocks_in_page_space(tmp_path, stub_server):
    """Through the stub: the size each page was sent at reaches the parser, so pages of two
    sizes give their boxes in their own page's space; the card quotes the licence clause."""
    raw = json.dumps([{"bbox": [0, 0, 476, 644], "category": "Text", "text": "whole"}])
    (tmp_path / "answer.txt").write_text(raw)
    stub = stub_server("--model", "rednote-hilab/dots.mocr", "--answer-file", str(tmp_path / "answer.txt"))
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(page_image(1, size=(480, 640), fmt="PNG"))
    (folder / "b.png").write_bytes(page_image(2, size=(952, 1288), fmt="PNG"))
    out = tmp_path / "out"
    run = run_script(SCRIPT, str(folder), str(out), "--server", stub.url, "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    ds = load_output(out)
    boxes = {row["file_name"]: row["markdown_blocks"][0]["box"] for row in ds}
    assert boxes["a.png"] == [0, 0, 1000, 1000]  # 480x640 is served at 476x644
    assert boxes["b.png"] == [0, 0, 500, 500]  # 952x1288 is on the grid: half of it
    assert len(stub.requests()) == 2
    card = " ".join((out / "README.md").read_text().split())
    assert "3.3(c)" in card and "bulk scraping of content" in card


def test_pages_of_margins_alone_under_drop_margins_are_no_degenerate_first_pages(tmp_path,
                                                                                stub_server):
    """Blank versos and covers whose only cells are a running head and a folio (MODEL-FACTS,
    dots.mocr, output schema [DM-layout]): with --drop-margins their Markdown is empty, but the
    model answered well. The first-pages check judges the answer, not the clean-up's result: the
    run writes its rows (it stopped with exit 3, 'all came back degenerate', before)."""
    answer = json.dumps([
        {"bbox": [84, 56, 1610, 112], "category": "Page-header", "text": "Journal of Examples"},
        {"bbox": [800, 2100, 900, 2140], "category": "Page-footer", "text": "12"}])
    (tmp_path / "answer.txt").write_text(answer)
    stub = stub_server("--model", "rednote-hilab/dots.mocr", "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 4)
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--drop-margins")
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [""] * 4 and all(len(b) == 2 for b in ds["markdown_blocks"])
