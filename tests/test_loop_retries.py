"""Pages that loop (issues #17, item 4, and #29, item 1): an answer cut in a loop (at
max_tokens with a repeated tail, or by vLLM's repetition detection) is sent again at
LOOP_TEMPERATURE with a seed from its row; the attempt that does not loop is kept, else the one
with the most text before its repeating tail; `<column>_attempts` records it, the stats and the
card count it. A complete answer is never sent again, whatever it repeats (a blank form).

The stub's and the fake vllm's `--loop-below T` fault answers a loop to a request below
temperature T (0.25: greedy pages loop and retries do not; 9: everything loops), cut at
max_tokens or, with `--loop-finish repetition` (FAKE_VLLM_LOOP_FINISH), by detection.
The real engine's looping checkpoint is in test_engine.py.
"""

from __future__ import annotations

import json
import os
import types

import pytest

from conftest import (ROOT, SERVER_SCRIPTS, expected_text, load_output, load_script, run_script,
                      write_image_folder)

OVIS = "ovis-ocr2-server.py"
LOOP_LINE = "the same line again"
ovis = load_script(OVIS)


# ---- the pieces --------------------------------------------------------------------------------

def test_what_counts_as_a_loop():
    page = "# Title\n\nA normal page of text with several words, and a table.\n"
    loop = page + "the same line again\n" * 20
    assert ovis.loops(loop, "length") and ovis.loops(loop, "repetition")
    assert not ovis.loops(loop, "stop")  # a complete answer is never sent again (#29)
    assert ovis.loops("a line", "repetition")  # the engine saw the loop: no judging it again
    assert not ovis.loops("", "length") and not ovis.loops("  \n", "stop")  # blank: not a loop
    assert not ovis.loops(page, "length")  # cut short, but no repeated tail
    # a tail repeated 5 times over 100+ chars counts only when the budget ran out
    short_loop = page * 8 + "| x | y |\n" * 10
    assert not ovis.looks_degenerate(short_loop)
    assert ovis.loops(short_loop, "length") and not ovis.loops(short_loop, "stop")
    assert not ovis.loops(page * 8 + "| x | y |\n" * 4, "length")  # 4 repeats: a table, not a loop


def test_the_seed_comes_from_the_row_and_the_attempt():
    seeds = {ovis.loop_seed(row, attempt) for row in range(1000) for attempt in (1, 2)}
    assert len(seeds) == 2000 and all(0 <= s < 2 ** 31 for s in seeds)
    assert ovis.loop_seed(7, 1) == ovis.loop_seed(7, 1)


def test_the_kept_attempt_is_the_one_that_does_not_loop_else_the_one_with_more_text():
    R = ovis.RowResult
    looping = lambda n: R(text="x\n" + "again and again\n" * n, finish_reason="length", attempts=1)  # noqa: E731
    clean = R(text="a clean page", finish_reason="stop", attempts=1)
    kept = ovis.kept_attempt(looping(30), clean)
    assert kept.text == "a clean page" and kept.attempts == 2
    # both loop: the one with more text before its loop, not the shorter (#29)
    further = R(text="x\nmore rows\n" + "again and again\n" * 40, finish_reason="length",
                attempts=1)
    assert ovis.kept_attempt(looping(20), further).text == further.text
    assert ovis.kept_attempt(further, looping(20)).text == further.text
    assert ovis.kept_attempt(looping(30), looping(20)).text == looping(30).text  # a tie: the first
    failed = ovis.kept_attempt(looping(20), ovis.error_row("HTTP 500", ovis.SERVER))
    assert failed.text is None and failed.error_kind == "server"  # a rerun redoes the page
    assert "looped, and sending it again failed: HTTP 500" in failed.error
    refused = ovis.kept_attempt(looping(20), ovis.error_row("HTTP 400: seed", ovis.PAGE))
    assert refused.text == looping(20).text and refused.error is None and refused.attempts == 1
    assert ovis.kept_attempt(kept, looping(5)).attempts == 3


def test_a_retry_body_is_the_same_request_with_the_loop_temperature_and_seed():
    args = types.SimpleNamespace(max_tokens=100, keep_image_tags=False)
    page = ovis.PreparedPage(data=b"\x89PNG page bytes", mime="image/png", width=1, height=1,
                             passthrough=True)
    body = ovis.request_body(page, "m", args)
    first = ovis.loop_retry_body(body, "m", args, 1234, None)
    second = ovis.loop_retry_body(first, "m", args, 99, 1234)
    original = json.loads(body)
    for retry, seed in ((first, 1234), (second, 99)):
        sent = json.loads(retry)
        assert sent.pop("seed") == seed and sent.pop("temperature") == ovis.LOOP_TEMPERATURE
        assert sent == {k: v for k, v in original.items() if k != "temperature"}


# ---- server scripts against the stub ------------------------------------------------------------

def served_name(script: str) -> str:
    module = load_script(script)
    return getattr(module, "SERVED_NAME", module.MODEL_ID)


def loop_run(tmp_path, stub_server, script, stub_args, *extra, pages=6, out="out"):
    stub = stub_server("--model", served_name(script), *stub_args)
    paths = write_image_folder(tmp_path / "in", pages)
    stats_path = tmp_path / f"{out}.stats.json"
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / out), "--server", stub.url,
                     "--max-tokens", "1000", "--no-sanity-check", "--stats-json", str(stats_path),
                     *extra)
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    return run, stub, paths, stats


@pytest.mark.parametrize("script", SERVER_SCRIPTS)
def test_a_looping_page_is_sent_again_and_the_clean_answer_kept(tmp_path, stub_server, script):
    module = load_script(script)
    run, stub, paths, stats = loop_run(tmp_path, stub_server, script, ["--loop-below", "0.25"])
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 6
    assert set(ds["markdown_finish_reason"]) == {"stop"}
    assert not any(LOOP_LINE in text for text in ds["markdown"]), ds["markdown"]
    if script == OVIS:
        assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    sent = sorted(stub.requests(), key=lambda r: r["n"])
    assert len(sent) == 12
    firsts = [r for r in sent if "seed" not in r]
    retries = [r for r in sent if "seed" in r]
    assert len(firsts) == 6 and all(r["temperature"] < module.LOOP_TEMPERATURE for r in firsts)
    assert all(r["temperature"] == module.LOOP_TEMPERATURE for r in retries)
    assert sorted(r["seed"] for r in retries) == sorted(module.loop_seed(i, 1) for i in range(6))
    assert stats["pages_loop_retried"] == 6 and stats["pages_still_looping"] == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "6 pages looped and were sent again at temperature 0.3" in card
    assert "0 still loop" in card and "`markdown_attempts`" in card


def test_a_page_that_loops_on_every_attempt_keeps_the_one_with_more_text(tmp_path, stub_server):
    run, stub, paths, stats = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "9"])
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 6
    assert set(ds["markdown_finish_reason"]) == {"length"}
    # the stub's greedy loop is 40 lines; a seeded one reads a line further, then loops 20 to
    # 34 lines: the retry is kept for its text, cut at max_tokens it keeps its whole loop
    for i, text in enumerate(ds["markdown"]):
        assert f"read further at seed {ovis.loop_seed(i, 1)}." in text, text
        assert text.count(LOOP_LINE) == 20 + ovis.loop_seed(i, 1) % 15, text
    assert stats["pages_loop_retried"] == 6 and stats["pages_still_looping"] == 6
    assert "6 still loop" in (tmp_path / "out" / "README.md").read_text()


def test_loop_retries_0_sends_each_page_once(tmp_path, stub_server):
    run, stub, paths, stats = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "9"],
                                       "--loop-retries", "0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(stub.requests()) == 6 and not any("seed" in r for r in stub.requests())
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [1] * 6
    assert all(text.count(LOOP_LINE) == 40 for text in ds["markdown"])
    assert stats["pages_loop_retried"] == 0 and stats["pages_still_looping"] == 6
    assert "not sent again (`--loop-retries 0`)" in (tmp_path / "out" / "README.md").read_text()


def test_two_retries_stop_at_the_first_clean_answer_and_a_clean_page_is_sent_once(tmp_path,
                                                                                  stub_server):
    run, stub, paths, stats = loop_run(tmp_path, stub_server, OVIS, [], "--loop-retries", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(stub.requests()) == 6
    assert load_output(tmp_path / "out")["markdown_attempts"] == [1] * 6
    assert stats["pages_loop_retried"] == 0 and stats["pages_still_looping"] == 0
    run, stub, paths, stats = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "9"],
                                       "--loop-retries", "2", out="out2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert load_output(tmp_path / "out2")["markdown_attempts"] == [3] * 6
    assert sorted(r["seed"] for r in stub.requests() if "seed" in r) == \
        sorted(ovis.loop_seed(i, a) for i in range(6) for a in (1, 2))


def test_a_rerun_sends_the_same_seeds_and_another_loop_retries_is_refused(tmp_path, stub_server):
    run, stub, paths, _ = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "9"])
    assert run.returncode == 0, run.stderr[-3000:]
    first_seeds = {r["seed"] for r in stub.requests() if "seed" in r}
    first_texts = load_output(tmp_path / "out")["markdown"]
    base = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url, "--max-tokens",
            "1000", "--no-sanity-check"]
    refused = run_script(OVIS, *base, "--loop-retries", "0")
    assert refused.returncode == 2 and "loop_retries" in refused.stderr, refused.stderr
    assert "--restart" in refused.stderr
    sent = len(stub.requests())
    again = run_script(OVIS, *base, "--restart")
    assert again.returncode == 0, again.stderr[-3000:]
    assert {r["seed"] for r in stub.requests()[sent:] if "seed" in r} == first_seeds
    assert load_output(tmp_path / "out")["markdown"] == first_texts


def test_a_resumed_output_keeps_the_attempts_column_on_every_row(tmp_path, stub_server):
    run, stub, _, _ = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "0.25"],
                               "--max-samples", "3", "--part-rows", "2", pages=7)
    assert run.returncode == 0, run.stderr[-3000:]
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--max-tokens", "1000", "--no-sanity-check", "--part-rows", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == 7 and ds["markdown_attempts"] == [2] * 7


@pytest.mark.parametrize("fault", [["--degenerate"], ["--loop-below", "0.25"],
                                   ["--loop-below", "9", "--loop-finish", "repetition"]],
                         ids=["retries-loop-too", "retries-clean", "cut-by-detection"])
def test_every_page_looping_still_trips_the_degenerate_check(tmp_path, stub_server, fault):
    """Whether the retries loop too or not: an engine whose first pages all loop is suspect
    (a broken engine's loop can become noise at a higher temperature)."""
    stub = stub_server(*fault)
    write_image_folder(tmp_path / "in", 4)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--sanity-pages", "4", "--max-tokens", "1000")
    assert run.returncode == 3, run.stderr[-3000:]
    # each looping page was given its second chance first; a complete answer, even "aaa...",
    # is never sent again (#29), but still counts as a broken engine's
    assert len(stub.requests()) == (4 if fault == ["--degenerate"] else 8)
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))


BLANK_FORM = "# Attendance\n\n| Name | Signature |\n| --- | --- |\n" + "|  |  |\n" * 40
BLANK_HTML = "<table><tr><td>Name</td><td>Date</td></tr>" + "<tr><td></td><td></td></tr>" * 60 \
    + "</table>"


@pytest.mark.parametrize("form", [BLANK_FORM, BLANK_HTML], ids=["markdown", "html"])
def test_a_complete_blank_form_is_sent_once_and_passes_the_first_pages_check(tmp_path, stub_server,
                                                                            form):
    """#29: a page the model ended itself (finish_reason stop) is never sent again, however
    many identical rows it has; the first-pages check (on: no --no-sanity-check) lets it pass."""
    stub = stub_server("--content", json.dumps(form))
    write_image_folder(tmp_path / "in", 4)
    stats_path = tmp_path / "stats.json"
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--max-tokens", "1000", "--sanity-pages", "4", "--stats-json", str(stats_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(stub.requests()) == 4 and not any("seed" in r for r in stub.requests())
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [form.strip()] * 4 and ds["markdown_attempts"] == [1] * 4
    stats = json.loads(stats_path.read_text())
    assert stats["pages_loop_retried"] == 0 and stats["pages_still_looping"] == 0


def test_a_page_cut_by_repetition_detection_keeps_its_text_and_one_copy_of_the_loop(tmp_path,
                                                                                   stub_server):
    """finish_reason "repetition" (vLLM's repetition_detection ended it): sent again like a
    loop cut at max_tokens; the kept text ends with one copy of the repeating unit."""
    run, stub, paths, stats = loop_run(tmp_path, stub_server, OVIS,
                                       ["--loop-below", "9", "--loop-finish", "repetition"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(stub.requests()) == 12
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 6
    assert set(ds["markdown_finish_reason"]) == {"repetition"}
    for i, (text, path) in enumerate(zip(ds["markdown"], paths)):
        seed = ovis.loop_seed(i, 1)
        assert text == f"{expected_text(path.read_bytes())}\nread further at seed {seed}.\n" \
            f"{LOOP_LINE}", text
    assert stats["pages_loop_retried"] == 6 and stats["pages_still_looping"] == 6


def test_the_degenerate_check_counts_a_retried_page_and_spares_a_clean_one():
    R = ovis.RowResult
    check = ovis.DegenerateCheck(True, 3, list(range(10)))
    for _ in range(3):
        check.observe(R(text="a clean page of text", attempts=1))
    assert check.passed()
    check = ovis.DegenerateCheck(True, 3, list(range(10)))
    with pytest.raises(ovis.RunAborted):
        for _ in range(3):
            check.observe(R(text="a clean page of text", attempts=2))


# ---- offline scripts with the fake vllm package -------------------------------------------------

@pytest.mark.parametrize("script", ["ovis-ocr2.py", "lighton-ocr3.py"])
def test_offline_looping_pages_are_regenerated_with_a_seed_each(tmp_path, script):
    module = load_script(script)
    paths = write_image_folder(tmp_path / "in", 5)
    calls = tmp_path / "llm.jsonl"
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'fake_vllm_pkg'}{os.pathsep}"
                         f"{os.environ.get('PYTHONPATH', '')}",
           "FAKE_VLLM_CALLS": str(calls), "FAKE_VLLM_LOOP_BELOW": "0.25"}
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--batch-size", "4",
                     "--max-tokens", "1000", "--no-sanity-check", "--stats-json", str(tmp_path / "stats.json"),
                     env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 5
    assert not any(LOOP_LINE in text for text in ds["markdown"])
    if script == "ovis-ocr2.py":
        assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    chats = [json.loads(line) for line in calls.read_text().splitlines()]
    chats = [c for c in chats if c["call"] == "chat"]
    # a batch, then its looping pages in one more call, each with its own row's seed
    assert [c["pages"] for c in chats] == [4, 4, 1, 1]
    assert chats[1]["seeds"] == [module.loop_seed(i, 1) for i in range(4)]
    assert chats[3]["seeds"] == [module.loop_seed(4, 1)]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["pages_loop_retried"] == 5 and stats["pages_still_looping"] == 0


@pytest.mark.parametrize("script", ["ovis-ocr2.py", "lighton-ocr3.py"])
def test_offline_pages_cut_by_detection_keep_one_copy_of_the_loop(tmp_path, script):
    paths = write_image_folder(tmp_path / "in", 3)
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'fake_vllm_pkg'}{os.pathsep}"
                         f"{os.environ.get('PYTHONPATH', '')}",
           "FAKE_VLLM_LOOP_BELOW": "9", "FAKE_VLLM_LOOP_FINISH": "repetition"}
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), "--max-tokens", "1000",
                     "--no-sanity-check", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 3
    assert set(ds["markdown_finish_reason"]) == {"repetition"}
    for i, text in enumerate(ds["markdown"]):
        assert text.count(LOOP_LINE) == 1 and text.endswith(LOOP_LINE), text
        assert f"read further at seed {load_script(script).loop_seed(i, 1)}." in text
    if script == "ovis-ocr2.py":
        assert [t.split("\nread further")[0] for t in ds["markdown"]] == \
            [expected_text(p.read_bytes()) for p in paths]


def test_a_loop_retry_the_server_fails_is_never_kept_and_the_rerun_redoes_it(tmp_path, stub_server):
    """Never the loop kept as if it were the answer: a failed retry is the server's error, so
    with every page's retry failing no page was answered and the run is refused (exit 4, its
    rows pending, the failed retry named); the rerun against a healthy server sends them again.
    (The error row such a page gets among answered ones: the kept-attempt test above.)"""
    failing = stub_server("--loop-below", "0.25", "--fail-seeded")
    write_image_folder(tmp_path / "in", 4)
    base = [str(tmp_path / "in"), str(tmp_path / "out"), "--max-tokens", "1000",
            "--no-sanity-check", "--max-retries", "0"]
    run = run_script(OVIS, *base, "--server", failing.url)
    assert run.returncode == 4, run.stderr[-3000:]
    assert "4 failed on the server's side (last: the answer looped, and sending it again " \
        "failed" in run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))  # no loop kept as text
    failing.stop()
    healthy = stub_server("--loop-below", "0.25")
    run = run_script(OVIS, *base, "--server", healthy.url)
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_error"] == [None] * 4 and ds["markdown_attempts"] == [2] * 4


def test_a_blank_retry_never_replaces_a_looping_answer_that_has_text(tmp_path, stub_server):
    """A retry the model ended at once (empty, finish_reason stop) does not loop, so it was kept:
    a page of text and a looping tail became an empty row, counted as fixed. The looping
    answer stays (its text up to the loop), counted as still looping."""
    run, _, paths, stats = loop_run(tmp_path, stub_server, OVIS, ["--loop-below", "0.25",
                                                                  "--blank-seeded"], pages=3)
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_attempts"] == [2] * 3
    for path, text in zip(paths, ds["markdown"]):
        assert text.startswith(expected_text(path.read_bytes())) and LOOP_LINE in text, text
    assert stats["pages_loop_retried"] == 3 and stats["pages_still_looping"] == 3


def test_loop_retries_are_bounded(tmp_path, stub_server):
    run = run_script(OVIS, str(tmp_path), str(tmp_path / "out"), "--loop-retries", "1000")
    assert run.returncode == 2 and "--loop-retries must be at most 5" in run.stderr


# ---- --repetition-detection (#29, item 4) --------------------------------------------------------

@pytest.mark.parametrize("script", SERVER_SCRIPTS)
def test_repetition_detection_is_sent_in_the_body_and_recorded(tmp_path, stub_server, script):
    module = load_script(script)
    p, c = module.REPETITION_DETECTION
    wanted = {"max_pattern_size": p, "min_count": c}
    run, stub, _, _ = loop_run(tmp_path, stub_server, script, [], "--repetition-detection",
                               pages=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r.get("repetition_detection") for r in stub.requests()] == [wanted] * 2
    info = json.loads(load_output(tmp_path / "out")["inference_info"][0])[0]
    assert info["settings"]["repetition_detection"] == wanted
    sent = len(stub.requests())
    base = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url, "--max-tokens",
            "1000", "--no-sanity-check"]
    refused = run_script(script, *base, "--no-repetition-detection")  # in the run's identity
    assert refused.returncode == 2 and "repetition" in refused.stderr, refused.stderr[-2000:]
    assert len(stub.requests()) == sent
    run, stub, _, _ = loop_run(tmp_path, stub_server, script, [], "--no-repetition-detection",
                               pages=2, out="off")
    assert run.returncode == 0 and not any("repetition_detection" in r for r in stub.requests())
    run, stub, _, _ = loop_run(tmp_path, stub_server, script, [], pages=2, out="default")
    assert run.returncode == 0
    assert [r.get("repetition_detection") for r in stub.requests()] == \
        [wanted if module.REPETITION_DETECTION_ON else None] * 2


@pytest.mark.parametrize("before", [False, True], ids=["vllm-with-it", "vllm-before-0.17.1"])
def test_offline_repetition_detection_reaches_sampling_params_or_warns_once(tmp_path, before):
    module = load_script("ovis-ocr2.py")
    write_image_folder(tmp_path / "in", 3)
    calls = tmp_path / "llm.jsonl"
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'fake_vllm_pkg'}{os.pathsep}"
                         f"{os.environ.get('PYTHONPATH', '')}",
           "FAKE_VLLM_CALLS": str(calls), "FAKE_VLLM_LOOP_BELOW": "0.25",
           **({"FAKE_VLLM_BEFORE_0_17": "1"} if before else {})}
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"), "--max-tokens",
                     "1000", "--no-sanity-check", "--repetition-detection", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    p, c = module.REPETITION_DETECTION
    sampling = [json.loads(line)["kwargs"] for line in calls.read_text().splitlines()
                if json.loads(line)["call"] == "SamplingParams"]
    assert len(sampling) == 4  # the greedy pass's, and each page's loop retry
    info = json.loads(load_output(tmp_path / "out")["inference_info"][0])[0]
    card = (tmp_path / "out" / "README.md").read_text()  # says what the run did, as info does
    assert ("repetition detection ended loops" in card) is not before
    assert ('"repetition_detection": null' in card) is before
    if before:
        assert all("repetition_detection" not in k for k in sampling)
        assert run.stderr.count("has no repetition_detection") == 1, run.stderr
        assert info["settings"]["repetition_detection"] is None
    else:
        assert [k["repetition_detection"] for k in sampling] == \
            [{"max_pattern_size": p, "min_pattern_size": 0, "min_count": c}] * 4
        assert "repetition_detection" not in run.stderr
        assert info["settings"]["repetition_detection"] == {"max_pattern_size": p, "min_count": c}
