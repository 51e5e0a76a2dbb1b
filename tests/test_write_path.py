"""The write path as a user's bad day meets it: nothing lost, nothing doubled, no false success.

Against the stub server (fault injection) and the fake `vllm` (a server slow to stop): rows
finished behind a slow page survive `kill -9`, unexpected answers become error rows, a server
that refuses the run stops it with its own exit code, a rerun redoes exactly the retryable
error rows in place, signals save before they stop, Hub commits are batched and honour the
Hub's Retry-After, and `load_dataset(OUTPUT)` always returns the current rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (FakeHub, ROOT, expected_text, fake_vllm_env, free_port, load_output,
                      load_script, run_script, wait_port, whole_lines, write_image_folder)

OVIS = "ovis-ocr2-server.py"


def common(stub, *extra):
    return ["--server", stub.url, "--part-rows", "5", "--request-timeout", "20", *extra]


def journal_rows(out: Path) -> int:
    return sum(len(whole_lines(p)) for p in (out / ".ocr" / "journal").rglob("*.jsonl"))


def rows_only_in_journal(out: Path) -> set[int]:
    rows = {json.loads(line)["row"] for p in (out / ".ocr" / "journal").rglob("*.jsonl")
            for line in whole_lines(p)}
    for part in (out / "data").glob("part-*.parquet"):
        start, stop = part.stem.split("-")[1:]
        rows -= set(range(int(start), int(stop)))
    return rows


def part_rows(out: Path) -> int:
    total = 0
    for part in (out / "data").glob("part-*.parquet"):
        start, stop = part.stem.split("-")[1:]
        total += int(stop) - int(start)
    return total


def stats_of(path: Path) -> dict:
    stats = json.loads(path.read_text())
    assert stats["rows_ok"] + stats["rows_failed"] + stats["rows_skipped"] + \
        stats["rows_not_written"] == stats["rows_total"], stats
    return stats


def start_driver(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / OVIS), *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout=60.0, process=None):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        assert process is None or process.poll() is None, process.stderr.read()
        time.sleep(0.05)


def test_rows_behind_a_slow_page_are_on_disk_at_once_and_survive_kill_9(tmp_path, stub_server):
    """29 of 30 pages answered, the first one hanging: parts hold every full run of --part-rows
    behind it, the journal the rest; after kill -9 the rerun sends only the hanging page."""
    stub = stub_server("--hang-first", "1", "--hang-seconds", "120")
    paths = write_image_folder(tmp_path / "in", 30)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), *common(stub, "--request-timeout", "300",
                                                     "--part-seconds", "3600")]
    driver = start_driver(*args)
    wait_for(lambda: journal_rows(out) >= 29, process=driver)
    # rows 1-25: 5 full parts, written as each fills, not after --part-seconds (an hour)
    wait_for(lambda: part_rows(out) >= 25, process=driver)
    driver.kill()
    driver.wait()
    assert part_rows(out) == 25  # row 0 hangs, rows 26-29 do not fill a part: in the journal
    sent_before = len(stub.requests())
    run = run_script(OVIS, *args, "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) - sent_before == 1  # only the page that never answered
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_skipped"] == 25 and stats["rows_recovered"] == 4 and stats["rows_ok"] == 5
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert not list((out / ".ocr" / "journal").rglob("*.jsonl"))  # compacted into parts


def test_a_killed_driver_sends_again_only_the_page_it_had_in_flight(tmp_path, stub_server):
    """The issue's 100 s scenario, shortened: one page in flight at a time, parts every 250 rows
    and 5 minutes (the defaults): a kill -9 loses nothing that was answered."""
    stub = stub_server("--latency", "0.3")
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), "--server", stub.url, "--concurrency", "1"]
    driver = start_driver(*args)
    wait_for(lambda: len(stub.requests()) >= 6, process=driver)
    driver.kill()
    driver.wait()
    sent_before = len(stub.requests())
    assert part_rows(out) == 0 and journal_rows(out) in (sent_before - 1, sent_before)
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    resent = len(stub.requests()) - sent_before
    assert resent in (12 - sent_before, 12 - sent_before + 1)  # + the page in flight, if any
    ds = load_output(out)
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


@pytest.mark.parametrize("fault, message, kind", [
    (["--gzip-lie-every", "3"], "DecodingError", "server"),
    (["--malformed-every", "3"], "unreadable response", "server"),
    (["--content", json.dumps("broken \ud800 text")], "cannot be stored", "page"),
])
def test_unexpected_answers_become_error_rows_of_their_kind(tmp_path, stub_server, fault,
                                                            message, kind):
    stub = stub_server(*fault)
    write_image_folder(tmp_path / "in", 9)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--max-retries", "0", "--no-sanity-check",
                             "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    stats = stats_of(tmp_path / "s.json")
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == 9 and stats["rows_ok"] + stats["rows_failed"] == 9
    errors = [(e, k) for e, k in zip(ds["markdown_error"], ds["markdown_error_kind"]) if e]
    assert errors and stats["rows_failed"] == len(errors)
    assert all(message in e and k == kind for e, k in errors), errors
    assert all(t is None for t, e in zip(ds["markdown"], ds["markdown_error"]) if e)


def test_a_coordinate_no_column_can_hold_never_loses_the_row(tmp_path, stub_server):
    """A degenerate grounding output with a box above int32: the row is written, text or error."""
    module = load_script("deepseek-ocr-server.py")
    content = "<|ref|>text<|/ref|><|det|>[[99999999999, 1, 2, 3]]<|/det|>\nHello page"
    stub = stub_server("--model", module.MODEL_ID, "--content", json.dumps(content))
    write_image_folder(tmp_path / "in", 4, fmt="JPEG")
    run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--max-tokens", "1000", "--no-sanity-check",
                             "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 0, run.stderr
    assert stats_of(tmp_path / "s.json")["rows_not_written"] == 0
    assert load_output(tmp_path / "out").num_rows == 4


@pytest.mark.parametrize("status, cause", [(401, "refuses the API key"),
                                           (403, "refuses the API key"),
                                           (404, "no longer serves")])
def test_a_server_that_refuses_the_run_stops_it_with_exit_4(tmp_path, stub_server, status, cause):
    stub = stub_server("--refuse-after", "6", "--refuse-status", str(status))
    paths = write_image_folder(tmp_path / "in", 20)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--concurrency", "2")]
    run = run_script(OVIS, *args, "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 4, run.stderr
    assert cause in run.stderr and f"HTTP {status}" in run.stderr
    stats = stats_of(tmp_path / "s.json")
    ok = stats["rows_ok"]  # 6 answered; the page in flight beside the refused one may be lost
    assert ok in (5, 6) and stats["rows_failed"] == 0 and stats["rows_not_written"] == 20 - ok
    assert load_output(tmp_path / "out")["markdown_error"] == [None] * ok  # no error rows
    good = stub_server()
    run = run_script(OVIS, *args[:2], *common(good, "--concurrency", "2"))
    assert run.returncode == 0, run.stderr
    assert len(good.requests()) == 20 - ok
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_a_storm_of_server_failures_aborts_and_the_rerun_redoes_those_rows(tmp_path, stub_server):
    stub = stub_server("--hang-first", "1000", "--hang-seconds", "5")  # every page times out
    paths = write_image_folder(tmp_path / "in", 40)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                     *common(stub, "--concurrency", "2", "--request-timeout", "0.3",
                             "--max-retries", "0", "--abort-after-failures", "5",
                             "--abort-after-seconds", "1"))
    assert run.returncode == 4, run.stderr
    assert "the last" in run.stderr and "pages all failed" in run.stderr
    assert "timed out after 0.3 s" in run.stderr
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))  # no error rows: pending
    assert journal_rows(tmp_path / "out") == 0
    good = stub_server()
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(good),
                     "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 0, run.stderr
    assert len(good.requests()) == 40  # the error rows are redone, the rest done
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]  # each row once: replaced in place
    assert ds["markdown_error"] == [None] * 40
    assert stats_of(tmp_path / "s.json")["rows_ok"] == 40


def test_a_storm_after_answered_pages_keeps_them_and_leaves_its_own_rows_pending(tmp_path,
                                                                               stub_server):
    """The pages answered before the server broke are written; the storm's are not written as
    error rows (they were), so the rerun sends exactly them."""
    broken = stub_server("--refuse-after", "10", "--refuse-status", "500")
    paths = write_image_folder(tmp_path / "in", 40)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    run = run_script(OVIS, *args, *common(broken, "--concurrency", "1", "--max-retries", "0",
                                          "--abort-after-failures", "5",
                                          "--abort-after-seconds", "0",
                                          "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 4, run.stderr
    assert "the last 5 pages all failed on the server's side" in run.stderr
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_ok"], stats["rows_failed"], stats["rows_not_written"]) == (10, 0, 30)
    good = stub_server()
    run = run_script(OVIS, *args, *common(good))
    assert run.returncode == 0, run.stderr
    assert len(good.requests()) == 30
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_page_errors_stay_unless_retry_errors_and_are_replaced_in_place(tmp_path, stub_server):
    paths = write_image_folder(tmp_path / "in", 7)
    refused = hashlib.sha1(paths[2].read_bytes()).hexdigest()[:12]
    stub = stub_server("--reject-digest", refused)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(stub)).returncode == 0
    first = load_output(tmp_path / "out")
    assert first["markdown_error_kind"][2] == "page" and "HTTP 400" in first["markdown_error"][2]
    parts = sorted(p.name for p in (tmp_path / "out" / "data").glob("*.parquet"))
    sent = len(stub.requests())
    run = run_script(OVIS, *args, *common(stub))
    assert run.returncode == 0 and len(stub.requests()) == sent  # a page error is final
    good = stub_server()
    run = run_script(OVIS, *args, *common(good, "--retry-errors"))
    assert run.returncode == 0, run.stderr
    assert len(good.requests()) == 1
    assert sorted(p.name for p in (tmp_path / "out" / "data").glob("*.parquet")) == parts
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_the_degenerate_check_needs_evidence_and_spares_an_output_with_good_rows(tmp_path,
                                                                                stub_server):
    good, bad = stub_server(), stub_server("--degenerate")
    write_image_folder(tmp_path / "in", 5)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(good, "--max-samples", "4")).returncode == 0
    run = run_script(OVIS, *args, *common(bad))  # a blank last page after four good ones
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["markdown"][4] == "a" * 64
    write_image_folder(tmp_path / "two", 2)  # two blank pages prove nothing either
    run = run_script(OVIS, str(tmp_path / "two"), str(tmp_path / "out2"), *common(bad))
    assert run.returncode == 0, run.stderr
    write_image_folder(tmp_path / "many", 6)  # six are a wrong model/image pair
    run = run_script(OVIS, str(tmp_path / "many"), str(tmp_path / "out3"), *common(bad))
    assert run.returncode == 3, run.stderr
    assert not list((tmp_path / "out3" / "data").glob("*.parquet"))
    assert not list((tmp_path / "out3" / ".ocr" / "journal").rglob("*.jsonl"))


def test_sigterm_saves_every_finished_row_before_stopping_a_slow_server(tmp_path):
    """A fake `vllm` that takes 20 s to stop: the rows reach their parts first, a second SIGTERM
    while saving changes nothing, and the exit code is SIGTERM's."""
    port = free_port()
    env = fake_vllm_env(tmp_path, stub_args="--latency 0.3 --stop-delay 20")
    paths = write_image_folder(tmp_path / "in", 60)
    out = tmp_path / "out"
    driver = start_driver(str(tmp_path / "in"), str(out), "--server", f"http://127.0.0.1:{port}",
                          "--concurrency", "2", "--part-rows", "1000", env=env)
    wait_for(lambda: journal_rows(out) >= 6, process=driver)
    driver.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(lambda: part_rows(out) > 0, process=driver)
    to_disk = time.monotonic() - sent
    with socket.socket() as probe:  # the fake server listens until its 20 s stop is over
        server_still_there = probe.connect_ex(("127.0.0.1", port)) == 0
    driver.send_signal(signal.SIGTERM)  # a second one, while the server is stopping
    _, stderr = driver.communicate(timeout=90)
    print(f"SIGTERM to rows in parts: {to_disk:.2f} s (server stop: 20 s)")
    assert server_still_there, f"the rows reached their parts after the server stopped: {stderr}"
    assert driver.returncode == 143, stderr
    assert stderr.index("saved:") < stderr.index("stopping the vllm serve")
    assert journal_rows(out) == 0  # everything compacted into parts
    ds = load_output(out)
    assert ds.num_rows >= 6
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths[:ds.num_rows]]
    with pytest.raises(TimeoutError):
        wait_port(port, timeout=0.5)


def test_ctrl_c_exits_130_after_saving(tmp_path, stub_server):
    stub = stub_server("--latency", "0.2")
    paths = write_image_folder(tmp_path / "in", 40)
    out = tmp_path / "out"
    driver = start_driver(str(tmp_path / "in"), str(out), *common(stub, "--concurrency", "2"))
    wait_for(lambda: journal_rows(out) >= 4, process=driver)
    driver.send_signal(signal.SIGINT)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 130, stderr
    answered = len(stub.requests())
    ds = load_output(out)
    assert answered - 2 <= ds.num_rows <= answered  # at most the two in flight are missing
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths[:ds.num_rows]]


def test_a_part_that_cannot_be_written_keeps_its_rows(tmp_path, stub_server, capsys, monkeypatch):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 8)
    module = load_script(OVIS)
    real, calls = module.write_part, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "write_part", flaky)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--part-rows", "4")]
    assert module.main(argv) == 0
    assert "No space left on device" in capsys.readouterr().err
    ds = load_output(tmp_path / "out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    monkeypatch.setattr(module, "write_part", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    argv = [str(tmp_path / "in"), str(tmp_path / "out2"), *common(stub),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 5  # rows not written: never a silent exit 0
    assert stats_of(tmp_path / "s.json")["rows_not_written"] == 8


def test_a_card_that_cannot_be_written_beside_unwritten_rows_does_not_say_every_row_is(
        tmp_path, stub_server, capsys, monkeypatch):
    """A disk that fills mid-run (seen on a 100 KiB tmpfs): the later parts and the card fail,
    and the card's error said "every row is written" beside "25 row(s) were not written"."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 8)
    module = load_script(OVIS)
    real_part, real_text = module.write_part, Path.write_text

    def full_after_one(*args, **kwargs):
        if list((tmp_path / "out" / "data").glob("*.parquet")):
            raise OSError(28, "No space left on device")
        return real_part(*args, **kwargs)

    def full_card(self, *args, **kwargs):
        if self.name == "README.md":
            raise OSError(28, "No space left on device")
        return real_text(self, *args, **kwargs)

    monkeypatch.setattr(module, "write_part", full_after_one)
    monkeypatch.setattr(Path, "write_text", full_card)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--part-rows", "4"),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 5
    err = capsys.readouterr().err
    assert "cannot write the dataset card" in err and "4 row(s) were not written" in err
    assert "every row is written" not in err and "Traceback" not in err
    assert stats_of(tmp_path / "s.json")["rows_not_written"] == 4


def test_a_disk_full_before_the_first_page_exits_5_without_a_traceback(tmp_path, stub_server,
                                                                        capsys, monkeypatch):
    """The disk fills while the run's manifest is written (seen on a 4 KiB tmpfs: a traceback,
    exit 1, a stray temp file): nothing is sent, exit 5, the stats say so, nothing left over."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    module = load_script(OVIS)
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".manifest."):
            self.touch()
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 5
    err = capsys.readouterr().err
    assert "cannot write to OUTPUT" in err and "No space left on device" in err
    assert "Traceback" not in err
    assert stats_of(tmp_path / "s.json")["exit_code"] == 5
    assert stub.requests() == []
    assert not list((tmp_path / "out").rglob(".manifest.*"))


def test_a_journal_that_cannot_be_closed_is_a_warning_not_a_crash(tmp_path, stub_server, capsys,
                                                                  monkeypatch):
    """A disk that fills at the very end: the journal's last flush fails after every row is in
    its part (seen on an 8 KiB tmpfs: a traceback from finish_run, exit 1, no stats)."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 4)
    module = load_script(OVIS)
    rotate = module.Journal._open

    class FullOnClose:
        def __init__(self, file):
            self.file = file

        def __getattr__(self, name):
            return getattr(self.file, name)

        def close(self):
            self.file.close()
            raise OSError(28, "No space left on device")

    def rotate_then_fill(self):
        rotate(self)
        self.file = FullOnClose(self.file)

    monkeypatch.setattr(module.Journal, "_open", rotate_then_fill)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 0  # every row is in its part
    err = capsys.readouterr().err
    assert "warning: cannot write the journal" in err and "Traceback" not in err
    assert load_output(tmp_path / "out")["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert stats_of(tmp_path / "s.json")["rows_ok"] == 4


def test_stats_that_cannot_be_written_at_the_end_are_a_warning(tmp_path, stub_server, capsys,
                                                              monkeypatch):
    """--stats-json unwritable (found at the end of the run): every row is written,
    the run keeps its exit code and its done line, the stats go to the log (was: a traceback,
    exit 1, after a false 'cannot write to OUTPUT ... Nothing was sent')."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 3)
    module = load_script(OVIS)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--stats-json", "/proc/x.json"]
    assert module.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: cannot write --stats-json /proc/x.json" in err and '"rows_ok": 3' in err
    assert "done: 3 ok" in err and "Traceback" not in err and "cannot write to OUTPUT" not in err
    assert load_output(tmp_path / "out")["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_hub_commits_are_batched_and_honour_retry_after(tmp_path, stub_server):
    stub = stub_server("--latency", "0.05")
    paths = write_image_folder(tmp_path / "in", 12)
    hub = FakeHub(tmp_path / "hub", refuse_first=1)
    module = load_script(OVIS)
    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(tmp_path / "stage"),
            *common(stub, "--part-rows", "2", "--concurrency", "2")]
    assert module.main(argv, hub_api=hub) == 0
    assert len(hub.attempts) >= 2 and hub.attempts[1] - hub.attempts[0] >= 1.0  # Retry-After
    files = [f for commit in hub.commits for f in commit]
    assert sum(f.startswith("data/part-") for f in files) == 6  # 6 parts ...
    assert len(hub.commits) <= 2  # the manifest, then the last: one commit per 36 s at most
    assert hub.commits[0] == [".ocr/manifest.json"]
    assert "README.md" in hub.commits[-1]
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["file_name"] == [p.name for p in paths]


def test_load_dataset_returns_the_current_rows_after_a_resume_and_for_same_named_folders(
        tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 6)
    out = tmp_path / "a" / "out"
    assert run_script(OVIS, str(tmp_path / "in"), str(out),
                      *common(stub, "--max-samples", "3")).returncode == 0
    assert load_output(out).num_rows == 3
    assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub)).returncode == 0
    assert load_output(out).num_rows == 6  # not the first run's three rows from the cache
    write_image_folder(tmp_path / "in2", 2)
    other = tmp_path / "b" / "out"
    assert run_script(OVIS, str(tmp_path / "in2"), str(other), *common(stub)).returncode == 0
    assert load_output(other).num_rows == 2 and load_output(out).num_rows == 6
    assert {p.name for p in out.iterdir()} == {"data", "README.md", ".ocr"}
    assert "configs:" not in (out / "README.md").read_text()


# ---- the offline scripts share the write path: the same faults, with a fake vllm.LLM ----------

FAKE_VLLM_PKG = ROOT / "tests" / "fake_vllm_pkg"


def offline_env(tmp_path: Path, batch_seconds: float = 0.0) -> dict:
    return {"PYTHONPATH": f"{FAKE_VLLM_PKG}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "FAKE_VLLM_BATCH_SECONDS": str(batch_seconds),
            "FAKE_VLLM_CALLS": str(tmp_path / "llm.jsonl")}


def fake_pages_sent(tmp_path: Path) -> int:
    log = tmp_path / "llm.jsonl"
    calls = [json.loads(line) for line in whole_lines(log)]
    return sum(call["pages"] for call in calls if call["call"] == "chat")


def test_offline_kill_9_loses_no_finished_batch_and_sigterm_saves(tmp_path):
    paths = write_image_folder(tmp_path / "in", 24)
    out = tmp_path / "out"
    args = [sys.executable, str(ROOT / "ovis-ocr2.py"), str(tmp_path / "in"), str(out),
            "--batch-size", "4"]
    env = {**os.environ, **offline_env(tmp_path, batch_seconds=0.5)}
    driver = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    wait_for(lambda: journal_rows(out) >= 8, process=driver)
    driver.kill()
    driver.wait()
    journaled = rows_only_in_journal(out)
    done = len(journaled) + part_rows(out)
    assert done >= 8
    driver = subprocess.Popen(args + ["--stats-json", str(tmp_path / "s.json")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(rows_only_in_journal(out)) + part_rows(out) >= done + 4, process=driver)
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 143, stderr
    assert "saved:" in stderr
    stats = stats_of(tmp_path / "s.json")
    assert stats["rows_recovered"] == len(journaled)  # written without being generated again
    saved = load_output(out)
    assert saved.num_rows >= done + 4 and saved["markdown_error"] == [None] * saved.num_rows
    run = run_script("ovis-ocr2.py", *args[2:], env=offline_env(tmp_path))
    assert run.returncode == 0, run.stderr
    assert fake_pages_sent(tmp_path) <= 24 + 4  # at most one batch in flight was sent twice
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def chat_calls(tmp_path: Path) -> list[int]:
    """The pages of each LLM.chat call the fake vllm saw, in order."""
    log = tmp_path / "llm.jsonl"
    return [call["pages"] for call in map(json.loads, log.read_text().splitlines())
            if call["call"] == "chat"]


def page_digest(path: Path) -> str:
    """What FAKE_VLLM_FAIL_ON matches in this page's answer only (ovis sends a PNG as is)."""
    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


CUDA_FAULT = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("script", ["ovis-ocr2.py", "lighton-ocr3.py"])
@pytest.mark.parametrize("pages, said, calls", [
    (3, "no page of this run was answered: 3 failed on the engine's side", 5),  # however short
    (12, "no page of this run was answered: 12 failed on the engine's side", 3 * 7),
    (24, "the last 16 pages failed one by one", 4 * 7)])
def test_offline_an_engine_that_fails_every_page_stops_with_exit_4_and_the_rerun_finishes(
        tmp_path, script, pages, said, calls):
    """Not N final page errors that a rerun would keep: the rows stay pending, exit 4."""
    paths = write_image_folder(tmp_path / "in", pages)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), "--batch-size", "4", "--no-sanity-check"]
    run = run_script(script, *args, "--stats-json", str(tmp_path / "s.json"),
                     env={**offline_env(tmp_path), "FAKE_VLLM_RAISE": CUDA_FAULT})
    assert run.returncode == 4, run.stderr[-3000:]
    assert said in run.stderr and CUDA_FAULT in run.stderr
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_failed"], stats["rows_not_written"], stats["exit_code"]) == (0, pages, 4)
    assert len(chat_calls(tmp_path)) == calls  # each page alone; 16 of them, then no more
    run = run_script(script, *args, env=offline_env(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown_error"] == [None] * pages and all(ds["markdown"])


def test_offline_pages_vllm_refuses_are_their_rows_errors_however_many(tmp_path):
    """A ValueError is vLLM refusing a page's input (longer than max_model_len, say): a volume
    of 24 such pages is 24 page errors, not a broken engine that stops every rerun."""
    write_image_folder(tmp_path / "in", 24)
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--batch-size", "4", "--no-sanity-check",
                     env={**offline_env(tmp_path), "FAKE_VLLM_FAIL_ON": "Page"})
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_error"] == ["generation failed: ValueError: injected failure"] * 24
    assert ds["markdown_error_kind"] == ["page"] * 24


@pytest.mark.parametrize("raise_as", ["EngineDeadError", "OutOfMemoryError: CUDA out of memory. "
                                                         "Tried to allocate 2.00 GiB"])
def test_offline_an_engine_gone_stops_at_once_and_keeps_the_finished_rows(tmp_path, raise_as):
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), "--batch-size", "4", "--no-sanity-check"]
    run = run_script("ovis-ocr2.py", *args, "--stats-json", str(tmp_path / "s.json"),
                     env={**offline_env(tmp_path), "FAKE_VLLM_RAISE": raise_as,
                          "FAKE_VLLM_FAIL_ON": page_digest(paths[5])})
    assert run.returncode == 4, run.stderr[-3000:]
    assert f"the vLLM engine is gone ({raise_as}" in run.stderr
    assert ("a smaller --batch-size" in run.stderr) == ("memory" in raise_as)  # the way out
    assert chat_calls(tmp_path) == [4, 4]  # the batch that raised is not split page by page
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_ok"], stats["rows_failed"], stats["rows_not_written"]) == (4, 0, 8)
    assert run_script("ovis-ocr2.py", *args, env=offline_env(tmp_path)).returncode == 0
    ds = load_output(out)
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert chat_calls(tmp_path)[2:] == [4, 4]  # the rerun sent only the 8 pending pages


def test_offline_an_engine_refusing_every_first_page_stops_the_run(tmp_path):
    """vLLM refusing every page's input (a ValueError, as a server's 400) made every row a final
    error, exit 0: the first-pages check stops the run and says the refusal."""
    write_image_folder(tmp_path / "in", 8)
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"), "--batch-size",
                     "4", env={**offline_env(tmp_path), "FAKE_VLLM_REFUSE_ON": "Page"})
    assert run.returncode == 3, run.stderr[-3000:]
    assert "the last refusal: generation failed: ValueError" in run.stderr, run.stderr[-3000:]
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))


def test_a_stop_with_nothing_written_says_nothing_of_saving(tmp_path):
    """The engine gone at the first batch: nothing is written, so no 'saved: 0 finished rows are
    in OUTPUT' (the error line says what to do); a stop with rows written still says it."""
    paths = write_image_folder(tmp_path / "in", 8)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--batch-size", "4", "--no-sanity-check"]
    run = run_script("ovis-ocr2.py", *args, env={**offline_env(tmp_path),
                     "FAKE_VLLM_RAISE": "EngineDeadError", "FAKE_VLLM_FAIL_ON": "Page"})
    assert run.returncode == 4, run.stderr[-3000:]
    assert "the vLLM engine is gone" in run.stderr and "saved:" not in run.stderr
    run = run_script("ovis-ocr2.py", *args, env={**offline_env(tmp_path),
                     "FAKE_VLLM_RAISE": "EngineDeadError",
                     "FAKE_VLLM_FAIL_ON": page_digest(paths[5])})
    assert run.returncode == 4, run.stderr[-3000:]
    assert "saved: 4 finished rows are in" in run.stderr


def test_offline_a_page_vllm_refuses_is_written_while_the_engine_failures_stay_pending(tmp_path):
    """As a server's 400 among its 5xx: the refused page's row is final, the pages the engine
    failed are held, and a run with none answered leaves them pending (exit 4)."""
    paths = write_image_folder(tmp_path / "in", 3)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--batch-size", "4", "--no-sanity-check"]
    run = run_script("ovis-ocr2.py", *args, "--stats-json", str(tmp_path / "s.json"),
                     env={**offline_env(tmp_path), "FAKE_VLLM_RAISE": CUDA_FAULT,
                          "FAKE_VLLM_REFUSE_ON": page_digest(paths[0])})
    assert run.returncode == 4, run.stderr[-3000:]
    assert "no page of this run was answered: 2 failed on the engine's side" in run.stderr
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_failed"], stats["rows_not_written"]) == (1, 2)
    run = run_script("ovis-ocr2.py", *args, env=offline_env(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert ds["markdown_error"][0] == "generation failed: ValueError: input refused"
    assert ds["markdown_error"][1:] == [None, None] and all(ds["markdown"][1:])


@pytest.mark.parametrize("bad", [3, 11])  # the last of a batch; the last of the run
def test_offline_one_bad_page_among_good_ones_is_its_rows_final_error(tmp_path, bad):
    paths = write_image_folder(tmp_path / "in", 12)
    run = run_script("ovis-ocr2.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--batch-size", "4", "--no-sanity-check",
                     env={**offline_env(tmp_path), "FAKE_VLLM_FAIL_ON": page_digest(paths[bad])})
    assert run.returncode == 0, run.stderr[-3000:]
    ds = load_output(tmp_path / "out")
    assert [i for i, e in enumerate(ds["markdown_error"]) if e] == [bad]
    assert ds["markdown_error"][bad] == "generation failed: ValueError: injected failure"
    assert ds["markdown_error_kind"][bad] == "page" and ds["markdown"].count(None) == 1


def test_offline_a_clean_up_that_raises_is_that_rows_error(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "in", 6)
    module = load_script("lighton-ocr3.py")
    for name, value in offline_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(FAKE_VLLM_PKG))
    calls = []

    def flaky(text, args):
        calls.append(text)
        if len(calls) == 2:
            raise OverflowError("int too large to convert")
        return text, {}

    monkeypatch.setattr(module, "postprocess", flaky)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), "--no-sanity-check",
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 0
    ds = load_output(tmp_path / "out")
    errors = [e for e in ds["markdown_error"] if e]
    assert len(errors) == 1 and "post-processing failed: OverflowError" in errors[0]
    assert stats_of(tmp_path / "s.json")["rows_failed"] == 1


def test_a_readme_no_run_wrote_is_refused_before_anything_is_written(tmp_path, stub_server):
    """Issue #28: a local OUTPUT holding someone's README.md had it overwritten without a word."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    out = tmp_path / "notes"
    out.mkdir()
    (out / "README.md").write_text("# my notes\n")
    run = run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "README.md" in run.stderr and str(tmp_path / "notes-ocr") in run.stderr
    assert "Traceback" not in run.stderr
    assert (out / "README.md").read_text() == "# my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["README.md"] and stub.requests() == []


def test_a_card_that_cannot_be_written_is_said_with_the_real_stats(tmp_path, stub_server):
    """Issue #28: a card write that failed after every row was written read "cannot write to
    OUTPUT ... Nothing was sent", with zeros in --stats-json. Every row is written where OUTPUT
    says, so the exit code is 0 (README: 0 counts rows; the card is said as missing)."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 4)
    out, stats = tmp_path / "out", tmp_path / "stats.json"
    args = [str(tmp_path / "in"), str(out), *common(stub, "--stats-json", str(stats))]
    assert run_script(OVIS, *args, "--max-samples", "2").returncode == 0
    (out / "README.md").unlink()
    (out / "README.md").symlink_to("/dev/full")  # a disk full when the card is written
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert "cannot write the dataset card" in run.stderr and "Nothing was sent" not in run.stderr
    assert "Traceback" not in run.stderr
    result = json.loads(stats.read_text())
    assert (result["rows_ok"], result["rows_skipped"], result["exit_code"]) == (2, 2, 0)
    (out / "README.md").unlink()
    assert len(load_output(out)) == 4
    assert run_script(OVIS, *args).returncode == 0  # the rerun writes the card
    assert "ovis" in (out / "README.md").read_text().lower()


def test_a_local_dataset_of_its_own_in_output_is_refused_before_anything_is_written(
        tmp_path, stub_server):
    """A local OUTPUT holding another dataset's data/train-*.parquet (no card): the run wrote
    its parts beside them, exit 0, and `load_dataset(OUTPUT)` returned the other dataset's rows
    (its split-named files win). Refused as a Hub repo holding files of its own is."""
    import datasets
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    out = tmp_path / "mine"
    datasets.Dataset.from_dict({"x": [1, 2, 3]}).to_parquet(
        str(out / "data" / "train-00000-of-00001.parquet"))
    run = run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "data/train-00000-of-00001.parquet" in run.stderr and "Traceback" not in run.stderr
    assert str(tmp_path / "mine-ocr") in run.stderr
    assert sorted(p.name for p in (out / "data").iterdir()) == ["train-00000-of-00001.parquet"]
    assert not (out / "README.md").exists() and stub.requests() == []


@pytest.mark.parametrize("at", ["write_part", "build_card"])
def test_a_ctrl_c_while_the_run_saves_is_said_with_the_real_stats(tmp_path, stub_server, capsys,
                                                                  monkeypatch, at):
    """A Ctrl-C while the final parts or the card were written read "interrupted before any
    page was sent", with zeros in --stats-json over the run's own. The finished rows are saved
    (a part waits for it, the card does not), exit 130, and the rerun finishes."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 3)
    module = load_script(OVIS)
    real = getattr(module, at)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, at, interrupted)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 130
    err = capsys.readouterr().err
    assert "before any page was sent" not in err and "Traceback" not in err
    assert "to resume" in err or "to finish" in err
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_ok"], stats["exit_code"]) == (3, 130)
    monkeypatch.setattr(module, at, real)
    assert module.main(argv) == 0
    assert load_output(tmp_path / "out")["markdown"] == \
        [expected_text(p.read_bytes()) for p in paths]
    assert (tmp_path / "out" / "README.md").exists()


def test_a_disk_error_while_the_run_finishes_is_said_with_the_real_stats(tmp_path, stub_server,
                                                                         capsys, monkeypatch):
    """An OSError after the rows are written (the last step of the output) read "cannot write
    to OUTPUT ... Nothing was sent", with zeros in --stats-json: it is exit 5 with the run's
    stats, and the rerun finishes."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    module = load_script(OVIS)
    real = module.OutputStore.finish

    def full(self, card):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.OutputStore, "finish", full)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--stats-json", str(tmp_path / "s.json")]
    assert module.main(argv) == 5
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Nothing was sent" not in err
    assert "Traceback" not in err
    stats = stats_of(tmp_path / "s.json")
    assert (stats["rows_ok"], stats["exit_code"]) == (3, 5)
    monkeypatch.setattr(module.OutputStore, "finish", real)
    assert module.main(argv) == 0 and len(load_output(tmp_path / "out")) == 3
    assert (tmp_path / "out" / "README.md").exists()


def test_a_ctrl_c_mid_run_prints_no_traceback(tmp_path, stub_server):
    """A SIGINT lands inside whichever page task runs: that task's KeyboardInterrupt was
    printed at exit as 'Task exception was never retrieved' with a traceback."""
    (tmp_path / "answer.md").write_text("word " * 40000)
    stub = stub_server("--no-decode", "--answer-file", str(tmp_path / "answer.md"))
    write_image_folder(tmp_path / "in", 300)
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(tmp_path / "in"),
                            str(out), "--server", stub.url, "--concurrency", "16",
                            "--no-sanity-check"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: journal_rows(out) >= 20, process=run)
        run.send_signal(signal.SIGINT)
        stderr = run.communicate(timeout=60)[1]
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr


SIGNAL_IN_A_FINALIZER = """
import importlib.util, signal, sys, time
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
interrupts, scope = script.Interrupts(), {}
exec(compile("import sys\\ndef callback():\\n    return sys._getframe()\\n",
             "/usr/lib/python3.11/_weakrefset.py", "exec"), scope)
try:
    interrupts.on_signal(signal.SIGINT, scope["callback"]())  # as in WeakSet's _remove
    print("deferred", flush=True)
    time.sleep(10)
except KeyboardInterrupt:
    print("interrupted", interrupts.exit_code(), flush=True)
"""


def test_a_signal_inside_a_finalizer_comes_again_rather_than_being_lost():
    """CI caught a Ctrl-C landing in a WeakSet's callback during garbage collection: Python
    printed 'Exception ignored ... KeyboardInterrupt' with a traceback, and the run went on to
    its end. A signal in a finalizer is now delivered again 50 ms later, in the run's code."""
    run = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_FINALIZER,
                          str(ROOT / "ovis-ocr2-server.py")], capture_output=True, text=True,
                         timeout=60)
    assert run.stdout.split("\n") == ["deferred", "interrupted 130", ""], run.stdout + run.stderr


SIGNAL_IN_A_CONNECT = """
import os, runpy, signal, sys
import anyio
import httpcore._backends.anyio as backend
real, seen = backend.AnyIOBackend.connect_tcp, []

async def connect_tcp(self, *args, **kwargs):  # the 1st: the server's probe; the 3rd: a page's
    seen.append(1)
    if len(seen) == int(os.environ["SIGNAL_AT_CONNECTION"]):
        async def child():  # the signal lands in a task of anyio's group, as in its connect_tcp
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep(5)
        async with anyio.create_task_group() as group:
            group.start_soon(child)
    return await real(self, *args, **kwargs)

backend.AnyIOBackend.connect_tcp = connect_tcp
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("connection", ["1", "3"])
def test_a_signal_inside_a_connection_being_opened_prints_no_traceback(tmp_path, stub_server,
                                                                       connection):
    """A SIGTERM that lands while httpx opens a connection is raised in anyio's task group, which
    wraps it in an exception group: asyncio printed that task's traceback at exit ("unhandled
    exception during asyncio.run() shutdown")."""
    stub = stub_server("--latency", "0.05")
    paths = write_image_folder(tmp_path / "in", 12)
    args = [str(ROOT / OVIS), str(tmp_path / "in"), str(tmp_path / "out"), *common(stub),
            "--concurrency", "4"]
    run = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_CONNECT, *args], capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "SIGNAL_AT_CONNECTION": connection})
    assert run.returncode == 128 + signal.SIGTERM, run.stderr
    assert "Traceback" not in run.stderr and "unhandled exception" not in run.stderr, run.stderr
    rerun = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert load_output(tmp_path / "out")["markdown"] == \
        [expected_text(p.read_bytes()) for p in paths]


EXITS_AT_THE_FOURTH_PAGE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
real, seen = script.postprocess, []

def exits_at_the_fourth(text, args):  # a fail() deep in the pipeline, after three rows
    seen.append(text)
    if len(seen) == 4:
        raise SystemExit(4)
    return real(text, args)

script.postprocess = exits_at_the_fourth
sys.argv[0] = sys.argv[1]  # the script's own name: a rerun of it is the same run
sys.exit(script.main(sys.argv[2:]))
"""


def test_an_exit_raised_inside_the_run_saves_the_finished_rows_first(tmp_path, stub_server):
    """A SystemExit from inside the run (a fail() deep in the pipeline) ended the process at
    once: the rows finished before it stayed unwritten. Now they are saved, the exit code is
    kept, and the rerun sends only what is left. (In a subprocess: an exit raised in an asyncio
    task leaves CPython 3.11's AST recursion counter off for the rest of the process.)"""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 6)
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub), "--concurrency", "1",
            "--stats-json", str(tmp_path / "s.json")]
    run = subprocess.run([sys.executable, "-c", EXITS_AT_THE_FOURTH_PAGE, str(ROOT / OVIS), *argv],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stderr[-3000:]
    assert "saved: 3 finished rows" in run.stderr
    assert stats_of(tmp_path / "s.json")["rows_ok"] == 3
    rerun = run_script(OVIS, *argv)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "3 of 6 rows to do" in rerun.stderr
    assert load_output(tmp_path / "out")["markdown"] == \
        [expected_text(p.read_bytes()) for p in paths]


# ---- the card's metadata: what the Hub's search reads -------------------------------------------

def test_the_cards_metadata_is_what_the_hub_indexes_and_reads_back(tmp_path, stub_server):
    """Issue #44: task_categories, size_categories, pretty_name, tags, and the licence the
    input's own card gives; DatasetCard.load reads every field back; no `configs:` block."""
    from huggingface_hub import DatasetCard

    stub = stub_server()
    write_image_folder(tmp_path / "in", 4)
    (tmp_path / "in" / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# my scans\n")
    out = tmp_path / "out"
    assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub)).returncode == 0
    card = DatasetCard.load(out / "README.md")
    data = card.data.to_dict()
    assert data["task_categories"] == ["image-to-text"] and data["size_categories"] == ["n<1K"]
    assert data["license"] == "cc-by-4.0" and data["tags"] == ["ocr", "vllm", "uv-script"]
    assert "OvisOCR2" in data["pretty_name"] and "source_datasets" not in data  # a local input
    assert "configs" not in data and "This output holds 4 rows" in card.text
    assert "Reproduce on Hugging Face Jobs" in card.text  # the body is kept


def test_an_older_card_is_rewritten_with_its_counts_on_the_next_run(tmp_path, stub_server):
    """An output whose card was written before the metadata (YAML of tags only): the run that
    continues it writes the new card, counting the rows the earlier run wrote."""
    from huggingface_hub import DatasetCard

    stub = stub_server()
    write_image_folder(tmp_path / "in", 5)
    out = tmp_path / "out"
    assert run_script(OVIS, str(tmp_path / "in"), str(out),
                      *common(stub, "--max-samples", "3")).returncode == 0
    (out / "README.md").write_text("---\ntags:\n- ocr\n- vllm\n- uv-script\n---\n\n# old card\n")
    assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub)).returncode == 0
    card = DatasetCard.load(out / "README.md")
    assert card.data.task_categories == ["image-to-text"] and "This output holds 5 rows" in card.text


def test_a_hub_inputs_card_names_it_as_its_source_and_carries_its_licence(monkeypatch, tmp_path):
    """For a Hub input, source_datasets names it and the licence comes from its card on the Hub
    (read through HfApi.dataset_info, which is faked here: no Hub is reachable)."""
    from types import SimpleNamespace

    from conftest import load_script

    script = load_script(OVIS)

    class Api:
        def __init__(self, token=None):
            pass

        def dataset_info(self, repo, revision=None, timeout=None):
            assert repo == "user/scans"
            return SimpleNamespace(card_data=SimpleNamespace(license="mit"))

    monkeypatch.setattr("huggingface_hub.HfApi", Api)
    store = SimpleNamespace(parts=lambda: [((0, 1500), None)])
    source = SimpleNamespace(files=None, description="user/scans (train)")
    args = SimpleNamespace(input="user/scans", hf_token=None, revision=None)
    data = script.card_metadata(source, store, args).to_dict()
    assert data["source_datasets"] == ["user/scans"] and data["license"] == "mit"
    assert data["size_categories"] == ["1K<n<10K"]
