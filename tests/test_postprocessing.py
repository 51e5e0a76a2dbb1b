"""Each model's post-processing on the shapes its real output takes."""

from __future__ import annotations

import types

from conftest import load_script

DEEPSEEK_DOCUMENT = (
    "<|ref|>title<|/ref|><|det|>[[63, 43, 935, 101]]<|/det|>\n# Annual Report 2023\n\n"
    "<|ref|>text<|/ref|><|det|>[[63, 120, 935, 300]]<|/det|>\nThe company grew by 12% in 2023.\n\n"
    "<|ref|>table<|/ref|><|det|>[[70, 320, 930, 600]]<|/det|>\n"
    "<table><tr><td>Revenue</td><td>12</td></tr></table>\n\n"
    "<|ref|>image<|/ref|><|det|>[[100, 620, 500, 900], [520, 620, 900, 900]]<|/det|>\n\n"
    "<|ref|>text<|/ref|><|det|>[[63, 910, 935, 990]]<|/det|>\nFootnote text.<｜end▁of▁sentence｜>"
)


def deepseek_args():
    return types.SimpleNamespace(keep_raw=False, prompt=None, prompt_mode="document")


def test_deepseek_grounding_spans_are_removed_whole():
    ds = load_script("deepseek-ocr-server.py")
    text, extras = ds.postprocess(DEEPSEEK_DOCUMENT, deepseek_args())
    assert text == ("# Annual Report 2023\n\nThe company grew by 12% in 2023.\n\n"
                    "<table><tr><td>Revenue</td><td>12</td></tr></table>\n\nFootnote text.")
    for leftover in ("title", "<|", "|>", "[[", "end▁of▁sentence"):
        assert leftover not in text


def test_deepseek_blocks_carry_label_box_and_text():
    ds = load_script("deepseek-ocr-server.py")
    _, extras = ds.postprocess(DEEPSEEK_DOCUMENT, deepseek_args())
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == ["title", "text", "table", "image", "image", "text"]
    assert blocks[0] == {"label": "title", "box": [63, 43, 935, 101], "text": "# Annual Report 2023"}
    assert blocks[3]["box"] == [100, 620, 500, 900] and blocks[4]["box"] == [520, 620, 900, 900]
    assert blocks[3]["text"] == "" and blocks[5]["text"] == "Footnote text."
    assert all(0 <= v <= 999 for b in blocks for v in b["box"])


def test_deepseek_free_ocr_has_no_tags_and_no_blocks():
    ds = load_script("deepseek-ocr-server.py")
    text, extras = ds.postprocess("Plain text of a page.\n\nSecond paragraph.", deepseek_args())
    assert text == "Plain text of a page.\n\nSecond paragraph." and extras["blocks"] == []


def test_deepseek_keep_raw_keeps_the_stream():
    ds = load_script("deepseek-ocr-server.py")
    args = types.SimpleNamespace(keep_raw=True, prompt=None, prompt_mode="document")
    _, extras = ds.postprocess(DEEPSEEK_DOCUMENT, args)
    assert extras["raw"] == DEEPSEEK_DOCUMENT


def test_ovis_drops_figure_placeholders_and_trims_a_looping_tail():
    ovis = load_script("ovis-ocr2-server.py")
    args = types.SimpleNamespace(keep_image_tags=False)
    page = ("# Title\n\nText.\n\n"
            '<img src="images/bbox_100_200_300_400.jpg" />\n\nMore text.')
    text, _ = ovis.postprocess(page, args)
    assert text == "# Title\n\nText.\n\nMore text."
    kept, _ = ovis.postprocess(page, types.SimpleNamespace(keep_image_tags=True))
    assert "bbox_100_200_300_400" in kept
    body = "Real content of the page. " * 320  # 8,320 characters of real text
    looping = body + "| 0 | 0 |" * 40
    trimmed, _ = ovis.postprocess(looping, args)
    assert trimmed == body + "| 0 | 0 |"
    short = "abc" + "xy" * 100  # under 8000 characters: the card leaves it alone
    assert ovis.postprocess(short, args)[0] == short


def test_degenerate_detection():
    ovis = load_script("ovis-ocr2-server.py")
    assert ovis.looks_degenerate("")
    assert ovis.looks_degenerate("   \n")
    assert ovis.looks_degenerate("!" * 300)
    assert ovis.looks_degenerate("Intro. " + "the same line again\n" * 60)
    assert not ovis.looks_degenerate("# Title\n\nA normal page of text with several words.")
    table = "<table>" + "".join(f"<tr><td>{i}</td><td>item {i * 7}</td></tr>" for i in range(80)) + "</table>"
    assert not ovis.looks_degenerate(table)


LIGHTON_GROUNDING = (
    "![title](102,45,898,88)\n# Chapter One\n\n"
    "![text](102,100,898,400)\nIt was a dark night; the price was \\$5.\n\n"
    "![image](120,410,880,700)\n\n"
    "![text](102,710,898,980)\nThe paragraph starts here\n\n"
    "![text+](60,20,940,120)\nand goes on over the next column.\n\n"
    "![page_number](480,985,520,998)\n12"
)


def test_lighton_grounding_markers_become_blocks_and_leave_the_markdown():
    lighton = load_script("lighton-ocr3-saturate.py")
    args = types.SimpleNamespace(mode="grounding", keep_raw=False)
    text, extras = lighton.postprocess(LIGHTON_GROUNDING, args)
    assert "![" not in text and "](" not in text
    assert text.startswith("# Chapter One\n\nIt was a dark night; the price was $5.")
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == ["title", "text", "image", "text", "page_number"]
    merged = blocks[3]
    assert merged["text"] == "The paragraph starts here\nand goes on over the next column."
    assert merged["box"] == [60, 20, 940, 980]  # the continuation's box merged in
    assert blocks[2] == {"label": "image", "box": [120, 410, 880, 700], "text": ""}


def test_lighton_plain_mode_unescapes_math_only():
    lighton = load_script("lighton-ocr3.py")
    args = types.SimpleNamespace(mode="plain", keep_raw=True)
    text, extras = lighton.postprocess("Cost: \\$x + y\\$ and ![alt](img.png)\n", args)
    assert text == "Cost: $x + y$ and ![alt](img.png)"
    assert extras == {"raw": "Cost: \\$x + y\\$ and ![alt](img.png)\n"}


def test_lighton_request_shapes():
    lighton = load_script("lighton-ocr3-saturate.py")
    plain = lighton.build_request("URL", types.SimpleNamespace(mode="plain", temperature=0.2, max_tokens=9))
    assert plain["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": "URL"}}]
    assert plain["temperature"] == 0.2 and plain["top_p"] == 1.0
    grounding = lighton.build_request("URL", types.SimpleNamespace(mode="grounding", temperature=0.2, max_tokens=9))
    assert grounding["messages"][0]["content"][1] == {"type": "text", "text": "grounding"}


def test_lighton_downscales_to_2048_on_the_grid_and_never_up():
    lighton = load_script("lighton-ocr3.py")
    assert lighton.target_size(1700, 2000) == (1700, 2000)
    w, h = lighton.target_size(2480, 3508)  # A4 at 300 DPI
    assert max(w, h) == 2048 and w % 32 == 0 and h % 32 == 0
    assert abs(w / h - 2480 / 3508) < 0.02


HPD_OUTPUT = (
    "<BLOCK>doc_title [88,40,910,95]<CHILD># Quarterly Report"
    "<FORK><BLOCK>text [88,110,480,420]<CHILD>Revenue rose in all regions."
    "<BLOCK>table [500,110,910,420]<CHILD><table><tr><td>Q1</td><td>12</td></tr></table>"
    "<BLOCK>chart [88,430,910,800]<CHILD>"
    "<BLOCK>seal [700,820,900,960]"
    "</FORK><BLOCK>text [88,820,680,960]<CHILD>Signed, the board."
)


def test_hpd_blocks_parse_and_textless_blocks_carry_no_text():
    hpd = load_script("hpd-parsing-saturate.py")
    args = types.SimpleNamespace(keep_raw=True)
    text, extras = hpd.postprocess(HPD_OUTPUT, args)
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == ["doc_title", "text", "table", "chart", "seal", "text"]
    assert blocks[0] == {"label": "doc_title", "box": [88, 40, 910, 95], "text": "# Quarterly Report"}
    assert blocks[3]["text"] == "" and blocks[4]["text"] == ""
    assert text == ("# Quarterly Report\n\nRevenue rose in all regions.\n\n"
                    "<table><tr><td>Q1</td><td>12</td></tr></table>\n\nSigned, the board.")
    assert "<FORK>" not in text and extras["raw"] == HPD_OUTPUT


def test_hpd_text_without_blocks_is_kept():
    hpd = load_script("hpd-parsing-saturate.py")
    text, extras = hpd.postprocess("just text <FORK>", types.SimpleNamespace(keep_raw=False))
    assert text == "just text" and extras["blocks"] == []


def test_a_short_repetition_loop_is_degenerate():
    """What a tiny random engine really produced: a short prefix, then one unit looping."""
    ovis = load_script("ovis-ocr2-server.py")
    assert ovis.looks_degenerate(" order¾m\x18 imageL laz" + "(� fo" * 13)
    assert not ovis.looks_degenerate("| a | b |\n| 1 | 2 |\n| 3 | 4 |\nTotal: 10 items listed.")
