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
