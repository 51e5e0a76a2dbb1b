"""Each model's post-processing on the shapes its real output takes."""

from __future__ import annotations

import json
import types

import pytest

from conftest import load_output, load_script, run_script, write_image_folder

# MODEL-FACTS.md, DeepSeek-OCR section, "Output": grounding spans
# `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>` before each block, coordinates 0-999.
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
    """MODEL-FACTS.md, DeepSeek-OCR, "Output" and "Figures" (the authors' clean-up,
    DeepSeek-OCR-vllm/run_dpsk_ocr_image.py): spans removed whole, a figure's span kept as
    its placeholder."""
    ds = load_script("deepseek-ocr-server.py")
    text, extras = ds.postprocess(DEEPSEEK_DOCUMENT, deepseek_args())
    assert text == ("# Annual Report 2023\n\nThe company grew by 12% in 2023.\n\n"
                    "<table><tr><td>Revenue</td><td>12</td></tr></table>\n\n"
                    "![](images/0.jpg)\n\nFootnote text.")
    for leftover in ("title", "<|", "|>", "[[", "end▁of▁sentence"):
        assert leftover not in text


def test_deepseek_figures_stay_where_they_are_as_the_authors_placeholders():
    """The authors' clean-up (MODEL-FACTS.md, DeepSeek-OCR, "Figures";
    DeepSeek-OCR-vllm/run_dpsk_ocr_image.py): each `image` span becomes `![](images/N.jpg)` and
    a newline, N counting the page's figures from 0; other spans are removed. The page is in the
    grounding format of MODEL-FACTS.md ("Output"). The placeholder was removed with the span."""
    ds = load_script("deepseek-ocr-server.py")
    page = ("<|ref|>text<|/ref|><|det|>[[63, 40, 935, 100]]<|/det|>\nBefore.\n\n"
            "<|ref|>image<|/ref|><|det|>[[100, 120, 500, 400]]<|/det|>\n"
            "<|ref|>image_caption<|/ref|><|det|>[[100, 410, 500, 440]]<|/det|>\nFig. 1\n\n"
            "<|ref|>image<|/ref|><|det|>[[100, 460, 500, 700], [520, 460, 900, 700]]<|/det|>\n"
            "<|ref|>text<|/ref|><|det|>[[63, 720, 935, 800]]<|/det|>\nAfter.")
    for _ in range(2):  # each page counts from 0
        text, extras = ds.postprocess(page, deepseek_args())
        assert text == "Before.\n\n![](images/0.jpg)\n\nFig. 1\n\n![](images/1.jpg)\n\nAfter."
    images = [b for b in extras["blocks"] if b["label"] == "image"]
    assert [b["box"] for b in images] == [[100, 120, 500, 400], [100, 460, 500, 700],
                                          [520, 460, 900, 700]]
    assert all(b["text"] == "" for b in images)  # the box is the blocks column's, not text


def test_deepseek_blocks_carry_label_box_and_text():
    ds = load_script("deepseek-ocr-server.py")
    _, extras = ds.postprocess(DEEPSEEK_DOCUMENT, deepseek_args())
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == ["title", "text", "table", "image", "image", "text"]
    assert blocks[0] == {"label": "title", "box": [63, 43, 935, 101], "text": "# Annual Report 2023"}
    assert blocks[3]["box"] == [100, 620, 500, 900] and blocks[4]["box"] == [520, 620, 900, 900]
    assert blocks[3]["text"] == "" and blocks[5]["text"] == "Footnote text."
    assert all(0 <= v <= 999 for b in blocks for v in b["box"])


def test_deepseek_maps_coloneqq_and_eqqcolon_as_the_official_post_processing():
    """MODEL-FACTS.md, DeepSeek-OCR section: `\\coloneqq` to `:=`, `\\eqqcolon` to `=:`."""
    ds = load_script("deepseek-ocr-server.py")
    raw = ("<|ref|>equation<|/ref|><|det|>[[80, 100, 900, 160]]<|/det|>\n"
           "\\[ f(x) \\coloneqq x^2, \\quad y \\eqqcolon g \\]\n\n"
           "<|ref|>text<|/ref|><|det|>[[80, 170, 900, 400]]<|/det|>\nWith \\coloneqqq kept.")
    text, extras = ds.postprocess(raw, deepseek_args())
    assert text == "\\[ f(x) := x^2, \\quad y =: g \\]\n\nWith \\coloneqqq kept."
    assert extras["blocks"][0]["text"] == "\\[ f(x) := x^2, \\quad y =: g \\]"


def test_deepseek_boxes_out_of_range_are_null_never_an_overflow():
    ds = load_script("deepseek-ocr-server.py")
    raw = ("<|ref|>text<|/ref|><|det|>[[1, 2, 3, 1000]]<|/det|>\na\n"
           "<|ref|>text<|/ref|><|det|>[[1, 2, 3, " + "9" * 400 + "]]<|/det|>\nb\n"
           "<|ref|>text<|/ref|><|det|>[[1, 2]]<|/det|>\nc\n"
           "<|ref|>text<|/ref|><|det|>[[0, 0, 999, 999.5]]<|/det|>\nd\n"
           "<|ref|>text<|/ref|><|det|>[[1e3, 2, 3, 4]]<|/det|>\ne\n"  # was read as [1, 3, 2, 3]
           "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4, 5]]<|/det|>\nf")  # its fifth was dropped
    blocks = ds.parse_grounded_blocks(raw)
    assert [(b["box"], b["text"]) for b in blocks] == [(None, t) for t in "abcdef"]


def test_deepseek_a_span_missing_its_closing_tag_swallows_no_text():
    """The grounding span format of MODEL-FACTS.md (DeepSeek-OCR), with one closing tag
    missing, as a slip or a cut at max_tokens leaves it: the paragraph after it was lost up
    to the next span (found by feeding the parser broken spans)."""
    ds = load_script("deepseek-ocr-server.py")
    tail = "\n\n<|ref|>text<|/ref|><|det|>[[5, 6, 7, 8]]<|/det|>\nPara two."
    for head in ("<|ref|>text<|det|>[[1, 2, 3, 4]]<|/det|>",   # no <|/ref|>
                 "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]"):  # no <|/det|>
        text, extras = ds.postprocess(head + "\nImportant paragraph one." + tail, deepseek_args())
        assert text == "Important paragraph one.\n\nPara two."
        assert extras["blocks"][-1] == {"label": "text", "box": [5, 6, 7, 8], "text": "Para two."}
    cut = ("<|ref|>title<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\n# Head\n"
           "<|ref|>text<|/ref|><|det|>[[63, 120, 9")  # cut off at max_tokens
    text, extras = ds.postprocess(cut, deepseek_args())
    assert text == "# Head" and extras["blocks"] == [
        {"label": "title", "box": [1, 2, 3, 4], "text": "# Head"}]
    assert ds.postprocess("Text.\n<|ref|>te", deepseek_args())[0] == "Text."



def test_deepseek_a_span_missing_its_closing_tag_keeps_the_numbers_after_it():
    """The grounding span `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>` of MODEL-FACTS.md
    (DeepSeek-OCR, "Output") with `<|/det|>` missing: the box characters (digits, spaces,
    commas) were removed past the box, so a paragraph after it lost its leading year, list
    dash or number ("2023 was ..." became "was ...")."""
    ds = load_script("deepseek-ocr-server.py")
    for box in ("[[1, 2, 3, 4]]", "[[1, 2, 3, 4], [5, 6, 7, 8]]", "[[1, 2, 3, 4]"):
        for paragraph in ("2023 was a good year.", "- 12 items", "3.5, 4 and 5 - 6 remain."):
            raw = f"<|ref|>text<|/ref|><|det|>{box}\n{paragraph}"
            assert ds.postprocess(raw, deepseek_args())[0] == paragraph, raw
    assert ds.postprocess("A.\n<|ref|>text<|/ref|><|det|>[[1, 2, 3", deepseek_args())[0] == "A."

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


# MODEL-FACTS.md, OvisOCR2 section, "Output" and "The card's clean-up" (the model card of
# ATH-MaaS/OvisOCR2): figures come as `<img src="images/bbox_l_t_r_b.jpg" />`; the card
# strips, splits on exactly two newlines, drops the blocks that, once stripped, start with the
# placeholder, and joins with two newlines. (A block after a newline or a space was kept.)
@pytest.mark.parametrize("raw, expected", [
    ("\n# Title\n\nText.\n\n", "# Title\n\nText."),  # stripped
    ("# Title\n\n\nText.", "# Title\n\n\nText."),  # a blank-line run is the model's own spacing
    ("A\n\n<img src=\"images/bbox_1_2_3_4.jpg\" />\n\nB", "A\n\nB"),
    ("A\n\n\n<img src=\"images/bbox_1_2_3_4.jpg\" />", "A"),  # the block is "\n<img ...": stripped
    ("A\n\n <img src=\"images/bbox_1_2_3_4.jpg\" />\n\nB", "A\n\nB"),
    ("<img src=\"images/bbox_1_2_3_4.jpg\" /> Figure 1: a caption\n\nB", "B"),
])
def test_ovis_clean_up_is_the_cards_byte_for_byte(raw, expected):
    for script in ("ovis-ocr2.py", "ovis-ocr2-server.py"):
        text, _ = load_script(script).postprocess(raw, types.SimpleNamespace(keep_image_tags=False))
        assert text == expected


def test_degenerate_detection():
    ovis = load_script("ovis-ocr2-server.py")
    assert ovis.looks_degenerate("")
    assert ovis.looks_degenerate("   \n")
    assert ovis.looks_degenerate("!" * 300)
    assert ovis.looks_degenerate("Intro. " + "the same line again\n" * 60)
    assert not ovis.looks_degenerate("# Title\n\nA normal page of text with several words.")
    table = "<table>" + "".join(f"<tr><td>{i}</td><td>item {i * 7}</td></tr>" for i in range(80)) + "</table>"
    assert not ovis.looks_degenerate(table)


# MODEL-FACTS.md, LightOnOCR-3 section, "Grounding output shape (the authors' README example
# and client)": the block's text on the marker's own line, running on over several lines until
# the next marker; a `+` label continues the previous block, its box its own (the next column).
LIGHTON_GROUNDING = (
    "![title](102,45,898,88) # Chapter One\n"
    "![text](102,100,480,400) It was a dark night; tickets cost \\$5 and \\$10, and the "
    "area was \\$x^2\\$ square feet.\n"
    "![table](102,410,480,600) | year | count |\n| --- | --- |\n| 1923 | 12 |\n"
    "![image](120,610,480,700)\n"
    "![text](102,710,480,980) The paragraph starts here and\n"
    "![text+](520,100,898,300) goes on over the next column.\n"
    "![page_number](480,985,520,998) 12"
)


def test_lighton_grounding_markers_with_text_on_their_line_become_blocks():
    lighton = load_script("lighton-ocr3-saturate.py")
    args = types.SimpleNamespace(mode="grounding", keep_raw=False)
    text, extras = lighton.postprocess(LIGHTON_GROUNDING, args)
    assert "![" not in text and "](" not in text
    blocks = extras["blocks"]
    assert [b["label"] for b in blocks] == ["title", "text", "table", "image", "text", "text+",
                                            "page_number"]
    assert blocks[0] == {"label": "title", "box": [102, 45, 898, 88], "text": "# Chapter One"}
    assert blocks[2]["text"] == "| year | count |\n| --- | --- |\n| 1923 | 12 |"  # several lines
    assert blocks[3] == {"label": "image", "box": [120, 610, 480, 700], "text": ""}
    # the continuation is a block of its own, with its own box in the next column
    assert blocks[4] == {"label": "text", "box": [102, 710, 480, 980], "text": "The paragraph starts here and"}
    assert blocks[5] == {"label": "text+", "box": [520, 100, 898, 300], "text": "goes on over the next column."}
    assert text == (
        "# Chapter One\n\n"
        "It was a dark night; tickets cost \\$5 and \\$10, and the area was $x^2$ square feet.\n\n"
        "| year | count |\n| --- | --- |\n| 1923 | 12 |\n\n"
        "The paragraph starts here and goes on over the next column.\n\n"
        "12")


def test_lighton_grounding_tolerates_a_marker_alone_on_its_line_and_bad_boxes():
    """Shapes outside the documented one still parse: text on the next line, a box past 1000
    (a degenerate output) kept as a block without a box, never an int32 overflow."""
    lighton = load_script("lighton-ocr3.py")
    raw = "Lead text\n![text](10,20,30,40)\nBody\n![text](10,20,99999999999,40) Loop"
    markdown, blocks = lighton.parse_grounding(raw)
    assert markdown == "Lead text\n\nBody\n\nLoop"
    assert blocks == [{"label": "text", "box": [10, 20, 30, 40], "text": "Body"},
                      {"label": "text", "box": None, "text": "Loop"}]


# MODEL-FACTS.md, LightOnOCR-3 section, "Post-processing the authors apply": an escaped pair
# becomes math only when it encloses math; prices, code and URLs keep their escapes. The
# source gives these examples, not the rule: the cases below are those examples.
@pytest.mark.parametrize("raw, expected", [
    ("Cost: \\$x + y\\$ and ![alt](img.png)\n", "Cost: $x + y$ and ![alt](img.png)"),
    ("Tickets: \\$5 and \\$10.", "Tickets: \\$5 and \\$10."),
    ("From \\$5 to \\$10, where \\$E = mc^2\\$.", "From \\$5 to \\$10, where $E = mc^2$."),
    ("\\$\\frac{a}{b}\\$ and \\$n\\$ items", "$\\frac{a}{b}$ and $n$ items"),
    ("Run `echo \\$HOME \\$PATH` first.", "Run `echo \\$HOME \\$PATH` first."),
    ("```\nprice=\\$a+\\$b\n```", "```\nprice=\\$a+\\$b\n```"),
    ("See https://example.org/q?\\$x=1&\\$y=2 now", "See https://example.org/q?\\$x=1&\\$y=2 now"),
    ("\\$\\$\\int_0^1 f\\$\\$", "$$\\int_0^1 f$$"),
    ("A lone \\$ sign", "A lone \\$ sign"),
])
def test_lighton_repairs_escaped_dollars_only_around_math(raw, expected):
    lighton = load_script("lighton-ocr3.py")
    text, _ = lighton.postprocess(raw, types.SimpleNamespace(mode="plain", keep_raw=False))
    assert text == expected


def test_lighton_plain_mode_keeps_raw():
    lighton = load_script("lighton-ocr3.py")
    _, extras = lighton.postprocess("\\$x\\$\n", types.SimpleNamespace(mode="plain", keep_raw=True))
    assert extras == {"raw": "\\$x\\$\n"}


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


# MODEL-FACTS.md, HPD-Parsing section, "Output": `<BLOCK>type [x1,y1,x2,y2]<CHILD>text` blocks
# and <FORK> tags, boxes 0-1000; chart and seal blocks carry no text (the vendor's export).
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


# The vendor's Markdown export, eval/hpd_to_markdown.py in the model repo PaddlePaddle/HPD-Parsing,
# step by step as MODEL-FACTS.md (HPD-Parsing, "The vendor's Markdown export") records it; a
# step marked "port" is a detail MODEL-FACTS leaves open, taken from the reference collection's
# ocr/hpd-parsing-server.py (clean_text). Each fixture is one page in the model's block format
# (`<BLOCK>type [x1,y1,x2,y2]<CHILD>text`, MODEL-FACTS.md, HPD-Parsing, "Output").
HPD_EXPORT_STEPS = {
    "canned sentence inside a block's text": (
        "<BLOCK>figure_title [80,600,900,640]<CHILD>"
        "Fig. 2. The image is too blurry to recognize any text content.",
        "Fig. 2."),
    "the second canned sentence, verbatim": (
        "<BLOCK>text [80,100,900,140]<CHILD>Intro."
        "<BLOCK>text [80,150,900,160]<CHILD>The image contains no text or characters. It is a "
        "graphical element (a horizontal line with a vertical line) and does not contain any "
        "chart, graph, or data points that can be extracted. Therefore, the correct OCR output "
        "is an empty string.",
        "Intro."),
    "a child head left in a block's text after <FORK>": (
        "<BLOCK>text [80,100,900,140]<CHILD>Para one.<FORK>text [5,6,7,8]<CHILD>Para two.",
        "Para one.Para two."),  # the head goes, the tags too, nothing is put in their place
    "display math the model's way becomes inline": (
        "<BLOCK>formula [80,100,900,140]<CHILD>\\[\nE = mc^2\n\\]",
        "\\(E = mc^2\\)"),
    "a multi-row formula and a one-line \\[ stay display": (
        "<BLOCK>formula [80,100,900,140]<CHILD>\\[\na \\\\\nb\n\\]"
        "<BLOCK>formula [80,150,900,190]<CHILD>\\[ x^2 \\]",
        "\\[\na \\\\\nb\n\\]\n\n\\[ x^2 \\]"),
    "an unterminated \\[ and <table> are closed": (
        "<BLOCK>formula [80,100,900,140]<CHILD>\\[\nx = y \\tag{3}"
        "<BLOCK>table [80,150,900,400]<CHILD><table><tr><td>Q1</td><td>12</td></tr>",
        "\\(x = y \\)\n\n<table><tr><td>Q1</td><td>12</td></tr></table>"),
    "[Non-Text] is dropped only as a whole block": (
        "<BLOCK>text [80,100,900,140]<CHILD>[Non-Text]"
        "<BLOCK>text [80,150,900,190]<CHILD>Keep [Non-Text] here.",
        "Keep [Non-Text] here."),
    "image and figure blocks keep their text; chart and seal do not": (
        "<BLOCK>image [80,100,900,400]<CHILD>EXIT<BLOCK>figure [80,410,900,600]<CHILD>Plan A"
        "<BLOCK>chart [80,610,900,800]<CHILD>1 2 3<BLOCK>seal [700,820,900,960]<CHILD>Seal",
        "EXIT\n\nPlan A"),
    "\\left( ... \\right) without anything tall inside": (
        "<BLOCK>text [80,100,900,140]<CHILD>Let \\(\\left( a + b \\right)^2\\) and "
        "\\(\\left( \\frac{a}{b} \\right)\\).",
        "Let \\(( a + b )^2\\) and \\(\\left( \\frac{a}{b} \\right)\\)."),
    "repeated \\cdots collapse": (
        "<BLOCK>text [80,100,900,140]<CHILD>Sum \\(x_1 + \\cdots \\cdots + x_n\\) here.",
        "Sum \\(x_1 + \\cdots + x_n\\) here."),
    "a trailing \\quad, and a final ellipsis after it (port)": (
        "<BLOCK>formula [80,100,900,140]<CHILD>\\(f(x) = y \\quad\\)"
        "<BLOCK>formula [80,150,900,190]<CHILD>\\(g(x) = y \\quad \\cdots\\)",
        "\\(f(x) = y\\)\n\n\\(g(x) = y\\)"),
    "\\supset and \\supseteq": (
        "<BLOCK>text [80,100,900,140]<CHILD>If \\(A \\supset B \\supseteq C\\) holds.",
        "If \\(A \\sqsupset B \\sqsupseteq C\\) holds."),
    "Unicode operators in an arithmetic line and in math": (
        "<BLOCK>text [80,100,900,140]<CHILD>3 × 4 ≤ 15\nso $a ≠ b$ here.",
        "\\( 3 \\times 4 \\leq 15 \\)\nso $a \\neq b$ here."),
    "adjacent inline formulas and a division (port)": (
        "<BLOCK>text [80,100,900,140]<CHILD>\\(a\\) \\(b\\)"
        "<BLOCK>text [80,150,900,190]<CHILD>12 ÷ 4 = 3",
        "\\(a\\)\n\n\\(b\\)\n\n\\( 12 \\div 4 = 3 \\)"),
}


@pytest.mark.parametrize("step", sorted(HPD_EXPORT_STEPS))
def test_hpd_markdown_is_the_vendors_export_step_by_step(step):
    hpd = load_script("hpd-parsing-saturate.py")
    raw, expected = HPD_EXPORT_STEPS[step]
    text, extras = hpd.postprocess(raw, types.SimpleNamespace(keep_raw=False))
    assert text == expected
    assert "\n\n".join(b["text"] for b in extras["blocks"] if b["text"]) == text
    assert all(b["box"] for b in extras["blocks"])  # a region whose text went is still a block


def test_hpd_export_stays_linear_on_deeply_nested_left_right():
    """The `\\left( ... \\right)` step of the vendor's export (eval/hpd_to_markdown.py, MODEL-FACTS.md,
    HPD-Parsing) on a degenerate formula of 20,000 nested pairs in one block: looking for a
    tall construct inside each pair rescanned the nest, quadratic (about 45 s)."""
    import time

    hpd = load_script("hpd-parsing-saturate.py")
    raw = "<BLOCK>formula [1,2,3,4]<CHILD>\\(" + "\\left(" * 20000 + "x" + "\\right)" * 20000 + "\\)"
    started = time.monotonic()
    text, _ = hpd.postprocess(raw, types.SimpleNamespace(keep_raw=False))
    assert time.monotonic() - started < 5
    assert text == "\\(" + "(" * 20000 + "x" + ")" * 20000 + "\\)"


def test_hpd_bad_boxes_become_null_and_blocks_stay():
    hpd = load_script("hpd-parsing-saturate.py")
    raw = ("<BLOCK>text [1,2,3,99999999999]<CHILD>one<BLOCK>text [1,2,3]<CHILD>two"
           "<BLOCK>text<CHILD>three<BLOCK>text [-5,0,10,10]<CHILD>four")
    blocks = hpd.parse_blocks(raw)
    assert [b["text"] for b in blocks] == ["one", "two", "three", "four"]
    assert all(b["box"] is None for b in blocks)


def test_hpd_text_without_blocks_is_kept():
    hpd = load_script("hpd-parsing-saturate.py")
    text, extras = hpd.postprocess("just text <FORK>", types.SimpleNamespace(keep_raw=False))
    assert text == "just text" and extras["blocks"] == []


def test_hpd_text_outside_the_block_format_is_kept():
    """The `<BLOCK>type [x1,y1,x2,y2]<CHILD>text` format of MODEL-FACTS.md (HPD-Parsing), with
    text before the first block, and a block whose head has neither box nor <CHILD>: both
    were dropped or taken for a label (found by feeding the parser odd outputs)."""
    hpd = load_script("hpd-parsing-saturate.py")
    args = types.SimpleNamespace(keep_raw=False)
    text, extras = hpd.postprocess("Lead text\n<BLOCK>text [1,2,3,4]<CHILD>A", args)
    assert text == "Lead text\n\nA" and extras["blocks"] == [
        {"label": "text", "box": [1, 2, 3, 4], "text": "A"}]
    text, extras = hpd.postprocess("<BLOCK>text [1,2,3,4]<CHILD>Hello<BLOCK>a paragraph the "
                                   "model wrote without its head\nsecond line", args)
    assert text == "Hello\n\na paragraph the model wrote without its head\nsecond line"
    assert extras["blocks"][1] == {"label": "", "box": None, "text": text.split("\n\n")[1]}


def test_a_short_repetition_loop_is_degenerate():
    """What a tiny random engine really produced: a short prefix, then one unit looping."""
    ovis = load_script("ovis-ocr2-server.py")
    assert ovis.looks_degenerate(" order¾m\x18 imageL laz" + "(� fo" * 13)
    assert not ovis.looks_degenerate("| a | b |\n| 1 | 2 |\n| 3 | 4 |\nTotal: 10 items listed.")


# Every model parser is total: any string in, a result out, and every box fits the int32 box
# column (or is null). Random strings built from each format's own tokens, plus hand-picked ones.
PARSERS = [
    ("lighton-ocr3-saturate.py", types.SimpleNamespace(mode="grounding", keep_raw=False), 1000),
    ("lighton-ocr3.py", types.SimpleNamespace(mode="plain", keep_raw=True), 1000),
    ("deepseek-ocr-server.py", types.SimpleNamespace(keep_raw=False, prompt=None, prompt_mode="document"), 999),
    ("deepseek-ocr2-server.py", types.SimpleNamespace(keep_raw=False, prompt=None, prompt_mode="document"), 999),
    ("hpd-parsing-saturate.py", types.SimpleNamespace(keep_raw=True), 1000),
    ("ovis-ocr2-server.py", types.SimpleNamespace(keep_image_tags=False), None),
    ("paddleocr-vl-server.py", types.SimpleNamespace(task="table", keep_raw=True), None),
    ("dots-mocr-server.py", types.SimpleNamespace(keep_raw=True, drop_margins=True), 1000),
    ("glm-ocr-server.py", types.SimpleNamespace(keep_raw=True), None),
]
TOKENS = ["![text](", "![text+](", "](", ")", ",", " ", "\n", "\n\n", "\\$", "$", "`", "```",
          "http://x.y/", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "[[", "]]", "[", "]",
          "<BLOCK>", "<CHILD>", "<FORK>", "</FORK>", "[Non-Text]", "\\[", "\\]", "<table>",
          "\\left(", "\\right", "\\tag{", "}", "{", "-", ".", "0", "7", "999", "1000", "1001",
          "99999999999", "9" * 400, "1e999", "nan", "é", "\x00", '<img src="images/bbox_',
          '{"bbox": ', '"category": ', '"text": ', '"Picture"', '"Formula"', '"', "$$",
          "\\t", "\t", "·", "_", "\\_", "$ ", "<td>0</td>" * 12]  # GLM-OCR's clean-up
NASTY = ["", "![", "![text](1,2,3,4", "![" * 5000, "<|ref|>" * 3000, "<|det|>[[" + "9" * 5000,
         "<BLOCK>" * 3000, "\\$" * 3000, "<BLOCK>text [" + "9" * 400 + ",0,0,0]<CHILD>x",
         "![a](0,0,0,1e5) x", "<|ref|>t<|/ref|><|det|>[[nan, 1, 2, 3]]<|/det|>x",
         "[" * 5000, '{"bbox": [' * 3000, '[{"bbox": [' + "9" * 5000 + ']}]',
         '{"text": "' * 3000]


@pytest.mark.parametrize("script, args, top", PARSERS)
def test_model_parsers_are_total_and_their_boxes_fit_int32(script, args, top):
    import random
    import time

    module = load_script(script)
    rng = random.Random(17)
    samples = NASTY + ["".join(rng.choice(TOKENS) for _ in range(rng.randrange(1, 200)))
                       for _ in range(300)]
    started = time.monotonic()
    for raw in samples:
        # a model whose boxes are in its input's pixels gets the size the page was sent at
        sized = ((1708, 2212),) if getattr(module, "POSTPROCESS_GETS_SIZE", False) else ()
        text, extras = module.postprocess(raw, args, *sized)
        assert isinstance(text, str)
        for block in extras.get("blocks", []):
            box = block["box"]
            assert box is None or (len(box) == 4 and all(type(v) is int and 0 <= v <= top for v in box))
            assert isinstance(block["label"], str) and isinstance(block["text"], str)
    assert time.monotonic() - started < 20, "a parser went quadratic on degenerate output"


def test_a_block_without_a_box_is_writable():
    import pyarrow as pa

    import types

    import datasets

    module = load_script("hpd-parsing-saturate.py")
    source = types.SimpleNamespace(dataset=datasets.Dataset.from_dict({"x": [1]}), pdf=None,
                                   image_column="image")
    feature = module.output_features(source, types.SimpleNamespace(output_column="markdown"))[
        "markdown_blocks"]
    blocks = module.parse_blocks("<BLOCK>text [1,2,3,99999999999]<CHILD>one<BLOCK>text [1,2,3,4]<CHILD>two")
    features = datasets.Features({"blocks": feature})
    table = pa.Table.from_pydict(features.encode_batch({"blocks": [blocks]}), schema=features.arrow_schema)
    assert table.to_pylist()[0]["blocks"][0]["box"] is None


def test_an_answer_cut_off_inside_its_last_marker_leaves_no_residue():
    """An answer that reached max_tokens stops anywhere, a grounding marker or block tag half
    written (LightOnOCR-3's `![label](x1,y1,x2,y2)`, HPD-Parsing's `<BLOCK>type [box]<CHILD>`,
    both as MODEL-FACTS.md gives them): the half-written one was left in the Markdown."""
    lighton = load_script("lighton-ocr3-saturate.py")
    for cut in ("![text](102,100,480,4", "![te", "![text]("):
        markdown, blocks = lighton.parse_grounding("![text](1,2,3,4) Hello\n" + cut)
        assert markdown == "Hello" and [b["text"] for b in blocks] == ["Hello"]
    assert lighton.parse_grounding("![text](1,2,3,4) See ![fig](a.png) here")[0] == \
        "See ![fig](a.png) here"  # an image link is no marker
    hpd = load_script("hpd-parsing-saturate.py")
    args = types.SimpleNamespace(keep_raw=False)
    for cut in ("<BLOCK>text [5,6,7", "<CHI", "<BLO", "</FO"):
        text, extras = hpd.postprocess("<BLOCK>text [1,2,3,4]<CHILD>A" + cut, args)
        assert text == "A" and extras["blocks"][0]["text"] == "A"
        assert all(b["box"] in ([1, 2, 3, 4], None) for b in extras["blocks"])


def test_hpd_an_answer_cut_off_inside_a_child_head_leaves_no_residue():
    """HPD-Parsing's `<BLOCK>type [x1,y1,x2,y2]<CHILD>text` format with `<FORK>`, where a child's
    head (`type [x1,y1,x2,y2]` then `<CHILD>`, `<FORK>` or `<BLOCK>`) sits inside a block's text
    (MODEL-FACTS.md, HPD-Parsing, "Output"): an answer that reached max_tokens inside such a
    head, or between it and its tag, left the half-written head in the Markdown as words."""
    hpd = load_script("hpd-parsing-saturate.py")
    args = types.SimpleNamespace(keep_raw=False)
    page = "<BLOCK>text [80,100,900,140]<CHILD>Para one.<FORK>text [80,150,900,190]<CHILD>Para two."
    for cut in ("<FORK>te", "<FORK>text [80,2", "<FORK>text\n[80, 200, 900,", "<FORK>",
                "<FORK>text [1,2,3,4]", "<FORK>text [1,2,3,4]<CHI",
                "<FORK>list [1,2,3,4]<FORK>text [5,6"):
        text, extras = hpd.postprocess(page + cut, args)
        assert text == "Para one.Para two.", cut
        assert [b["text"] for b in extras["blocks"]] == [text]
    text, _ = hpd.postprocess("Lead text<BLOC", args)  # cut before any block
    assert text == "Lead text"


def test_hpd_a_table_cut_off_inside_a_cell_tag_is_closed():
    """The vendor's export closes an unterminated `<table>` (MODEL-FACTS.md, HPD-Parsing, "The
    vendor's Markdown export"); an answer cut off at max_tokens inside a tag (`<td`, `</t`) got
    `</table>` glued to the half tag, which an HTML reader takes as the tag's attribute: the
    table stayed open."""
    hpd = load_script("hpd-parsing-saturate.py")
    args = types.SimpleNamespace(keep_raw=False)
    for cut in ("</t", "<td", '<td colspan="2', "<"):
        text, _ = hpd.postprocess("<BLOCK>table [80,150,900,400]<CHILD><table><tr><td>Q1</td>"
                                  + cut, args)
        assert text == "<table><tr><td>Q1</td></table>", cut
    for cut in ("<t", "<tabl", "<table", '<table border="1'):  # a table begun, cut in its tag
        text, extras = hpd.postprocess("<BLOCK>text [80,100,900,140]<CHILD>Intro."
                                       "<BLOCK>table [80,150,900,400]<CHILD>Table 1. " + cut, args)
        assert text == "Intro.\n\nTable 1." and extras["blocks"][1]["text"] == "Table 1.", cut
    text, _ = hpd.postprocess("<BLOCK>table [80,150,900,400]<CHILD><table><tr><td>\\[\na \\\\ b"
                              "</td><td>c</t", args)  # a display formula open too: both closed
    assert text == "<table><tr><td>\\[\na \\\\ b</td><td>c\n\\]</table>"
    text, _ = hpd.postprocess("<BLOCK>text [80,150,900,400]<CHILD>Where a <b", args)
    assert text == "Where a <b"  # no table open: the text is the model's


@pytest.mark.parametrize("answer, markdown", [
    ("<BLOCK>text [80,100,900,140]<CHILD>Para one.<FORK>text [80,150,900,190]<CHILD>Para two."
     "<FORK>list [80,200,900,400]<FORK>text [80,2", "Para one.Para two."),
    ("<BLOCK>table [80,150,900,400]<CHILD><table><tr><td>Q1</td></t",
     "<table><tr><td>Q1</td></table>"),
])
def test_hpd_run_cut_off_at_max_tokens_writes_no_half_head_or_tag(tmp_path, stub_server, answer,
                                                                   markdown):
    """A run whose server answers in HPD-Parsing's `<BLOCK>type [x1,y1,x2,y2]<CHILD>text` format
    with `<FORK>` child heads (MODEL-FACTS.md, HPD-Parsing, "Output"), cut off at max_tokens
    inside a child head or a table's cell tag: the Markdown column had the half-written head
    as words, or `</t</table>` (the table left open)."""
    hpd = load_script("hpd-parsing-saturate.py")
    (tmp_path / "answer.txt").write_text(answer, encoding="utf-8")
    stub = stub_server("--model", hpd.SERVED_NAME, "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    run = run_script("hpd-parsing-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", stub.url, "--no-sanity-check", "--max-tokens", "1000")
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["markdown"] == [markdown, markdown]


def test_deepseek_run_keeps_the_year_after_a_span_missing_its_closing_tag(tmp_path, stub_server):
    """A run whose server answers in DeepSeek-OCR's grounding format (MODEL-FACTS.md,
    DeepSeek-OCR, "Output") with one `<|/det|>` missing: the Markdown column lost the digits
    that began the paragraph after the box."""
    answer = ("<|ref|>title<|/ref|><|det|>[[63, 43, 935, 101]]<|/det|>\n# Annual Report\n\n"
              "<|ref|>text<|/ref|><|det|>[[63, 120, 935, 300]]\n2023 was a good year.")
    (tmp_path / "answer.txt").write_text(answer, encoding="utf-8")
    stub = stub_server("--model", "deepseek-ai/DeepSeek-OCR",
                       "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", stub.url, "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    markdown = "# Annual Report\n\n2023 was a good year."
    assert load_output(tmp_path / "out")["markdown"] == [markdown, markdown]


LIGHTON = "lightonai/LightOnOCR-3-0.8B"


def sent_size(markdown: str) -> tuple[int, int]:
    """The size of the image the stub received: it answers `# Page WxH` (tests/stub_server.py)."""
    width, height = markdown.split("\n")[0].removeprefix("# Page ").split("x")
    return int(width), int(height)


def test_lighton_max_pixels_caps_the_area_instead_of_the_edge(tmp_path, stub_server):
    """The authors' olmOCR-Bench pages are capped at 5 MP, not at a 2048 px edge (MODEL-FACTS.md,
    LightOnOCR-3, "Measured"): a 6 MP image is sent at under 5 MP on the 32 px grid, a 4.3 MP
    one (over 2048 px wide) as it is, and a Letter PDF page rendered at 400 DPI (15 MP) in the
    render worker under the same cap. The option recorded in inference_info; temperature sent."""
    from pages import page_image
    from pdfs import Page, make_pdf

    stub = stub_server("--model", LIGHTON)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(page_image(1, size=(3000, 2000)))
    (tmp_path / "in" / "b.png").write_bytes(page_image(2, size=(2400, 1800)))
    (tmp_path / "pdf").mkdir()
    (tmp_path / "pdf" / "doc.pdf").write_bytes(make_pdf([Page()]))
    options = ["--server", stub.url, "--no-sanity-check", "--max-pixels", "5000000",
               "--temperature", "0.1"]
    run = run_script("lighton-ocr3-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     *options)
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    large, small = (sent_size(markdown) for markdown in ds["markdown"])
    assert large == (2720, 1824)  # 3000x2000 * sqrt(5e6 / 6e6), each side floored to 32 px
    assert small == (2400, 1800)  # under the cap: as it is (the edge cap made it 2048x1536)
    settings = json.loads(ds["inference_info"][0])[0]["settings"]
    assert settings["max_pixels"] == 5000000 and settings["longest_edge"] is None, settings
    assert {request["temperature"] for request in stub.requests()} == {0.1}

    run = run_script("lighton-ocr3-saturate.py", str(tmp_path / "pdf"), str(tmp_path / "out-pdf"),
                     *options)
    assert run.returncode == 0, run.stderr
    width, height = sent_size(load_output(tmp_path / "out-pdf")["markdown"][0])
    assert width % 32 == height % 32 == 0 and 0.94 * 5e6 < width * height <= 5e6, (width, height)
    assert abs(width / height - 612 / 792) < 0.02 and height > 2048


# The authors' grounding output as their olmOCR-Bench provider documents it (github.com/lightonai/
# LightOnOCR, benchmarks/ocr_bench/providers/loocr_grounding.py, docstring): blocks separated by
# blank lines, each `![<label>](x1,y1,x2,y2) <text content>`, boxes 0-1000, `+` a continuation.
LIGHTON_MARGINS = (
    "![header](80,20,920,45) JOURNAL OF EXAMPLES, VOL. 3\n\n"
    "![title](80,60,920,100) # Results\n\n"
    "![paragraph](80,110,480,900) The first column ends\n\n"
    "![paragraph+](520,110,920,600) in the second one.\n\n"
    "![footnote](520,610,920,650) 1. A footnote is content.\n\n"
    "![footer](80,955,700,975) Printed in the example press\n\n"
    "![page_number](900,955,920,975) 17"
)


@pytest.mark.parametrize("drop", [True, False])
def test_lighton_drop_margins_leaves_margin_blocks_out_of_the_markdown_only(tmp_path, stub_server,
                                                                            drop):
    """--drop-margins (the authors' olmOCR-Bench runs, MODEL-FACTS.md, LightOnOCR-3): header,
    footer and page-number blocks leave the Markdown; the blocks column keeps every block."""
    (tmp_path / "answer.txt").write_text(LIGHTON_MARGINS, encoding="utf-8")
    stub = stub_server("--model", LIGHTON, "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 1, fmt="JPEG")
    run = run_script("lighton-ocr3-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", stub.url, "--no-sanity-check", "--mode", "grounding",
                     *(["--drop-margins"] if drop else []))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    body = "# Results\n\nThe first column ends in the second one.\n\n1. A footnote is content."
    margins = ["JOURNAL OF EXAMPLES, VOL. 3", "Printed in the example press", "17"]
    assert ds["markdown"][0] == (body if drop else "\n\n".join([margins[0], body, *margins[1:]]))
    blocks = ds["markdown_blocks"][0]
    assert [b["label"] for b in blocks] == ["header", "title", "paragraph", "paragraph+",
                                            "footnote", "footer", "page_number"]
    assert [blocks[i]["text"] for i in (0, 5, 6)] == margins
    assert json.loads(ds["inference_info"][0])[0]["settings"]["drop_margins"] is drop


@pytest.mark.parametrize("script", ["lighton-ocr3-saturate.py", "lighton-ocr3.py"])
def test_lighton_benchmark_options_a_run_cannot_honour_are_refused_before_any_work(tmp_path,
                                                                                    script):
    """--drop-margins in plain mode (the default) was accepted and recorded as dropping margins
    while plain mode has no blocks to drop; --max-pixels under one 32 px cell, or written as
    5e6, said only "invalid pixel_count value". Both now exit 2 naming the way out, with no
    OUTPUT made."""
    write_image_folder(tmp_path / "in", 1)
    base = [str(tmp_path / "in"), str(tmp_path / "out")]
    run = run_script(script, *base, "--drop-margins")
    assert run.returncode == 2, run.stderr
    assert "--drop-margins" in run.stderr and "add --mode grounding" in run.stderr, run.stderr
    for value in ("1000", "5e6"):
        run = run_script(script, *base, "--max-pixels", value)
        assert run.returncode == 2 and "at least 1024" in run.stderr, run.stderr
        assert "e.g. 5000000" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()
