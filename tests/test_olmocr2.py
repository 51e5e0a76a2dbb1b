"""olmocr2-server.py's own behaviour: the toolkit's prompt and request, the 1288 px page, the
YAML front matter parsed into typed columns, and a page the model says is rotated sent again
turned. Every model answer here follows the documented output format: MODEL-FACTS.md, "Candidate
models", allenai/olmOCR-2-7B-1025, "Output" ([OLM-fm] olmocr/train/front_matter.py, [OLM-prompts]
PageResponse) and "Rotation" ([OLM-pipe] olmocr/pipeline.py @f7cfe4c)."""

from __future__ import annotations

import asyncio
import io
import json
import types

import pytest

from conftest import load_output, load_script, run_script, write_parquet_dataset
from pages import page_image

SCRIPT = "olmocr2-server.py"
olm = load_script(SCRIPT)
ARGS = types.SimpleNamespace(max_tokens=8000, temperature=0.1, rotation_attempts=8,
                             keep_raw=False)


def answer(body: str, language="en", valid="True", correction="0", table="False",
           diagram="False") -> str:
    """A whole answer as the model writes it: front matter (the PageResponse fields, in the
    prompt's order), then the page's text."""
    return (f"---\nprimary_language: {language}\nis_rotation_valid: {valid}\n"
            f"rotation_correction: {correction}\nis_table: {table}\nis_diagram: {diagram}\n"
            f"---\n{body}")


def test_the_prompt_is_the_toolkits_and_goes_before_the_image():
    """MODEL-FACTS: build_no_anchoring_v4_yaml_prompt(), 557 characters, one newline before "If"
    and before "Return", "LateX" as the source spells it; the text part first [OLM-pipe l.135]."""
    assert len(olm.PROMPT) == 557 and olm.PROMPT.count("\n") == 2
    assert "\nIf there are any figures" in olm.PROMPT and "\nReturn your output" in olm.PROMPT
    assert "Convert equations to LateX and tables to HTML." in olm.PROMPT
    request = olm.build_request("data:image/png;base64,AAAA", ARGS)
    content = request["messages"][0]["content"]
    assert [part["type"] for part in content] == ["text", "image_url"]
    assert content[0]["text"] == olm.PROMPT
    assert request["temperature"] == 0.1 and request["max_tokens"] == 8000


@pytest.mark.parametrize("size, expected", [((612, 792), (995, 1288)), ((2550, 3300), (995, 1288)),
                                            ((4000, 1000), (1288, 322)), ((1288, 900), (1288, 900))])
def test_the_longest_side_becomes_1288_up_or_down(size, expected):
    assert olm.target_size(*size) == expected


def test_the_context_holds_the_largest_page_and_the_toolkits_max_tokens():
    """A 1288 px square is 46 x 46 tokens of 28 px; with the prompt it fits beside 8000."""
    assert olm.image_token_budget() == 46 * 46 + olm.PROMPT_TEXT_TOKENS
    assert olm.image_token_budget() + olm.DEFAULT_MAX_TOKENS <= olm.MAX_MODEL_LEN == 16384


def test_front_matter_becomes_typed_columns_and_the_body_the_markdown():
    body = "# Results\n\n<table><tr><td>1</td></tr></table>\n\n$$x^2$$"
    text, extras = olm.postprocess(answer(body + "\n", table="True"), ARGS)
    assert text == body
    assert extras == {"primary_language": "en", "is_rotation_valid": True,
                      "rotation_correction": 0, "is_table": True, "is_diagram": False}
    assert set(extras) | {"raw"} == set(olm.EXTRA_COLUMNS)
    kept = olm.postprocess(answer(body), types.SimpleNamespace(keep_raw=True))[1]["raw"]
    assert kept == answer(body)  # --keep-raw: what the model wrote, front matter and all


def test_values_the_yaml_could_misread_keep_their_meaning():
    """Norwegian is `no` (YAML 1.1 would read False), a null language is null, lower-case
    booleans are booleans (the guided regex allows True|False|true|false [OLM-pipe l.180])."""
    _, extras = olm.postprocess(answer("Hei", language="no", valid="true", diagram="false"), ARGS)
    assert extras["primary_language"] == "no" and extras["is_rotation_valid"] is True
    assert extras["is_diagram"] is False
    _, extras = olm.postprocess(answer("", language="null", correction="90"), ARGS)
    assert extras["primary_language"] is None and extras["rotation_correction"] == 90


def test_a_value_not_of_its_type_is_null_and_the_rest_are_kept():
    _, extras = olm.postprocess(answer("text", valid="maybe", correction="ninety"), ARGS)
    assert extras["is_rotation_valid"] is None and extras["rotation_correction"] is None
    assert extras["primary_language"] == "en" and extras["is_table"] is False


@pytest.mark.parametrize("raw", [
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_corr",  # cut inside it
    "---\n: : [unbalanced\n---\nbody",  # YAML that does not parse
    "---\n- a list\n- not a mapping\n---\nbody",
    "A page without any front matter.",
])
def test_an_answer_without_a_readable_front_matter_is_kept_whole(raw):
    text, extras = olm.postprocess(raw, ARGS)
    assert text == raw and set(extras.values()) == {None}


def test_an_answer_cut_in_its_body_keeps_its_columns_and_an_empty_one_is_empty():
    text, extras = olm.postprocess(answer("The first line of a long page that was cu"), ARGS)
    assert text == "The first line of a long page that was cu" and extras["is_table"] is False
    assert olm.postprocess("", ARGS) == ("", dict.fromkeys(olm.FRONT_MATTER))
    assert olm.postprocess(answer(""), ARGS)[0] == ""


def test_a_documents_row_keeps_a_scalar_column_only_where_its_pages_agree():
    pages = [(1, olm.RowResult(text="a", extras={"primary_language": "en", "is_table": True,
                                                "is_diagram": False, "is_rotation_valid": True,
                                                "rotation_correction": 0})),
             (2, olm.RowResult(text="b", extras={"primary_language": "de", "is_table": True,
                                                "is_diagram": True, "is_rotation_valid": True,
                                                "rotation_correction": 0}))]
    joined = olm.joined_pages(pages).extras
    assert joined["is_table"] is True and joined["rotation_correction"] == 0
    assert joined["is_diagram"] is None
    assert joined["primary_language"] == "<!-- page 1 -->\n\nen\n\n<!-- page 2 -->\n\nde"


# ---- pages the model says are rotated ------------------------------------------------------

RED, GREEN, BLUE, YELLOW, GREY = "255,0,0", "0,255,0", "0,0,255", "255,255,0", "128,128,128"


def quadrants(width=400, height=300, corners=(RED, GREEN, BLUE, YELLOW)) -> bytes:
    """A page whose four quarters (top-left, top-right, bottom-right, bottom-left) have their own
    colour: the colour at the top-left pixel says which way up it was sent."""
    from PIL import Image

    img = Image.new("RGB", (width, height))
    boxes = [(0, 0, width // 2, height // 2), (width // 2, 0, width, height // 2),
             (width // 2, height // 2, width, height), (0, height // 2, width // 2, height)]
    for box, colour in zip(boxes, corners):
        img.paste(tuple(map(int, colour.split(","))), box)
    # a line of ink at the centre, which no turn moves to a corner: a page, not a blank one
    img.paste((0, 0, 0), (width // 2 - 20, height // 2 - 2, width // 2 + 20, height // 2 + 2))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


# Read counter-clockwise turns from the page as stored: red's top-left is the stored way up;
# 90 brings the top-right (green) there, 180 the bottom-right (blue), 270 the bottom-left
# (yellow). The model says the stored page needs 90, then, seeing green, 180 more: the page is
# upright at 270 in all (cumulative), never at a relative 180 (blue) or a clockwise 90 (yellow
# after one turn would end at two sends).
CORNER_ANSWERS = {
    RED: answer("sideways", valid="False", correction="90"),
    GREEN: answer("still sideways", valid="False", correction="180"),
    YELLOW: answer("# Upright\n\n<table><tr><td>1</td></tr></table>", table="True"),
    BLUE: answer("WRONG: turned by the last correction alone", language="xx"),
    GREY: answer("always said rotated", valid="False", correction="90"),
}


def test_a_rotated_page_is_sent_again_turned_by_the_summed_corrections(tmp_path, stub_server):
    """Through the stub, the script's own run: the first three pages are all said rotated (a
    sideways scan), so the degenerate check must not count a turned page as a broken one."""
    (tmp_path / "answers.json").write_text(json.dumps(CORNER_ANSWERS))
    stub = stub_server("--model", olm.MODEL_ID, "--corner-answers", str(tmp_path / "answers.json"))
    cells = [quadrants(), quadrants(300, 400), quadrants(corners=(GREY,) * 4),
             quadrants(corners=(YELLOW,) * 4)]
    source = write_parquet_dataset(tmp_path / "in", cells)
    run = run_script(SCRIPT, str(source), str(tmp_path / "out"), "--server", stub.url,
                     "--sanity-pages", "3", "--concurrency", "1", "--keep-raw",
                     "--stats-json", str(tmp_path / "stats.json"))
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == ["# Upright\n\n<table><tr><td>1</td></tr></table>"] * 2 + [
        "always said rotated", "# Upright\n\n<table><tr><td>1</td></tr></table>"]
    assert ds["markdown_attempts"] == [3, 3, 8, 1]  # the toolkit's bound: 8 sends in all
    assert ds["markdown_is_rotation_valid"] == [True, True, False, True]  # the last answer's
    assert ds["markdown_rotation_correction"] == [0, 0, 90, 0]
    assert ds["markdown_is_table"] == [True, True, False, True]
    assert ds["markdown_primary_language"] == ["en"] * 4
    assert ds["markdown_raw"] == [CORNER_ANSWERS[c] for c in (YELLOW, YELLOW, GREY, YELLOW)]
    assert ds.features["markdown_is_table"].dtype == "bool"
    assert ds.features["markdown_rotation_correction"].dtype == "int32"
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["pages_loop_retried"] == 0  # a turned page did not loop
    card = (tmp_path / "out" / "README.md").read_text()
    assert olm.MODEL_CARD_NOTE in card and '"rotation_attempts": 8' in card
    requests = stub.requests()
    assert len(requests) == 3 + 3 + 8 + 1
    assert {r["temperature"] for r in requests} == {olm.TEMPERATURE}  # as the first send
    assert all([p["type"] for p in r["messages"][0]["content"]] == ["text", "image_url"]
               for r in requests)


def test_rotation_attempts_bounds_the_sends_and_1_never_turns(tmp_path, stub_server):
    (tmp_path / "answers.json").write_text(json.dumps(CORNER_ANSWERS))
    stub = stub_server("--model", olm.MODEL_ID, "--corner-answers", str(tmp_path / "answers.json"))
    source = write_parquet_dataset(tmp_path / "in", [quadrants(corners=(GREY,) * 4), quadrants()])
    for attempts in (1, 2):
        out = tmp_path / f"out{attempts}"
        run = run_script(SCRIPT, str(source), str(out), "--server", stub.url, "--no-sanity-check",
                         "--rotation-attempts", str(attempts))
        assert run.returncode == 0, run.stderr[-3000:]
        ds = load_output(out)
        assert ds["markdown_attempts"] == [attempts] * 2
        assert ds["markdown"][1] == ("sideways", "still sideways")[attempts - 1]
    refused = run_script(SCRIPT, str(source), str(tmp_path / "out0"), "--server", stub.url,
                         "--rotation-attempts", "0")
    assert refused.returncode == 2 and "--rotation-attempts" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_temperature_vllm_refuses_is_refused_before_anything_runs(tmp_path):
    """vLLM refuses a negative temperature (every page would be a 400); nan is no number."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(page_image(1))
    for value in ("-0.5", "nan", "inf"):
        refused = run_script(SCRIPT, str(folder), str(tmp_path / "out"), "--server",
                             "http://127.0.0.1:9", "--check-only", "--temperature", value)
        assert refused.returncode == 2 and "--temperature" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert not (tmp_path / "out").exists()


def turned_result(text: str, attempts: int = 1):
    return olm.RowResult(text=text, finish_reason="stop", attempts=attempts)


def run_turned(first, replies: list):
    """send_turned() with a `send` that answers from `replies`, recording the pages it got."""
    body = olm.request_body(olm.prepare_page(quadrants()), "m", ARGS)
    sent = []

    async def send(again: bytes):
        sent.append(again)
        return replies.pop(0)
    return asyncio.run(olm.send_turned(send, body, first, ARGS)), sent


def test_a_turned_send_the_server_fails_leaves_the_row_for_a_rerun():
    result, sent = run_turned(turned_result(CORNER_ANSWERS[RED]),
                              [olm.error_row("HTTP 503: busy", olm.SERVER)])
    assert len(sent) == 1 and result.error_kind == olm.SERVER and "turned" in result.error


def test_a_turned_page_the_server_refuses_keeps_the_last_answer_and_counts_the_send():
    first = turned_result(CORNER_ANSWERS[RED])
    result, _ = run_turned(first, [olm.error_row("HTTP 400: too small", olm.PAGE)])
    assert result.text == CORNER_ANSWERS[RED] and result.error is None
    assert result.attempts == 2 and result.resent == 1


def test_loop_retries_of_a_turned_page_count_and_still_count_as_a_loop():
    result, sent = run_turned(turned_result(CORNER_ANSWERS[RED]),
                              [turned_result(CORNER_ANSWERS[YELLOW], attempts=2)])
    assert result.attempts == 3 and result.resent == 1
    assert (result.attempts - result.resent) > 1  # what the degenerate check and stats read
    from PIL import Image
    page = json.loads(sent[0])["messages"][0]["content"][1]["image_url"]["url"]
    assert page.startswith("data:image/png;base64,")
    import base64
    turned = Image.open(io.BytesIO(base64.b64decode(page.split(",", 1)[1])))
    assert turned.size == (966, 1288) and turned.getpixel((0, 0))[:3] == (0, 255, 0)
