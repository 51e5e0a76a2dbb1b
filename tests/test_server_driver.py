"""Every server script's driver, end to end against the stub server: input kinds, output layout,
ordering, bad cells, resume, faults, the server life cycle, Hub output through a seam.

The stub answers each page with text derived from the exact image bytes it received, so these
tests can check that every row carries its own page's answer. That the scripts work with vLLM
itself is proven by test_engine.py, on the real engine.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time

import pytest
from PIL import Image

from conftest import (FakeHub, ROOT, SERVER_SCRIPTS, expected_text, fake_vllm_env, free_port,
                      load_output, load_script, page_image, run_script, wait_port,
                      write_image_folder, write_parquet_dataset)


OVIS = "ovis-ocr2-server.py"


def common(stub, *extra):
    return ["--server", stub.url, "--part-rows", "5", "--request-timeout", "20", *extra]


def test_image_folder_round_trip_keeps_order_and_sends_the_models_request(tmp_path, stub_server):
    stub = stub_server("--latency", "0.02")
    paths = write_image_folder(tmp_path / "in", 23)
    stats_path = tmp_path / "stats.json"
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--concurrency", "6", "--stats-json", str(stats_path)))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == 23
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert ds["markdown_error"] == [None] * 23
    assert set(ds["markdown_finish_reason"]) == {"stop"}
    assert ds[0]["image"].size == Image.open(paths[0]).size  # decodes as a user reads it
    import datasets
    raw = ds.cast_column("image", datasets.Image(decode=False))  # embedded, not local paths
    assert [c["bytes"] for c in raw["image"]] == [p.read_bytes() for p in paths]
    assert raw[0]["image"]["path"] == paths[0].name
    assert (tmp_path / "out" / "README.md").exists()
    stats = json.loads(stats_path.read_text())
    for key in ("rows_total", "rows_ok", "rows_failed", "rows_skipped", "elapsed_s",
                "pages_per_s", "pages_per_s_steady", "completion_tokens_per_s", "latency_p50_s",
                "latency_p95_s", "peak_in_flight", "mean_in_flight", "peak_rss_bytes",
                "server_startup_s", "vllm_version"):
        assert key in stats
    assert stats["rows_ok"] == 23 and stats["peak_in_flight"] <= 6
    assert 0 < stats["mean_in_flight"] <= stats["peak_in_flight"]
    module = load_script(OVIS)
    requests = stub.requests()
    assert len(requests) == 23
    for request in requests:
        assert request["texts"] == [module.PROMPT]
        assert request["temperature"] == 0.0
        assert request["max_tokens"] == module.DEFAULT_MAX_TOKENS
        assert request["chat_template_kwargs"] == {"enable_thinking": False}
    info = json.loads(ds[0]["inference_info"])
    assert len(info) == 1 and info[0]["model"] == module.MODEL_ID
    assert info[0]["image"] == f"vllm/vllm-openai:{module.IMAGE_TAG}"


def _unusual_and_bad_cells() -> tuple[list, list[bool]]:
    import numpy as np

    def enc(img, fmt):
        out = io.BytesIO()
        img.save(out, format=fmt)
        return out.getvalue()

    base = Image.open(io.BytesIO(page_image(11)))
    ramp = Image.fromarray((np.linspace(0, 65535, 256 * 256).reshape(256, 256)).astype(np.uint16))
    cells = [
        page_image(1, fmt="JPEG"),               # fine, sent as is
        None,                                    # missing cell
        enc(base.convert("CMYK"), "JPEG"),       # CMYK
        b"",                                     # empty bytes
        enc(ramp, "PNG"),                        # 16-bit grayscale
        b"GIF89a not really",                    # undecodable
        enc(base.convert("P"), "PNG"),           # palette
        page_image(2, fmt="JPEG")[:2500],        # truncated
        enc(base.convert("RGBA"), "PNG"),        # alpha
        enc(base.convert("L"), "PNG"),           # grayscale
    ]
    ok = [True, False, True, False, True, False, True, False, True, True]
    return cells, ok


def test_bad_cells_become_error_rows_and_unusual_images_are_ocrd(tmp_path, stub_server):
    stub = stub_server()  # answers 500 to any non-RGB image, like vLLM's loader
    cells, ok = _unusual_and_bad_cells()
    write_parquet_dataset(tmp_path / "in", cells)
    # --send-blank: some unusual modes are flat pages, and what is tested is that they are sent
    run = run_script(OVIS, str(tmp_path / "in" / "input.parquet"), str(tmp_path / "out"),
                     *common(stub, "--max-retries", "0", "--send-blank"))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["row_id"] == list(range(len(cells)))
    for row, good in zip(ds, ok):
        if good:
            assert row["markdown"] and row["markdown_error"] is None, row["markdown_error"]
        else:
            assert row["markdown"] is None and row["markdown_error"], row
    assert "missing image" in ds[1]["markdown_error"]
    assert "empty image" in ds[3]["markdown_error"]


@pytest.mark.parametrize("kind", ["save_to_disk", "parquet_folder"])
def test_other_local_input_kinds(tmp_path, stub_server, kind):
    import datasets

    stub = stub_server()
    cells = [page_image(i, fmt="JPEG") for i in range(6)]
    parquet = write_parquet_dataset(tmp_path / "pq", cells)
    if kind == "save_to_disk":
        source = tmp_path / "saved"
        datasets.load_dataset("parquet", data_files=str(parquet), split="train").save_to_disk(str(source))
    else:
        source = tmp_path / "pq"
    run = run_script(OVIS, str(source), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(c) for c in cells]


def test_missing_image_column_lists_the_columns(tmp_path, stub_server):
    stub = stub_server()
    write_parquet_dataset(tmp_path / "in", [page_image(0)], extra={"caption": ["x"]})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--image-column", "page"))
    assert run.returncode == 2
    assert "image, row_id, caption" in run.stderr
    assert stub.requests() == []


def test_output_column_clash_fails_before_inference_unless_overwrite(tmp_path, stub_server):
    stub = stub_server()
    write_parquet_dataset(tmp_path / "in", [page_image(0), page_image(1)],
                          extra={"markdown": ["old", "old"]})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2 and "--overwrite" in run.stderr
    assert stub.requests() == []
    assert not (tmp_path / "out").exists()  # refused before anything is written: no OUTPUT
    (tmp_path / "out").mkdir()  # one the user made: left as it was
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2 and (tmp_path / "out").is_dir()
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--overwrite"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["markdown"][0].startswith("# Page")


def test_a_second_model_run_appends_to_inference_info(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    first = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "one"), *common(stub))
    assert first.returncode == 0, first.stderr
    second = run_script(OVIS, str(tmp_path / "one"), str(tmp_path / "two"),
                        *common(stub, "--output-column", "markdown_b"))
    assert second.returncode == 0, second.stderr
    ds = load_output(tmp_path / "two")
    assert ds["markdown"] == ds["markdown_b"]
    info = json.loads(ds[0]["inference_info"])
    assert [entry["column"] for entry in info] == ["markdown", "markdown_b"]


@pytest.mark.parametrize("output", ["not a repo", "a/b/c", "out"])
def test_an_output_that_is_neither_path_nor_repo_exits_2(tmp_path, output):
    run = run_script(OVIS, str(tmp_path), output, "--server", "http://127.0.0.1:9")
    if output == "out":  # a bare name is a valid-looking repo id? no: it has no namespace
        assert run.returncode == 2 and "./out" in run.stderr
    else:
        assert run.returncode == 2 and "local folder" in run.stderr


def test_resume_after_a_kill_skips_written_rows_without_redoing_them(tmp_path, stub_server):
    stub = stub_server("--latency", "0.15")
    paths = write_image_folder(tmp_path / "in", 40)
    args = [str(ROOT / OVIS), str(tmp_path / "in"), str(tmp_path / "out"),
            *common(stub, "--concurrency", "4")]
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list((tmp_path / "out" / "data").glob("part-*.parquet"))) < 2:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.kill()
    process.wait()
    sent_before = len(stub.requests())
    stats = tmp_path / "stats.json"
    run = run_script(OVIS, *args[1:], "--stats-json", str(stats))
    assert run.returncode == 0, run.stderr
    result = json.loads(stats.read_text())
    resent = len(stub.requests()) - sent_before
    # only the pages in flight at the kill (4 at most) are sent again: every answered page was
    # in a part or in the journal
    assert 40 - sent_before <= resent <= 40 - sent_before + 4
    assert result["rows_skipped"] >= 10 and result["rows_not_written"] == 0
    assert result["rows_skipped"] + result["rows_ok"] == 40
    assert resent == 40 - result["rows_skipped"] - result["rows_recovered"]
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]  # every row once, in order
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_sharded_runs_write_disjoint_parts_of_one_output(tmp_path, stub_server):
    """Each shard sends its own contiguous range of rows, and only those (the stub's answers
    name the page it received); run out of order, the shared OUTPUT holds exactly the shards
    done so far, and at the end every row once, in order."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 17)
    ranges = {0: range(0, 5), 1: range(5, 11), 2: range(11, 17)}  # 17 * i // 3
    done: list[int] = []
    for shard in (2, 0, 1):
        sent_before = len(stub.requests())
        stats = tmp_path / f"stats-{shard}.json"
        run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                         *common(stub, "--num-shards", "3", "--shard-index", str(shard),
                                 "--stats-json", str(stats)))
        assert run.returncode == 0, run.stderr
        result = json.loads(stats.read_text())
        assert result["rows_total"] == result["rows_ok"] == len(ranges[shard]), (shard, result)
        assert len(stub.requests()) - sent_before == len(ranges[shard])
        done = sorted(done + list(ranges[shard]))
        ds = load_output(tmp_path / "out")
        assert ds["file_name"] == [paths[i].name for i in done], shard
        assert ds["markdown"] == [expected_text(paths[i].read_bytes()) for i in done], shard
    assert done == list(range(17))


def test_max_samples_and_shuffle(tmp_path, stub_server):
    """--seed decides the order: the same seed gives the same rows in the same order, another
    seed another order."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 12)

    def names(seed: int, out: str) -> list[str]:
        run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / out),
                         *common(stub, "--shuffle", "--seed", str(seed), "--max-samples", "5"))
        assert run.returncode == 0, run.stderr
        return load_output(tmp_path / out)["file_name"]

    first, again, other = names(3, "a"), names(3, "b"), names(4, "c")
    assert len(first) == 5 and first != sorted(first)
    assert again == first, "the same seed must give the same sample"
    assert other != first, "--seed was ignored"


@pytest.mark.parametrize("fault, expect_ok", [
    (["--fail-first", "6"], 8),          # 500s: retried
    (["--fail-every", "3"], 8),          # 503s: retried
    (["--hang-first", "2", "--hang-seconds", "5"], 8),  # timeouts: retried
])
def test_transient_faults_are_retried(tmp_path, stub_server, fault, expect_ok):
    stub = stub_server(*fault)
    write_image_folder(tmp_path / "in", 8)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--request-timeout", "1.5", "--max-retries", "6"))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert sum(e is None for e in ds["markdown_error"]) == expect_ok


def test_a_400_is_not_retried_and_its_text_lands_in_the_row(tmp_path, stub_server):
    import hashlib

    paths = write_image_folder(tmp_path / "in", 5)
    refused = hashlib.sha1(paths[2].read_bytes()).hexdigest()[:12]
    stub = stub_server("--reject-digest", refused)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["markdown"][2] is None and "HTTP 400" in ds["markdown_error"][2]
    assert "this page is refused" in ds["markdown_error"][2]
    assert sum(e is None for e in ds["markdown_error"]) == 4
    assert len(stub.requests()) == 5  # one try for the refused page


def test_timeouts_that_never_end_become_error_rows(tmp_path, stub_server):
    """Pages 0 and 1 time out at each try, page 2 is answered: two error rows, not a stuck run
    (with no page answered at all, the server refuses the run: exit 4, test_resume.py)."""
    stub = stub_server("--hang-first", "4", "--hang-seconds", "5")
    write_image_folder(tmp_path / "in", 3)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--request-timeout", "0.5", "--max-retries", "1",
                             "--concurrency", "1"))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert all("timed out after 0.5 s" in e for e in ds["markdown_error"][:2]), ds["markdown_error"]
    assert ds["markdown_error"][2] is None and ds["markdown_error_kind"][:2] == ["server"] * 2


def test_a_remote_server_that_stays_down_ends_the_run_with_finished_rows_saved(tmp_path, stub_server):
    stub = stub_server("--die-after", "10")
    paths = write_image_folder(tmp_path / "in", 30)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--no-spawn", "--server-down-timeout", "2",
            *common(stub, "--concurrency", "2", "--part-rows", "100")]
    run = run_script(OVIS, *args)
    assert run.returncode == 4, run.stderr  # the server gone refuses the run, as one that hangs
    assert "not answering: waiting up to 2 s" in run.stderr  # said at once, not after the wait
    assert "has failed /health" in run.stderr and "stay pending" in run.stderr
    saved = load_output(tmp_path / "out")
    assert 8 <= saved.num_rows <= 10
    assert all(e is None for e in saved["markdown_error"])
    revived = stub_server(port=stub.port)
    assert revived.port == stub.port
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]
    assert all(e is None for e in ds["markdown_error"])


WATCH_FAILS_AS_A_SLOT_FREES = """
import asyncio, importlib.util, sys
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
answered, leave = asyncio.Event(), script.RunStats.leave

def left(stats):  # a page's answer is in: the watch's verdict lands as its slot is refilled
    leave(stats)
    answered.set()

async def watch(server, client, stats, storm):
    await answered.wait()
    storm.stop("the server failed /health")

script.RunStats.leave, script.ServerManager.watch = left, watch
made, init = [], script.RunStats.__init__
script.RunStats.__init__ = lambda stats, **kw: made.append(stats) or init(stats, **kw)
code = script.main(sys.argv[2:])
print("in flight after the run:", [stats.in_flight for stats in made])
sys.exit(code)
"""


def test_a_server_failing_while_the_window_holds_only_unstarted_pages_ends_the_run(
        tmp_path, stub_server):
    """The watch stopped the run just after the input loop refilled the window: the page it
    cancelled had not begun, so its slot was never given back and the run waited forever."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 6)
    run = subprocess.run([sys.executable, "-c", WATCH_FAILS_AS_A_SLOT_FREES, str(ROOT / OVIS),
                          str(tmp_path / "in"), str(tmp_path / "out"),
                          *common(stub, "--concurrency", "1", "--part-rows", "100")],
                         capture_output=True, text=True, timeout=40)
    assert run.returncode == 4, run.stderr
    assert "the server failed /health" in run.stderr and "stay pending" in run.stderr
    saved = load_output(tmp_path / "out")
    assert saved.num_rows == 1 and saved["markdown_error"] == [None]
    # the page cancelled before it began never entered the stats, so none is left in flight
    assert "in flight after the run: [0]" in run.stdout, run.stdout


def exit_code(module, argv) -> int:
    try:
        return module.main(argv)
    except SystemExit as exc:
        return exc.code


def test_a_port_that_accepts_and_never_answers_is_refused(tmp_path, stub_server, capsys,
                                                          monkeypatch):
    """Not taken for a server starting (waited on up to --server-timeout): `vllm serve` listens
    only once it can answer. SILENT_PORT_S (120 s) shrunk to 3 s here."""
    stub = stub_server("--silent")
    write_image_folder(tmp_path / "in", 2)
    module = load_script(OVIS)
    monkeypatch.setattr(module, "SILENT_PORT_S", 3.0, raising=False)
    started = time.monotonic()
    code = exit_code(module, [str(tmp_path / "in"), str(tmp_path / "out"),
                              *common(stub, "--server-timeout", "40")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"port {stub.port} accepts connections but has sent no HTTP answer" in err
    assert time.monotonic() - started < 35  # two probes of 10 s, not --server-timeout


def test_a_server_whose_health_fails_while_pages_hang_stops_the_run_with_rows_pending(
        tmp_path, stub_server):
    """Pages hang and /health fails: the run stops after --server-down-timeout, not after
    --request-timeout and its retries; the hung pages stay pending for the rerun."""
    stub = stub_server("--wedge-after", "4")
    paths = write_image_folder(tmp_path / "in", 12)
    args = [str(tmp_path / "in"), str(tmp_path / "out"),
            *common(stub, "--concurrency", "2", "--part-rows", "100", "--request-timeout", "300",
                    "--server-down-timeout", "4")]
    started = time.monotonic()
    run = run_script(OVIS, *args, timeout=90)
    assert run.returncode == 4, run.stderr
    assert time.monotonic() - started < 40
    assert re.search(r"has failed /health \(no answer in 1 s\) and answered no page for [4-9] s",
                     run.stderr), run.stderr
    assert "stay pending" in run.stderr
    saved = load_output(tmp_path / "out")
    assert saved.num_rows == 4 and all(e is None for e in saved["markdown_error"])
    stub.stop()
    stub_server(port=stub.port)
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]
    assert all(e is None for e in ds["markdown_error"])


def test_a_slow_page_on_a_live_server_is_left_to_generate(tmp_path, stub_server, capsys):
    """A page taking three times --server-down-timeout while /health passes is not cut."""
    stub = stub_server("--hang-first", "1", "--hang-seconds", "6")
    paths = write_image_folder(tmp_path / "in", 3)
    code = exit_code(load_script(OVIS), [str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--concurrency", "1", "--server-down-timeout", "2")])
    err = capsys.readouterr().err
    assert code == 0, err
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_the_wait_for_a_server_starting_is_said_as_it_goes(tmp_path, stub_server, capsys,
                                                           monkeypatch):
    stub = stub_server("--health-delay", "4")
    write_image_folder(tmp_path / "in", 2)
    module = load_script(OVIS)
    monkeypatch.setattr(module, "REPORT_EVERY_S", 1.0, raising=False)
    code = exit_code(module, [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"waiting for the server at {stub.url} for" in err
    assert "(--server-timeout): it answers, not ready yet" in err


def test_a_slow_health_endpoint_is_waited_for(tmp_path, stub_server):
    stub = stub_server("--health-delay", "3")
    write_image_folder(tmp_path / "in", 3)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    assert "waiting" in run.stderr
    assert load_output(tmp_path / "out").num_rows == 3


def test_spawns_vllm_serve_with_the_scripts_flags_and_stops_it(tmp_path):
    """What `vllm serve` receives, read as vLLM reads it (a flag's last value wins), not as one
    exact string: the model, 127.0.0.1 and the URL's port, every flag of the script, and
    --serve-args after them, so they override."""
    port = free_port()
    env = {**fake_vllm_env(tmp_path), "FAKE_VLLM_ARGV": str(tmp_path / "argv")}
    write_image_folder(tmp_path / "in", 4)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}",
                     "--serve-args", "--max-num-seqs 64 --max-model-len 30000", env=env)
    assert run.returncode == 0, run.stderr
    assert len((tmp_path / "fake-vllm.log").read_text().splitlines()) == 1  # one start
    argv = [a.decode() for a in (tmp_path / "argv").read_bytes().split(b"\0")[:-1]]
    module = load_script(OVIS)

    def last(flag):
        values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        return values[-1] if values else None

    assert argv[:2] == ["serve", module.MODEL_ID]
    assert last("--host") == "127.0.0.1" and last("--port") == str(port)
    script_flags = module.SERVE_ARGS
    for i, flag in enumerate(script_flags):
        if flag.startswith("--") and flag != "--max-model-len":
            has_value = i + 1 < len(script_flags) and not script_flags[i + 1].startswith("--")
            assert flag in argv and (not has_value or last(flag) == script_flags[i + 1]), flag
    assert last("--max-num-seqs") == "64" and last("--max-model-len") == "30000"
    with pytest.raises(OSError):  # the spawned server's whole process group is gone
        wait_port(port, timeout=0.5)
    assert load_output(tmp_path / "out").num_rows == 4


def test_a_spawned_server_that_dies_is_restarted_and_its_pages_sent_again(tmp_path):
    port = free_port()
    env = fake_vllm_env(tmp_path, stub_args="--die-after 7")
    paths = write_image_folder(tmp_path / "in", 16)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--concurrency", "3", env=env)
    assert run.returncode == 0, run.stderr
    assert "restart 1/3" in run.stderr
    assert len((tmp_path / "fake-vllm.log").read_text().splitlines()) >= 3
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_without_vllm_and_without_a_server_it_exits_2_with_the_jobs_command(tmp_path):
    write_image_folder(tmp_path / "in", 2)
    port = free_port()
    started = time.monotonic()
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}",
                     env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 2
    assert time.monotonic() - started < 30
    module = load_script(OVIS)
    assert f"hf jobs uv run --image vllm/vllm-openai:{module.IMAGE_TAG} " in run.stderr
    assert f"{OVIS} INPUT OUTPUT" in run.stderr
    assert f"vllm/vllm-openai:{module.IMAGE_TAG}" in (ROOT / OVIS).read_text().split("# ///")[1]
    assert "--server URL" in run.stderr and "pip install vllm" in run.stderr


def test_a_context_budget_known_once_the_server_is_ready_ends_the_run_cleanly(tmp_path,
                                                                             stub_server):
    """A server still starting when the run began tells its max_model_len only once ready, inside
    the run: the check's SystemExit skipped the run's ending (no --stats-json, the new run's
    manifest left), so the rerun with a --max-tokens that fits was refused as another run."""
    stub = stub_server("--max-model-len", "20000", "--health-delay", "2")
    write_image_folder(tmp_path / "in", 2)
    stats = tmp_path / "stats.json"
    args = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--stats-json", str(stats))]
    run = run_script(OVIS, *args)
    assert run.returncode == 2 and "max_model_len 20000" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and stub.requests() == []
    assert json.loads(stats.read_text())["exit_code"] == 2
    run = run_script(OVIS, *args, "--max-tokens", "8000")
    assert run.returncode == 0, run.stderr


def test_a_server_never_ready_says_the_way_out(tmp_path, stub_server):
    """A server that accepts connections and never answers, for --server-timeout: exit 5 with
    what to do (was only "was not ready after N s"); nothing sent, every row pending."""
    stub = stub_server("--silent")
    write_image_folder(tmp_path / "in", 2)
    stats = tmp_path / "stats.json"
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--server-timeout", "3", "--stats-json", str(stats)), timeout=60)
    assert run.returncode == 5, run.stderr
    error = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert "was not ready after 3 s" in error and "--server-timeout" in error
    assert "rerun the same command" in error and "Traceback" not in run.stderr
    assert json.loads(stats.read_text())["rows_not_written"] == 2


def test_a_429_with_retry_after_is_waited_for(tmp_path, stub_server):
    """A rate-limiting proxy answers 429 with Retry-After: 6 s. The retries' own backoff (1-2 s,
    then 2-4 s) ended inside it and every page became an error row; the wait it asks is kept."""
    stub = stub_server("--rate-limit", "6")
    paths = write_image_folder(tmp_path / "in", 3)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--max-retries", "2", "--concurrency", "1"), timeout=120)
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths], ds["markdown_error"]
    assert run.stderr.count("the server asks to wait 6 s before a retry (HTTP 429") == 1  # once


def test_a_server_with_another_model_is_refused(tmp_path, stub_server):
    stub = stub_server("--model", "someone/else")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2 and "serves someone/else, not ATH-MaaS/OvisOCR2" in run.stderr


def test_a_context_budget_that_would_400_every_page_is_refused(tmp_path, stub_server):
    stub = stub_server("--max-model-len", "20000")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2 and "max_model_len 20000" in run.stderr
    assert stub.requests() == []
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--max-tokens", "8000"))
    assert run.returncode == 0, run.stderr


def test_degenerate_output_stops_the_run_and_writes_nothing(tmp_path, stub_server):
    stub = stub_server("--degenerate")
    write_image_folder(tmp_path / "in", 12)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 3
    assert "degenerate" in run.stderr and "vllm/vllm-openai:" in run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--no-sanity-check"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out").num_rows == 12


def test_first_pages_all_cut_at_max_tokens_name_the_limit(tmp_path, stub_server):
    """A --max-tokens below what the pages hold cuts every answer (finish_reason length): the
    first-pages check stops the run, and says the limit may be what cut them."""
    stub = stub_server("--finish-reason", "length")
    write_image_folder(tmp_path / "in", 6)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--max-tokens", "64", "--loop-retries", "0"))
    assert run.returncode == 3, run.stderr
    assert "were cut at --max-tokens" in run.stderr and "raise it" in run.stderr, run.stderr


@pytest.mark.parametrize("status", [400, 422])
def test_a_server_refusing_every_first_page_stops_the_run_and_writes_nothing(tmp_path, stub_server,
                                                                             status):
    """A server that refuses every page (a text-only model behind it, a proxy's limit) made each
    row a final page error, exit 0: the first-pages check counts a refused page as broken and
    says the refusal; with --no-sanity-check the rows are the pages' errors."""
    stub = stub_server("--refuse-after", "0", "--refuse-status", str(status))
    write_image_folder(tmp_path / "in", 12)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 3, run.stderr
    assert f"cut or refused); the last refusal: HTTP {status}" in run.stderr, run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--no-sanity-check"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["markdown_error_kind"] == ["page"] * 12


def test_a_few_refused_pages_among_good_ones_do_not_stop_the_run(tmp_path, stub_server):
    """A refusal is back at once, the answers of the pages sent with it seconds later: judged in
    the order they came back, 9 refused pages of 30 (tiny scans, say) among good ones were
    'the first 8 pages' and the run stopped with exit 3, nothing written."""
    import hashlib

    paths = write_image_folder(tmp_path / "in", 30)
    refused = [hashlib.sha1(p.read_bytes()).hexdigest()[:12] for p in paths[3::3]]
    stub = stub_server("--latency", "1", *(f"--reject-digest={d}" for d in refused))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    errors = load_output(tmp_path / "out")["markdown_error_kind"]
    assert errors == [("page" if i % 3 == 0 and i else None) for i in range(30)]


def test_pages_refused_after_the_first_pages_passed_are_their_rows_errors(tmp_path, stub_server):
    stub = stub_server("--refuse-after", "8", "--refuse-status", "400")
    write_image_folder(tmp_path / "in", 12)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--concurrency", "1"))
    assert run.returncode == 0, run.stderr
    errors = load_output(tmp_path / "out")["markdown_error"]
    assert errors[:8] == [None] * 8 and all("HTTP 400" in e for e in errors[8:]), errors


def test_api_key_is_sent_and_never_written(tmp_path, stub_server):
    stub = stub_server("--api-key", "sekrit-token-123")
    write_image_folder(tmp_path / "in", 2)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--api-key", "sekrit-token-123"))
    assert run.returncode == 0, run.stderr
    assert "sekrit" not in run.stderr + run.stdout
    assert "sekrit" not in (tmp_path / "out" / "README.md").read_text()
    assert "sekrit" not in "".join(load_output(tmp_path / "out")["inference_info"])


def test_hub_output_uploads_parts_and_card_and_resumes_from_the_repo(tmp_path, stub_server, capsys):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 9)
    hub = FakeHub(tmp_path / "hub")
    module = load_script(OVIS)
    argv = [str(tmp_path / "in"), "user/ocr-out", "--private", "--work-dir", str(tmp_path / "stage1"),
            *common(stub, "--part-rows", "4")]
    assert module.main(argv, hub_api=hub) == 0
    assert ("create_repo", "user/ocr-out", True) in hub.calls
    uploaded = [c[1] for c in hub.calls if c[0] == "upload_file"]
    assert "README.md" in uploaded and sum(u.startswith("data/part-") for u in uploaded) >= 2
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["file_name"] == [p.name for p in paths]
    # a Job that starts afresh (empty staging folder) resumes from the repo: nothing is redone
    before = len(stub.requests())
    argv2 = [a if a != str(tmp_path / "stage1") else str(tmp_path / "stage2") for a in argv]
    assert module.main(argv2 + ["--stats-json", str(tmp_path / "s.json")], hub_api=hub) == 0
    assert len(stub.requests()) == before
    assert json.loads((tmp_path / "s.json").read_text())["rows_skipped"] == 9


def test_a_failed_upload_leaves_parts_on_disk_and_says_how_to_send_them(tmp_path, stub_server,
                                                                       capsys, monkeypatch):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 4)
    module = load_script(OVIS)
    monkeypatch.setattr(module, "UPLOAD_ATTEMPTS", 2)
    monkeypatch.setattr(module, "UPLOAD_BACKOFF_S", 0.01)
    hub = FakeHub(tmp_path / "hub", fail_uploads=True)
    stage = tmp_path / "stage"
    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(stage), *common(stub)]
    assert module.main(argv, hub_api=hub) == 6  # written locally, not on the Hub
    err = capsys.readouterr().err
    assert "did not reach the Hub; they are safe in" in err and "rerun the same command" in err
    local_parts = list((stage / "user__ocr-out" / "data").glob("part-*.parquet"))
    assert local_parts
    # the rerun, with the Hub back, uploads what was left behind and redoes nothing
    hub.fail_uploads = False
    before = len(stub.requests())
    assert module.main(argv, hub_api=hub) == 0
    assert len(stub.requests()) == before
    assert load_output(tmp_path / "hub" / "user/ocr-out").num_rows == 4


@pytest.mark.parametrize("script", SERVER_SCRIPTS)
def test_every_server_script_runs_against_the_stub(tmp_path, stub_server, script):
    module = load_script(script)
    stub = stub_server("--model", getattr(module, "SERVED_NAME", module.MODEL_ID))
    paths = write_image_folder(tmp_path / "in", 5, fmt="JPEG")
    run = run_script(script, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
                     "--max-tokens", "1000", "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == len(paths) and all(e is None for e in ds["markdown_error"])


def test_the_window_is_really_in_flight_at_the_server(tmp_path, stub_server):
    """--concurrency 100: a hundred pages reach the server before the first answer is back
    (however the driver spreads them over its connections). The stub holds every answer until
    the hundredth request has arrived: a driver that waited for answers before sending more
    would never get one."""
    stub = stub_server("--barrier", "100", "--no-decode")
    write_image_folder(tmp_path / "in", 100, fmt="JPEG")
    stats = tmp_path / "stats.json"
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(tmp_path / "out"),
         *common(stub, "--concurrency", "100", "--stats-json", str(stats),
                 "--request-timeout", "900")],  # no page sent again while the others arrive
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240  # for a driver that never sends the 100th page, not load
    while len(stub.requests()) < 100 and driver.poll() is None:
        if time.monotonic() > deadline:
            driver.kill()
            pytest.fail(f"some pages waited for others' answers: {len(stub.requests())} of 100 "
                        f"reached the server, and none is answered before the 100th")
        time.sleep(0.1)
    _, stderr = driver.communicate(timeout=300)
    assert driver.returncode == 0, stderr
    assert len(stub.requests()) == 100, "pages were sent again"
    assert json.loads(stats.read_text())["peak_in_flight"] == 100


SHA = "0123456789abcdef0123456789abcdef01234567"


def test_the_revision_of_a_spawned_server_is_resolved_pinned_and_recorded(tmp_path, stub_server,
                                                                          monkeypatch):
    """No network here: the Hub's answer is injected. A server this script did not start
    records no revision (it cannot know which weights that server loaded)."""
    module = load_script(OVIS)
    asked = []
    monkeypatch.setattr(module, "hub_commit_sha",
                        lambda model, revision, token: asked.append((model, revision)) or SHA)
    monkeypatch.setattr(module, "_RESOLVED_REVISIONS", {})
    write_image_folder(tmp_path / "in", 2)
    stub = stub_server()
    assert module.main([str(tmp_path / "in"), str(tmp_path / "reused"), *common(stub)]) == 0
    info = json.loads(load_output(tmp_path / "reused")["inference_info"][0])
    assert info[-1]["model_revision"] is None
    assert "at revision `unknown`" in (tmp_path / "reused" / "README.md").read_text()

    for key, value in fake_vllm_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    port = free_port()
    argv = [str(tmp_path / "in"), str(tmp_path / "spawned"), "--server", f"http://127.0.0.1:{port}",
            "--model-revision", "v1.0"]
    assert module.main(argv) == 0
    command = (tmp_path / "fake-vllm.log").read_text().split()
    assert command[command.index("--revision") + 1] == SHA  # the sha, not the moving tag
    assert (module.MODEL_ID, "v1.0") in asked
    info = json.loads(load_output(tmp_path / "spawned")["inference_info"][0])
    assert info[-1]["model_revision"] == SHA
    assert f"at revision `{SHA}`" in (tmp_path / "spawned" / "README.md").read_text()


def test_revision_resolution_never_fails_a_run(tmp_path, monkeypatch):
    import types
    module = load_script(OVIS)
    monkeypatch.setattr(module, "_RESOLVED_REVISIONS", {})

    def offline(model, revision, token):
        raise ConnectionError("no network")
    monkeypatch.setattr(module, "hub_commit_sha", offline)
    args = lambda **kw: types.SimpleNamespace(**{"model": module.MODEL_ID, "model_revision": None,  # noqa: E731
                                                 "hf_token": None, **kw})
    assert module.resolved_revision(args()) is None
    assert module.resolved_revision(args(model_revision=SHA)) == SHA  # a full sha stands for itself
    assert module.resolved_revision(args(model_revision="main")) is None
    monkeypatch.setattr(module, "hub_commit_sha", lambda *a: pytest.fail("asked the Hub"))
    assert module.resolved_revision(args(model=str(tmp_path))) is None  # a local folder


def test_offline_scripts_load_and_record_the_resolved_revision(monkeypatch):
    import types
    module = load_script("lighton-ocr3.py")
    monkeypatch.setattr(module, "_RESOLVED_REVISIONS", {})
    monkeypatch.setattr(module, "hub_commit_sha", lambda model, revision, token: SHA)
    args = types.SimpleNamespace(model=module.MODEL_ID, model_revision=None, hf_token=None,
                                 llm_kwargs="", output_column="markdown", mode="plain",
                                 temperature=0.2, max_tokens=10, loop_retries=1,
                                 max_pixels=None, drop_margins=False)
    kwargs = module.effective_llm_kwargs(args)
    assert kwargs["revision"] == SHA
    assert module.inference_info_entry(args, module.resolved_revision(args),
                                       llm_kwargs=kwargs)["model_revision"] == SHA
