"""glm-ocr-server.py's model section: the authors' clean-up of an answer, its requests, its
image bound and its dataset card.

The clean-up is the SDK's, as MODEL-FACTS.md gives it (GLM-OCR, "Clean-up of every region
(`_clean_content`)" [GLM-SDK] result_postprocess_utils.py). No source shows what the model
writes for a whole page under `Text Recognition:` (MODEL-FACTS.md, "Not found / open"): the
page fixture below is built from the card's description of the output (MODEL-FACTS.md, GLM-OCR,
"Output (whole page, VLM only)": Markdown text, LaTeX formulas, HTML tables [UV-glm docstring]
[GLM-SDK formatter]), not taken from a real answer.
"""

from __future__ import annotations

import json
import subprocess
import types

import pytest

from conftest import load_output, load_script, run_script, write_image_folder
from engine import engine_or_skip
import engine_env

SCRIPT = "glm-ocr-server.py"
glm = load_script(SCRIPT)

# Markdown with a heading, a paragraph with inline LaTeX, display LaTeX and an HTML table
GLM_PAGE = (
    "# Quarterly Report\n\n"
    "Revenue grew by 12% in the quarter, as $r = \\frac{a}{b}$ shows.\n\n"
    "$$\nE = mc^2\n$$\n\n"
    "<table><tr><td>Region</td><td>Sales</td></tr>\n<tr><td>North</td><td>42</td></tr></table>\n\n"
    "Footnote: see page 2."
)
# Varied text of over 2,048 characters, so the SDK's repetition cuts apply after it
PROSE = "".join(f"Line {i}: the {i * 7 % 13}th entry of the ledger reads {i * 37 % 101}.\n"
                for i in range(60))


def args(**overrides):
    return types.SimpleNamespace(**{"keep_raw": False, "task": "text", "max_tokens": 8192,
                                    "repetition_detection": False, **overrides})


def test_a_clean_page_in_the_cards_format_comes_back_as_it_was():
    """Tables, display and inline math, headings: nothing in a well-formed page is the
    clean-up's to change."""
    assert len(PROSE) >= glm.LONG_ANSWER
    for page in (GLM_PAGE, PROSE + GLM_PAGE):
        assert glm.postprocess(page, args()) == (page, {})


@pytest.mark.parametrize("raw, clean", [
    ("\\tA heading\\t\\t", "A heading"),  # the two characters `\t`, at either end
    ("\t\tA heading\t", "A heading"),  # a tab character too
    ("a\\tb\tc", "a\\tb\tc"),  # inside, kept
    ("Contents..........5", "Contents...5"),
    ("Name: ________ Date: ___", "Name: ___ Date: ___"),
    ("Sign: \\_\\_\\_\\_\\_\\_", "Sign: \\_\\_\\_"),
    ("a····b", "a···b"),
    ("Wait... and . . . more", "Wait... and . . . more"),
])
def test_edge_tabs_go_and_leader_runs_collapse_to_three(raw, clean):
    assert glm.clean_answer(raw) == clean


@pytest.mark.parametrize("raw, clean", [
    ("where $ x + y $ is", "where $x + y$ is"),
    ("the value$ x $holds", "the value $x$ holds"),  # spaced from the letters it touches
    ("($ x $)", "($x$)"),  # not from other characters
    ("$$ x $$", "$$ x $$"),  # display math is not inline
    ("\\$ 5 \\$", "\\$ 5 \\$"),  # escaped dollars are text
    ("costs $5 and $6 today", "costs $5 and $6 today"),  # prices, not math (this script's guard)
    ("a $ $ b", "a $ $ b"),
])
def test_inline_math_is_trimmed_and_spaced_from_letters(raw, clean):
    assert glm.clean_answer(raw) == clean


def test_a_long_answer_ends_after_the_first_copy_of_a_unit_repeated_ten_times():
    unit = "<td>0.00</td>"  # 13 characters
    assert glm.clean_answer(PROSE + unit * 40) == PROSE + unit
    assert glm.clean_answer(PROSE + unit * 9 + "end") == PROSE + unit * 9 + "end"  # 9: kept
    short = "Total\n" + unit * 40  # under 2,048 characters: the SDK leaves it
    assert len(short) < glm.LONG_ANSWER and glm.clean_answer(short) == short


def test_the_first_start_wins_then_the_shortest_unit():
    earlier, later = "ABCDEFGHIJKL" * 10, "0123456789" * 10
    assert glm.clean_answer(PROSE + earlier + later) == PROSE + "ABCDEFGHIJKL"
    both = "abcdefghij" * 20  # units of 10 and of 20 characters repeat from one start
    assert glm.clean_answer(PROSE + both) == PROSE + "abcdefghij"


def test_the_repeated_unit_search_finds_what_a_plain_scan_finds():
    """The fast search against the rule read literally: every start in order, every unit
    length from 10, ten copies in a row."""
    import random

    def plain(text):
        for start in range(len(text)):
            for length in range(10, (len(text) - start) // 10 + 1):
                if text[start:start + 10 * length] == text[start:start + length] * 10:
                    return start, length
        return None

    rng = random.Random(5)
    for _ in range(300):
        unit = "".join(rng.choice("ab ") for _ in range(rng.randint(1, 30)))
        text = "".join(rng.choice("ab \n") for _ in range(rng.randint(0, 60))) + \
            unit * rng.randint(0, 25) + "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        assert glm.first_repeated_unit(text) == plain(text), text


# One table row of distinct cells (no unit of its own repeats), twelve times, separated by
# one and two newlines in turn: never ten copies in a row of one unit, so the repeated-unit
# cut leaves it to the repeated-line cut
ROW = "| Item | Qty | Price | " + " | ".join(f"c{k}" for k in range(40)) + " |"
ROWS = "".join(ROW + ("\n" if i % 2 else "\n\n") for i in range(12))


def test_a_long_answer_of_one_line_over_and_over_ends_after_its_first_three_copies():
    """Twelve copies of one line among fourteen non-empty lines (86%)."""
    text = "Intro line of the table\n" + ROWS + "Closing words."
    assert len(text) >= glm.LONG_ANSWER and glm.first_repeated_unit(text) is None
    assert glm.clean_answer(text) == "Intro line of the table\n" + ROW + "\n\n" + ROW + "\n" + ROW
    mostly_other = PROSE + ROWS  # 12 of 72 non-empty lines: under 80%, kept
    assert glm.clean_answer(mostly_other) == mostly_other


def test_an_answer_cut_by_max_tokens_keeps_what_was_written():
    """An answer that reached max_tokens mid-table: the SDK's clean-up closes nothing, and
    neither does this script."""
    cut = "# Report\n\n<table><tr><td>Region</td><td>Sa"
    assert glm.postprocess(cut, args()) == (cut, {})


def test_an_empty_or_malformed_answer_is_kept_not_raised():
    assert glm.postprocess("", args()) == ("", {})
    assert glm.postprocess("", args(keep_raw=True)) == ("", {"raw": ""})
    for raw in ["$", "$$$", "\\", "\\t", "\x00", "$" * 5000, "é" * 3000, "ab" * 5000]:
        text, _ = glm.postprocess(raw, args())
        assert isinstance(text, str)


def test_keep_raw_keeps_the_answer_as_the_model_wrote_it():
    raw = "\\tTitle......... $ x $\\t"
    assert glm.postprocess(raw, args(keep_raw=True)) == ("Title... $x$", {"raw": raw})


def request(seed=None, **overrides) -> dict:
    head, tail = glm.request_json("zai-org/GLM-OCR", args(**overrides), seed)
    return json.loads(head + b"data:image/jpeg;base64,AAAA" + tail)


def test_the_request_is_the_image_then_the_prompt_with_the_sdks_sampling():
    """MODEL-FACTS.md, GLM-OCR, "Prompts" (image first, then the text, one user turn) and
    "Sampling" (SDK: temperature 0.0, repetition_penalty 1.1, max_tokens 8192)."""
    body = request()
    (turn,) = body["messages"]
    assert turn["role"] == "user"
    assert [part["type"] for part in turn["content"]] == ["image_url", "text"]
    assert turn["content"][1]["text"] == "Text Recognition:"
    assert body["temperature"] == 0.0 and body["repetition_penalty"] == 1.1
    assert body["max_tokens"] == glm.DEFAULT_MAX_TOKENS == 8192
    assert request(task="table")["messages"][0]["content"][1]["text"] == "Table Recognition:"
    assert request(task="formula")["messages"][0]["content"][1]["text"] == "Formula Recognition:"


def test_a_looping_pages_second_try_can_sample():
    """The SDK's top_k 1 and top_p 0.00001 restate greedy decoding, which temperature 0 already
    gives; sent, they would make the loop retry (at LOOP_TEMPERATURE, with a seed) greedy again."""
    retry = request(seed=7)
    assert retry["temperature"] == glm.LOOP_TEMPERATURE > 0 and retry["seed"] == 7
    assert retry.get("top_k", -1) in (-1, 0) and retry.get("top_p", 1.0) == 1.0


def test_serve_flags_are_the_authors_speculative_config_and_the_projects_rule():
    """MODEL-FACTS.md, GLM-OCR, "Serve commands": MTP with 3 speculative tokens (the authors'
    current README); the project's three OCR flags; no remote code."""
    flags = glm.SERVE_ARGS
    assert json.loads(flags[flags.index("--speculative-config") + 1]) == {
        "method": "mtp", "num_speculative_tokens": 3}
    assert "--trust-remote-code" not in flags
    assert int(flags[flags.index("--max-model-len") + 1]) == glm.MAX_MODEL_LEN
    assert glm.image_token_budget() + glm.DEFAULT_MAX_TOKENS <= glm.MAX_MODEL_LEN


def test_the_image_budget_is_the_processors_two_frame_ceiling():
    """MODEL-FACTS.md, GLM-OCR, "Images": 12,544..9,633,792 px over two frames, at most 6,144
    image tokens; the SDK renders PDFs at 200 DPI and sends JPEG."""
    assert glm.frame_pixel_bounds() == (6272, 4816896)
    assert glm.image_token_budget() == 6144 + glm.PROMPT_TEXT_TOKENS
    assert glm.target_size(6000, 4000) == (2688, 1792)  # 96 x 64 tokens: 6,144
    assert glm.target_size(1700, 2200) == (1700, 2200)  # a letter page at 200 DPI goes as is
    assert glm.PDF_DPI == 200 and glm.PAGE_FORMAT == "jpeg"


GLM46V_RESIZE = """
import json, sys
from transformers.models.glm46v.image_processing_glm46v import Glm46VImageProcessor, smart_resize
pages = json.loads(sys.argv[1])
size = {"shortest_edge": 12544, "longest_edge": 9633792}
processor = Glm46VImageProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
out = []
for w, h in pages:
    rh, rw = smart_resize(num_frames=2, height=h, width=w, factor=28, min_pixels=12544,
                          max_pixels=9633792, temporal_factor=2)
    patches = processor.get_number_of_image_patches(h, w, {})
    out.append([rw, rh, patches // 4])
print(json.dumps(out))
"""


@pytest.mark.engine
def test_a_page_is_sent_at_the_size_the_real_processor_gives_it():
    """transformers' Glm46VImageProcessor (GLM-OCR's, MODEL-FACTS.md "Images"), run in the CPU
    engine's environment: a page the processor would shrink is sent at exactly its size (which
    it then keeps); any other goes as it is; no page takes more than 6,144 image tokens, and
    the 6000x4000 page the third party measured takes exactly that."""
    engine_or_skip()
    from test_patch_grid import sample_pages

    pages = sample_pages()
    sent = [glm.target_size(w, h) for w, h in pages]
    run = subprocess.run([str(engine_env.python()), "-c", GLM46V_RESIZE,
                          json.dumps(pages + sent)], capture_output=True, text=True,
                         env=engine_env.engine_environ(), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    real = json.loads(run.stdout.strip().splitlines()[-1])
    of_page, of_sent = real[:len(pages)], real[len(pages):]
    for page, target, (w, h, tokens), again in zip(pages, sent, of_page, of_sent):
        if target != page:
            assert target == (w, h) and again[:2] == [w, h], (page, target, (w, h), again)
        elif min(page) >= 28:  # not shrunk: at least the page's own grid (a thinner page the
            # processor first scales up to 28 px)
            assert tokens >= glm.patch_grid_tokens(*glm.snap_to_patch_grid(*page, 28), 28), page
        assert tokens <= 6144
    assert of_page[pages.index((6000, 4000))][2] == 6144


def test_a_run_writes_the_clean_answer_the_raw_one_and_the_cards_warning(tmp_path, stub_server):
    """Through the driver: each row's Markdown is the clean-up of the answer, --keep-raw keeps
    the answer, the request carries `Text Recognition:`, and the dataset card says what serving
    the VLM alone leaves out (MODEL-FACTS.md, "Notes that apply across these candidates")."""
    raw = "\\t" + PROSE + "<td>0</td>" * 30
    (tmp_path / "answer.txt").write_text(raw, encoding="utf-8")
    stub = stub_server("--model", glm.MODEL_ID, "--answer-file", str(tmp_path / "answer.txt"))
    write_image_folder(tmp_path / "in", 2, fmt="JPEG")
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--no-sanity-check", "--keep-raw")
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [PROSE + "<td>0</td>"] * 2
    assert ds["markdown_raw"] == [raw] * 2
    assert {tuple(r["texts"]) for r in stub.requests()} == {("Text Recognition:",)}
    card = (tmp_path / "out" / "README.md").read_text()
    assert glm.MODEL_CARD_NOTE in card and "94.62" in card and "PP-DocLayoutV3" in card
