"""Resume only the same run: the run manifest, one writer per output and shard, the Hub as the
truth for a Hub OUTPUT. Against the stub server, as a user reruns a command."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (ALL_SCRIPTS, ROOT, FakeHub, expected_text, load_output, load_script, run_script,
                      write_image_folder)
from test_write_path import journal_rows, part_rows, start_driver, stats_of, wait_for

OVIS = "ovis-ocr2-server.py"


def common(stub, *extra):
    return ["--server", stub.url, "--part-rows", "5", *extra]


@pytest.mark.parametrize("first, second, named", [
    (["--shuffle", "--seed", "1", "--max-samples", "5"], ["--shuffle", "--seed", "2"], "--seed"),
    ([], ["--output-column", "text"], "--output-column"),
    ([], ["--max-tokens", "900"], "max_tokens"),
    ([], ["--loop-retries", "2"], "loop_retries"),
    (["--max-samples", "6"], ["--max-samples", "4"], "--max-samples"),
])
def test_a_rerun_that_is_another_run_is_refused_before_any_work(tmp_path, stub_server, first,
                                                                second, named):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 10)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(stub, *first)).returncode == 0
    card = (tmp_path / "out" / "README.md").read_text()
    sent = len(stub.requests())
    run = run_script(OVIS, *args, *common(stub, *second))
    assert run.returncode == 2, run.stderr
    assert named in run.stderr and "--restart" in run.stderr and "another OUTPUT" in run.stderr
    assert len(stub.requests()) == sent
    assert (tmp_path / "out" / "README.md").read_text() == card
    run = run_script(OVIS, *args, *common(stub, *second, "--restart"))  # the way out
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds.num_rows == (4 if "4" in second else 10)
    assert len(set(ds["file_name"])) == ds.num_rows


def test_a_changed_input_folder_or_another_script_is_refused(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 6)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(stub)).returncode == 0
    (tmp_path / "in" / "page_0003.png").rename(tmp_path / "in" / "page_9999.png")
    run = run_script(OVIS, *args, *common(stub))
    assert run.returncode == 2 and "input" in run.stderr, run.stderr
    (tmp_path / "in" / "page_9999.png").rename(tmp_path / "in" / "page_0003.png")
    lighton = load_script("lighton-ocr3-saturate.py")
    other = stub_server("--model", lighton.MODEL_ID)
    run = run_script("lighton-ocr3-saturate.py", *args, *common(other))
    assert run.returncode == 2 and "script" in run.stderr, run.stderr
    assert other.requests() == []


def test_a_larger_max_samples_over_the_same_order_continues_the_run(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 9)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--shuffle", "--seed", "5"]
    assert run_script(OVIS, *args, *common(stub, "--max-samples", "4")).returncode == 0
    first = load_output(tmp_path / "out")["file_name"]
    assert run_script(OVIS, *args, *common(stub)).returncode == 0
    ds = load_output(tmp_path / "out")
    assert ds["file_name"][:4] == first and sorted(ds["file_name"]) == [p.name for p in paths]
    assert len(stub.requests()) == 9


def test_a_rerun_with_nothing_to_do_leaves_the_card_alone(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert run_script(OVIS, *args).returncode == 0
    assert (tmp_path / "out" / "README.md").read_text() == card


def test_the_card_counts_the_whole_output_after_shards(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 9)
    for shard in ("1", "0"):
        assert run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"),
                          *common(stub, "--num-shards", "2", "--shard-index", shard)).returncode == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "This output holds 9 rows: 9 with text and 0 error rows." in card  # not shard 0's 4


def test_two_processes_on_one_output_the_second_is_refused_naming_the_first(tmp_path, stub_server):
    stub = stub_server("--latency", "0.2")
    paths = write_image_folder(tmp_path / "in", 30)
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(out),
                              *common(stub, "--concurrency", "2")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_rows(out) >= 2, process=first)
    second = run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub))
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid}" in second.stderr
    assert first.wait(timeout=120) == 0, first.stderr.read()
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]  # 30 rows, none twice
    assert len(stub.requests()) == 30


def test_shards_of_one_run_write_side_by_side(tmp_path, stub_server):
    stub = stub_server("--latency", "0.1")
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    shards = [subprocess.Popen([sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(out),
                                *common(stub, "--num-shards", "2", "--shard-index", str(i))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    for shard in shards:
        assert shard.wait(timeout=120) == 0, shard.stderr.read()
    assert load_output(out)["file_name"] == [p.name for p in paths]


def hub_run(module, hub, tmp_path, stub, stage, *extra):
    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(tmp_path / stage),
            *common(stub, *extra)]
    return module.main(argv, hub_api=hub)


def test_the_hub_is_the_truth_for_a_hub_output(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 8)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")
    assert hub_run(module, hub, tmp_path, stub, "laptop", "--max-samples", "4") == 0
    # the staging copy is a cache: parts on the Hub are not kept on disk
    assert not list((tmp_path / "laptop" / "user__ocr-out" / "data").glob("*.parquet"))
    # the user deletes the repo: the rerun sends every row again, from this staging copy
    shutil.rmtree(tmp_path / "hub" / "user/ocr-out")
    sent = len(stub.requests())
    assert hub_run(module, hub, tmp_path, stub, "laptop") == 0
    assert len(stub.requests()) - sent == 8
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["file_name"] == [p.name for p in paths]


def test_staged_parts_the_hub_already_covers_are_never_sent_again(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 8)
    module = load_script(OVIS)
    offline = FakeHub(tmp_path / "hub", refuse_first=10 ** 6)  # a laptop whose uploads fail
    module.UPLOAD_ATTEMPTS, attempts = 1, module.UPLOAD_ATTEMPTS
    try:
        assert hub_run(module, offline, tmp_path, stub, "laptop", "--max-samples", "4") == 6
    finally:
        module.UPLOAD_ATTEMPTS = attempts
    online = FakeHub(tmp_path / "hub")
    assert hub_run(module, online, tmp_path, stub, "job", "--part-rows", "3") == 0  # a Job: all 8
    sent = len(stub.requests())
    assert hub_run(module, online, tmp_path, stub, "laptop") == 0  # the laptop again
    assert len(stub.requests()) == sent
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["file_name"] == [p.name for p in paths]  # pages 0-3 once


class IntrudingHub(FakeHub):
    """Another writer of the same rows commits a part while this run is going."""

    def __init__(self, root: Path, foreign: Path):
        super().__init__(root)
        self.foreign, self.listings = foreign, 0

    def list_repo_files(self, repo_id, repo_type=None, revision=None):
        self.listings += 1
        if self.listings == 2:  # after this run's start
            target = self.root / repo_id / "data" / "part-000000005-000000010.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.foreign, target)
        return super().list_repo_files(repo_id, repo_type)


def test_a_second_writer_on_the_hub_stops_instead_of_doubling_rows(tmp_path, stub_server):
    stub = stub_server("--latency", "0.05")
    write_image_folder(tmp_path / "in", 20)
    write_image_folder(tmp_path / "other", 1)
    module = load_script(OVIS)
    assert module.main([str(tmp_path / "other"), str(tmp_path / "x"), *common(stub)]) == 0
    foreign = next((tmp_path / "x" / "data").glob("*.parquet"))
    hub = IntrudingHub(tmp_path / "hub", foreign)
    with pytest.raises(SystemExit) as stopped:  # seen as the run claims OUTPUT: no page sent
        hub_run(module, hub, tmp_path, stub, "stage", "--concurrency", "2")
    assert stopped.value.code == 2 and stub.requests()[1:] == []
    files = [f for commit in hub.commits for f in commit if f.startswith("data/")]
    assert not any("000000005-000000010" in f for f in files)  # it never wrote over the other


def test_a_hub_input_is_pinned_to_the_revision_the_first_run_read(tmp_path, stub_server,
                                                                  monkeypatch):
    import datasets

    stub = stub_server()
    module = load_script(OVIS)
    paths = write_image_folder(tmp_path / "in", 3)
    local = datasets.Dataset.from_dict(
        {"image": [{"bytes": p.read_bytes(), "path": None} for p in paths]},
        features=datasets.Features({"image": datasets.Image()}))
    asked = []
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: asked.append(k.get("revision")) or local)
    monkeypatch.setattr(module, "hub_dataset_sha", lambda args: args.revision or "c0ffee" * 6)
    argv = ["user/scans", str(tmp_path / "out"), *common(stub)]
    assert module.main(argv) == 0
    assert module.main(list(argv)) == 0  # the rerun, without --revision
    assert asked == [None, "c0ffee" * 6]
    manifest = json.loads((tmp_path / "out" / ".ocr" / "manifest.json").read_text())
    assert manifest["identity"]["input"] == {"hub": "user/scans", "revision": "c0ffee" * 6}


# ---- found by trying to break it (each failed before its fix) ---------------------------------

def test_images_rerendered_under_the_same_names_are_another_input(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 4)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    from conftest import page_image
    (tmp_path / "in" / "page_0002.png").write_bytes(page_image(77))  # another page, same name
    run = run_script(OVIS, *args)
    assert run.returncode == 2 and "page_0002.png" in run.stderr, run.stderr


def test_a_touched_or_copied_parquet_is_the_same_input(tmp_path, stub_server):
    from conftest import page_image, write_parquet_dataset
    stub = stub_server()
    path = write_parquet_dataset(tmp_path / "pq", [page_image(i) for i in range(3)])
    args = [str(tmp_path / "pq"), str(tmp_path / "out"), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)  # copied back: a new time, the same bytes
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) == 3


def test_retry_errors_after_a_killed_run_redoes_the_errors(tmp_path, stub_server):
    """A killed run leaves its journal behind, error rows included, though its parts hold them."""
    import hashlib
    paths = write_image_folder(tmp_path / "in", 6)
    refused = hashlib.sha1(paths[1].read_bytes()).hexdigest()[:12]
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(stub_server("--reject-digest", refused))).returncode == 0
    journal = tmp_path / "out" / ".ocr" / "journal" / "shard-0-of-1"
    journal.mkdir(parents=True, exist_ok=True)
    error = load_output(tmp_path / "out")["markdown_error"][1]
    (journal / "00000000000000000001-1.jsonl").write_text(json.dumps(
        {"row": 1, "text": None, "error": error, "error_kind": "page", "finish_reason": None,
         "prompt_tokens": None, "completion_tokens": None, "extras": {}}) + "\n")
    good = stub_server()
    assert run_script(OVIS, *args, *common(good, "--retry-errors")).returncode == 0
    assert len(good.requests()) == 1
    assert load_output(tmp_path / "out")["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def killed_over_a_symlinked_folder(tmp_path, stub) -> tuple[list, int]:
    """A folder whose scans are mostly in a symlinked subfolder (BMP: one size for every page),
    its run killed (-9) with 6 or more rows in the journal and none in a part."""
    write_image_folder(tmp_path / "in", 2, fmt="BMP")
    write_image_folder(tmp_path / "elsewhere", 8, fmt="BMP")
    (tmp_path / "in" / "pages").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url, "--concurrency",
            "1", "--part-rows", "100", "--part-seconds", "3600"]
    driver = start_driver(*args)
    wait_for(lambda: journal_rows(tmp_path / "out") >= 6, process=driver)
    driver.kill()
    driver.wait()
    assert part_rows(tmp_path / "out") == 0
    return args, journal_rows(tmp_path / "out")


def texts_by_file(folder: Path) -> dict:
    ds = load_output(folder)
    return dict(zip(ds["file_name"], ds["markdown"]))


def test_an_image_renamed_in_a_symlinked_subfolder_is_another_input(tmp_path, stub_server):
    """The run's identity lists the files the reader reads, from the same walk: a symlinked
    subfolder's too (it was not listed, and the journal's rows went to the renamed rows)."""
    stub = stub_server("--latency", "0.2")
    args, _ = killed_over_a_symlinked_folder(tmp_path, stub)
    (tmp_path / "elsewhere" / "page_0003.bmp").rename(tmp_path / "elsewhere" / "page_0003b.bmp")
    sent = len(stub.requests())
    run = run_script(OVIS, *args)
    assert run.returncode == 2 and "pages/page_0003.bmp" in run.stderr, run.stderr
    assert len(stub.requests()) == sent


def test_an_image_replaced_by_one_of_the_same_size_is_not_given_the_old_text(tmp_path,
                                                                          stub_server):
    """A journaled row is reused only for the bytes it was made from: a BMP page replaced by
    another of the same size (same name, same size: the same identity) is sent again; the other
    journaled rows are not."""
    from conftest import page_image
    stub = stub_server("--latency", "0.2")
    args, journaled = killed_over_a_symlinked_folder(tmp_path, stub)
    replaced = tmp_path / "elsewhere" / "page_0001.bmp"  # row 3, in the journal
    new = page_image(77, fmt="BMP")
    assert len(new) == replaced.stat().st_size
    replaced.write_bytes(new)
    sent = len(stub.requests())
    run = run_script(OVIS, *args, "--stats-json", str(tmp_path / "s.json"))
    assert run.returncode == 0, run.stderr
    assert "1 row(s) of the journal are done again" in run.stderr
    assert stats_of(tmp_path / "s.json")["rows_recovered"] == journaled - 1
    assert len(stub.requests()) - sent == 10 - journaled + 1
    fresh = [str(tmp_path / "in"), str(tmp_path / "fresh"), "--server", stub.url]
    assert run_script(OVIS, *fresh).returncode == 0  # each image's own text, in one run
    texts = texts_by_file(tmp_path / "out")
    assert texts == texts_by_file(tmp_path / "fresh")
    assert texts["pages/page_0001.bmp"] != texts["page_0001.bmp"]  # (the old bytes, seed 1)



def test_a_page_replaced_inside_a_pdf_of_the_same_size_is_not_given_the_old_text(tmp_path,
                                                                                stub_server):
    """A PDF's digest was its size and last 64 KiB: a scan rewritten with its first page
    changed (uncompressed pages: the same size, the same tail) kept the old page's text."""
    from pdfs import raw_image_pdf
    stub = stub_server("--latency", "0.5")
    doc = tmp_path / "in" / "scan.pdf"
    doc.parent.mkdir()
    doc.write_bytes(raw_image_pdf([(200, 30, 30), (30, 200, 30), (30, 30, 200)]))
    args = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url, "--concurrency",
            "1", "--part-rows", "100", "--part-seconds", "3600", "--pdf-dpi", "72"]
    driver = start_driver(*args)
    wait_for(lambda: journal_rows(tmp_path / "out") >= 1, process=driver)
    driver.kill()
    driver.wait()
    assert part_rows(tmp_path / "out") == 0
    new = raw_image_pdf([(30, 30, 30), (30, 200, 30), (30, 30, 200)])
    assert len(new) == doc.stat().st_size and new[-65536:] == doc.read_bytes()[-65536:]
    doc.write_bytes(new)
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert "row(s) of the journal are done again" in run.stderr
    fresh = [str(tmp_path / "in"), str(tmp_path / "fresh"), "--server", stub.url, "--pdf-dpi",
             "72"]
    assert run_script(OVIS, *fresh).returncode == 0  # each page's own text, in one run
    assert load_output(tmp_path / "out")["markdown"] == \
        load_output(tmp_path / "fresh")["markdown"]

def test_journal_rows_of_an_older_version_without_a_digest_are_done_again(tmp_path, stub_server):
    stub = stub_server("--latency", "0.2")
    args, journaled = killed_over_a_symlinked_folder(tmp_path, stub)
    for segment in (tmp_path / "out" / ".ocr" / "journal").rglob("*.jsonl"):
        lines = [json.loads(line) for line in segment.read_text().splitlines()]
        segment.write_text("".join(json.dumps({k: v for k, v in entry.items() if k != "digest"})
                                   + "\n" for entry in lines))
    sent = len(stub.requests())
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) - sent == 10
    fresh = [str(tmp_path / "in"), str(tmp_path / "fresh"), "--server", stub.url]
    assert run_script(OVIS, *fresh).returncode == 0
    assert texts_by_file(tmp_path / "out") == texts_by_file(tmp_path / "fresh")


def test_files_the_reader_never_reads_do_not_block_the_resume(tmp_path, stub_server):
    """desktop.ini, Thumbs.db, a note: not images, not read, so not part of the run."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 6)
    args = [str(tmp_path / "in"), str(tmp_path / "out"), *common(stub, "--max-samples", "3")]
    assert run_script(OVIS, *args).returncode == 0
    (tmp_path / "in" / "desktop.ini").write_text("[.ShellClassInfo]\n")
    (tmp_path / "in" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0" * 100)
    (tmp_path / "in" / "sub").mkdir()
    (tmp_path / "in" / "sub" / "notes.txt").write_text("scanned on Monday")
    run = run_script(OVIS, *args[:-2])  # the rest of the run
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) == 6
    assert load_output(tmp_path / "out")["markdown"] == [expected_text(p.read_bytes())
                                                          for p in paths]


def test_a_lost_card_is_written_again_and_a_refusal_leaves_its_own_stats(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(stub, "--stats-json", str(tmp_path / "s.json"))).returncode == 0
    (tmp_path / "out" / "README.md").unlink()  # a kill while the card was written
    assert run_script(OVIS, *args, *common(stub)).returncode == 0
    assert (tmp_path / "out" / "README.md").exists()
    run = run_script(OVIS, *args, *common(stub, "--max-tokens", "700",
                                         "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 2
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["exit_code"] == 2 and stats["rows_ok"] == 0


def test_a_degenerate_stop_leaves_no_manifest_behind(tmp_path, stub_server):
    bad, good = stub_server("--degenerate"), stub_server()
    write_image_folder(tmp_path / "in", 6)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    assert run_script(OVIS, *args, *common(bad)).returncode == 3
    run = run_script(OVIS, *args, *common(good, "--max-tokens", "900"))  # other flags: fine
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("pages", [2, 46])
def test_a_server_that_fails_every_page_refuses_the_run_however_short(tmp_path, stub_server,
                                                                      pages):
    """A server answering 500 to everything: exit 4 with the rows left pending, not a run of
    error rows (it was exit 0 for a short run, and '0 ok, 46 failed' for a longer one)."""
    dead = stub_server("--fail-first", str(10 ** 9))
    paths = write_image_folder(tmp_path / "in", pages)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    run = run_script(OVIS, *args, *common(dead, "--max-retries", "0",
                                          "--stats-json", str(tmp_path / "s.json")))
    assert run.returncode == 4, run.stderr
    assert f"no page of this run was answered: {pages} failed on the server's side" in run.stderr
    assert "HTTP 500" in run.stderr and "rerun the same command to send them again" in run.stderr
    stats = json.loads((tmp_path / "s.json").read_text())
    assert (stats["rows_failed"], stats["rows_not_written"], stats["exit_code"]) == (0, pages, 4)
    assert not list((tmp_path / "out" / "data").glob("*.parquet"))
    assert journal_rows(tmp_path / "out") == 0
    good = stub_server()
    run = run_script(OVIS, *args, *common(good))  # the rerun sends every page again
    assert run.returncode == 0, run.stderr
    assert len(good.requests()) == pages
    assert load_output(tmp_path / "out")["markdown"] == [expected_text(p.read_bytes())
                                                          for p in paths]


def test_a_page_the_server_always_fails_does_not_make_every_rerun_exit_4(tmp_path, stub_server):
    """A rerun that only redoes error rows, all failing again on the server's side, loses
    nothing (they were error rows already): they stay error rows, exit 0. Fresh rows failing so
    are still the server refusing the run."""
    write_image_folder(tmp_path / "in", 4)
    args = [str(tmp_path / "in"), str(tmp_path / "out")]
    once = stub_server("--fail-first", "1")
    run = run_script(OVIS, *args, *common(once, "--max-retries", "0", "--max-samples", "3"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["markdown_error_kind"].count("server") == 1
    dead = stub_server("--fail-first", str(10 ** 9))
    run = run_script(OVIS, *args, *common(dead, "--max-retries", "0", "--max-samples", "3"))
    assert run.returncode == 0, run.stderr
    assert len(dead.requests()) == 1
    ds = load_output(tmp_path / "out")
    assert len(ds) == 3 and ds["markdown_error_kind"].count("server") == 1
    run = run_script(OVIS, *args, *common(dead, "--max-retries", "0"))  # one fresh row now
    assert run.returncode == 4 and "no page of this run was answered" in run.stderr, run.stderr
    assert len(load_output(tmp_path / "out")) == 3


def test_a_run_whose_every_page_is_refused_as_a_page_writes_their_errors(tmp_path, stub_server):
    """400s are the pages' own errors, final: not the server refusing the run."""
    write_image_folder(tmp_path / "in", 2)
    stub = stub_server("--reject-smaller-than", "100000")
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["markdown_error_kind"] == ["page"] * 2 and ds["markdown"] == [None] * 2


class RacingHub(FakeHub):
    """Another writer commits a part of the same rows between this run's check and its commit:
    the commit names the head it checked, so the Hub refuses it (412) and the check runs again."""

    def __init__(self, root: Path, foreign: Path):
        super().__init__(root)
        self.foreign, self.raced = foreign, False

    def create_commit(self, repo_id, operations, commit_message=None, repo_type=None,
                      parent_commit=None):
        if not self.raced and any(op.path_in_repo.startswith("data/") for op in operations):
            self.raced = True  # the other writer's commit lands first
            target = self.root / repo_id / "data" / "part-000000000-000000004.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.foreign, target)
            self.head += 1
        return super().create_commit(repo_id, operations, commit_message, repo_type,
                                     parent_commit)


def test_a_commit_that_lands_between_the_check_and_this_commit_is_refused(tmp_path, stub_server,
                                                                         monkeypatch):
    stub = stub_server("--latency", "0.05")
    write_image_folder(tmp_path / "in", 8)
    write_image_folder(tmp_path / "other", 4)
    module = load_script(OVIS)
    monkeypatch.setattr(module, "UPLOAD_BACKOFF_S", 0.01)
    assert module.main([str(tmp_path / "other"), str(tmp_path / "x"), *common(stub)]) == 0
    hub = RacingHub(tmp_path / "hub", next((tmp_path / "x" / "data").glob("*.parquet")))
    assert hub_run(module, hub, tmp_path, stub, "stage", "--part-rows", "4") == 2
    written = [f for commit in hub.commits for f in commit if f.startswith("data/")]
    assert written == []  # this run never committed a part over the other writer's


@pytest.mark.parametrize("script", ["ovis-ocr2.py", "lighton-ocr3.py"])
def test_a_rerun_right_after_kill_9_is_not_refused_by_the_engine_process_left_behind(
        tmp_path, script):
    """vLLM forks its engine process, and one can outlive a killed driver for a while (so can
    a PDF renderer): it must not hold OUTPUT's lock, or the user's rerun is refused."""
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), "--batch-size", "4", "--part-rows", "4",
            "--no-sanity-check"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "fake_vllm_pkg"),
           "FAKE_VLLM_BATCH_SECONDS": "0.5", "FAKE_VLLM_ENGINE_LINGERS": "60"}
    driver = subprocess.Popen([sys.executable, str(ROOT / script), *args], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_rows(out) >= 4, process=driver)
    driver.kill()
    driver.wait()
    env.pop("FAKE_VLLM_ENGINE_LINGERS")
    try:
        run = run_script(script, *args, env=env)
        assert run.returncode == 0, run.stderr
        assert load_output(out)["file_name"] == [p.name for p in paths]
    finally:
        subprocess.run(["pkill", "-f", f"{out}"], check=False)  # the lingering child, if any


def test_an_output_on_a_filesystem_without_locks_is_written_with_a_warning(
        tmp_path, stub_server, monkeypatch, capsys):
    """Some network and FUSE mounts answer ENOLCK or EOPNOTSUPP: that is not another run."""
    import errno
    import fcntl

    def no_locks(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 4)
    module = load_script(OVIS)
    assert module.main([str(tmp_path / "in"), str(tmp_path / "out"), *common(stub)]) == 0
    assert "nothing stops a second run" in capsys.readouterr().err
    assert load_output(tmp_path / "out")["file_name"] == [p.name for p in paths]


# ---- a Hub OUTPUT resumed on another machine (every Job starts on an empty disk) ---------------

def test_server_error_rows_on_the_hub_are_redone_by_a_rerun_on_another_machine(tmp_path,
                                                                               stub_server):
    """Only the Hub holds the parts: its notes (.ocr/notes/) say which rows failed and why, so
    the rerun fetches just those parts and redoes their server error rows (found by trying to
    break it: the rerun said '0 rows to do' and the error rows stayed)."""
    faulty, good = stub_server("--fail-every", "3"), stub_server()
    paths = write_image_folder(tmp_path / "in", 12)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")
    hub_run(module, hub, tmp_path, faulty, "job-1", "--max-retries", "0", "--concurrency", "1")
    repo = tmp_path / "hub" / "user/ocr-out"
    first = load_output(repo)
    failed = [i for i, kind in enumerate(first["markdown_error_kind"]) if kind == "server"]
    assert failed and len(failed) < 12
    assert f"{12 - len(failed)} with text and {len(failed)} error rows" in \
        (repo / "README.md").read_text()
    assert hub_run(module, hub, tmp_path, good, "job-2") == 0  # a fresh disk
    assert len(good.requests()) == len(failed)  # those rows only
    ds = load_output(repo)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert "12 with text and 0 error rows" in (repo / "README.md").read_text()
    assert hub_run(module, hub, tmp_path, good, "job-3") == 0  # nothing left to redo
    assert len(good.requests()) == len(failed)


def test_after_failed_uploads_the_rerun_sends_the_manifest_and_card_too(tmp_path, stub_server):
    """Found by trying to break it: the recovery rerun sent only the parts, so the Hub had no
    manifest, and a different run from another machine was accepted into the same repo."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 6)
    module = load_script(OVIS)
    module.UPLOAD_ATTEMPTS, attempts = 1, module.UPLOAD_ATTEMPTS
    try:
        assert hub_run(module, FakeHub(tmp_path / "hub", fail_uploads=True), tmp_path, stub,
                       "laptop") == module.EXIT_NOT_UPLOADED
    finally:
        module.UPLOAD_ATTEMPTS = attempts
    hub = FakeHub(tmp_path / "hub")
    assert hub_run(module, hub, tmp_path, stub, "laptop") == 0
    repo = tmp_path / "hub" / "user/ocr-out"
    assert (repo / ".ocr" / "manifest.json").exists() and (repo / "README.md").exists()
    assert "6 with text and 0 error rows" in (repo / "README.md").read_text()
    assert load_output(repo)["file_name"] == [p.name for p in paths]
    with pytest.raises(SystemExit) as refused:  # another run, from another machine
        hub_run(module, hub, tmp_path, stub, "job", "--max-tokens", "900")
    assert refused.value.code == 2


class NoDownloadsHub(FakeHub):
    def hf_hub_download(self, repo_id, filename, repo_type=None, local_dir=None):
        if filename.startswith("data/"):
            raise ConnectionError("hub unreachable (injected)")
        return super().hf_hub_download(repo_id, filename, repo_type, local_dir)


def test_a_part_the_hub_cannot_give_is_named_not_a_full_disk(tmp_path, stub_server, capsys):
    stub = stub_server("--fail-every", "3")
    write_image_folder(tmp_path / "in", 6)
    module = load_script(OVIS)
    hub_run(module, FakeHub(tmp_path / "hub"), tmp_path, stub, "a", "--max-retries", "0")
    capsys.readouterr()  # a fresh disk: the part with row 2's server error is fetched to redo it
    with pytest.raises(SystemExit) as stopped:
        hub_run(module, NoDownloadsHub(tmp_path / "hub"), tmp_path, stub, "b")
    err = capsys.readouterr().err
    assert stopped.value.code == module.EXIT_NOT_WRITTEN
    assert "cannot download data/part-000000000-000000005.parquet from user/ocr-out (Connection" \
        "Error: hub unreachable (injected)). Nothing was sent" in err and "free space" not in err


HUB_DRIVER = """import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from conftest import FakeHub, load_script
sys.argv[0] = {script!r}
sys.exit(load_script("ovis-ocr2-server.py").main(sys.argv[2:], hub_api=FakeHub(Path(sys.argv[1]))))
"""


def test_two_shards_on_one_machine_share_the_staging_folder_and_send_their_own_parts(
        tmp_path, stub_server):
    """Two shards of one Hub OUTPUT run side by side on one machine (one staging folder): the
    second sent the first's staged parts as its own and deleted them, and the first then
    crashed at its last commit (a traceback, its last parts never sent)."""
    slow, fast = stub_server("--latency", "0.5"), stub_server()
    paths = write_image_folder(tmp_path / "in", 16)
    driver = HUB_DRIVER.format(tests=str(ROOT / "tests"), script=str(ROOT / OVIS))

    def argv(server, i):
        return [sys.executable, "-c", driver, str(tmp_path / "hub"), str(tmp_path / "in"),
                "user/ocr-out", "--work-dir", str(tmp_path / "w"), "--server", server.url,
                "--part-rows", "1", "--concurrency", "1", "--no-sanity-check", "--num-shards",
                "2", "--shard-index", str(i)]

    staged = tmp_path / "w" / "user__ocr-out" / "data"
    shard0 = subprocess.Popen(argv(slow, 0), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: len(list(staged.glob("part-*"))) >= 2, process=shard0)
        shard1 = subprocess.run(argv(fast, 1), capture_output=True, text=True, timeout=300)
        assert shard1.returncode == 0, shard1.stderr
        stderr = shard0.communicate(timeout=120)[1]
    finally:
        if shard0.poll() is None:
            shard0.kill()
    assert shard0.returncode == 0 and "Traceback" not in stderr, stderr
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]

def hub_card_counts(tmp_path: Path) -> str:
    text = (tmp_path / "hub" / "user/ocr-out" / "README.md").read_text()
    return next(line for line in text.splitlines() if "This output holds" in line)


def test_the_hub_wins_over_an_old_staging_copy_of_its_parts(tmp_path, stub_server):
    """Machine A leaves a part with server errors staged; machine B redoes them on the Hub; A
    again, with a server that fails everything, must not put the error rows back (it did,
    exit 0; found by trying to break it)."""
    faulty, good = stub_server("--fail-every", "3"), stub_server()
    dead = stub_server("--fail-first", "100000")
    paths = write_image_folder(tmp_path / "in", 12)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")
    hub_run(module, hub, tmp_path, faulty, "A", "--max-retries", "0", "--concurrency", "1")
    assert hub_run(module, hub, tmp_path, good, "B") == 0
    assert hub_run(module, hub, tmp_path, dead, "A", "--max-retries", "0") == 0
    assert dead.requests() == []
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]
    assert "12 with text and 0 error rows" in hub_card_counts(tmp_path)


def test_a_staging_copy_of_a_run_restarted_elsewhere_is_cleared_not_sent(tmp_path, stub_server):
    faulty, good = stub_server("--fail-every", "3"), stub_server()
    paths = write_image_folder(tmp_path / "in", 12)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")
    hub_run(module, hub, tmp_path, faulty, "a", "--max-retries", "0", "--concurrency", "1")
    hub_run(module, hub, tmp_path, faulty, "b", "--max-retries", "0", "--concurrency", "1",
            "--restart", "--max-samples", "7")
    assert hub_run(module, hub, tmp_path, good, "c", "--max-samples", "7") == 0
    assert hub_run(module, hub, tmp_path, faulty, "a", "--max-samples", "7", "--max-retries",
                   "0") == 0  # the first machine, with its staged parts of the old run
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths[:7]]  # 7, not 9
    assert "holds 7 rows: 7 with text and 0 error rows" in hub_card_counts(tmp_path)


class SlowThenGoneHub(FakeHub):
    """The first data commit takes a while (a big upload); every later one fails (a kill)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.data_commits = 0

    def create_commit(self, repo_id, operations, commit_message=None, repo_type=None,
                      parent_commit=None):
        if any(op.path_in_repo.startswith("data/") for op in operations):
            self.data_commits += 1
            if self.data_commits > 1:
                raise ConnectionError("gone (injected)")
            time.sleep(2.0)
        return super().create_commit(repo_id, operations, commit_message, repo_type,
                                     parent_commit)


def test_a_parts_notes_never_reach_the_hub_ahead_of_the_part(tmp_path, stub_server, monkeypatch):
    """The notes a commit carries describe the parts as that commit leaves them: a redone
    part whose commit never lands keeps its old notes, so a fresh Job still redoes its rows."""
    faulty = stub_server("--fail-every", "3")
    paths = write_image_folder(tmp_path / "in", 10)
    module = load_script(OVIS)
    hub_run(module, FakeHub(tmp_path / "hub"), tmp_path, faulty, "a", "--max-retries", "0",
            "--concurrency", "1")
    monkeypatch.setattr(module, "UPLOAD_ATTEMPTS", 1)
    slow = stub_server("--latency", "0.3")
    assert hub_run(module, SlowThenGoneHub(tmp_path / "hub"), tmp_path, slow, "b",
                   "--concurrency", "1") == module.EXIT_NOT_UPLOADED
    good = stub_server()
    assert hub_run(module, FakeHub(tmp_path / "hub"), tmp_path, good, "c") == 0  # a fresh Job
    ds = load_output(tmp_path / "hub" / "user/ocr-out")
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


class ListsLateHub(FakeHub):
    """A shard's Job started before the other shard committed: its first listing misses it."""

    def __init__(self, root: Path, hide: list[str]):
        super().__init__(root)
        self.hide, self.listings = hide, 0

    def hiding(self) -> bool:
        return self.listings == 1

    def list_repo_files(self, repo_id, repo_type=None, revision=None):
        self.listings += 1
        files = super().list_repo_files(repo_id, repo_type)
        return [f for f in files if not any(h in f for h in self.hide)] if self.hiding() else files


class CommitsLateHub(ListsLateHub):
    """The other shard's commit lands between this shard's last listing and its own commit:
    every listing misses it until this shard has committed its card."""

    card_sent = False

    def hiding(self) -> bool:
        return not self.card_sent

    def create_commit(self, repo_id, operations, *args, **kwargs):
        super().create_commit(repo_id, operations, *args, **kwargs)
        self.card_sent |= any(op.path_in_repo == "README.md" for op in operations)


@pytest.mark.parametrize("late_hub", [ListsLateHub, CommitsLateHub])
def test_the_card_counts_what_other_shards_wrote_during_the_run(tmp_path, stub_server, late_hub):
    """Two shards: the second's Job lists the repo before the first shard's commit shows
    (ListsLateHub), or that commit lands while it makes its card (CommitsLateHub: the card is
    made again; test_jobs_http's three-Job run failed on this race when it was not). The card of
    the one that commits last counts every part (ocr-jobs.py checks the card)."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 12)
    module = load_script(OVIS)
    shards = ["--num-shards", "2", "--shard-index"]
    assert hub_run(module, FakeHub(tmp_path / "hub"), tmp_path, stub, "s0", *shards, "0") == 0
    late = late_hub(tmp_path / "hub", ["part-000000000", "shard-0-of-2", "README.md"])
    assert hub_run(module, late, tmp_path, stub, "s1", *shards, "1") == 0
    assert "holds 12 rows: 12 with text and 0 error rows." in hub_card_counts(tmp_path)


class CountingHub(FakeHub):
    """Counts the parts downloaded from it."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.parts_fetched: list[str] = []

    def hf_hub_download(self, repo_id, filename, repo_type=None, local_dir=None):
        if filename.startswith("data/"):
            self.parts_fetched.append(Path(filename).name)
        return super().hf_hub_download(repo_id, filename, repo_type, local_dir)


def test_parts_on_the_hub_without_notes_are_taken_as_they_are(tmp_path, stub_server):
    """Parts that reached the Hub without their notes (an `hf upload` by hand) are neither
    downloaded nor redone, not even with --retry-errors: their rows stay as they are, and the
    card says how many rows it could not count (round 4 dropped rebuilding their notes)."""
    paths = write_image_folder(tmp_path / "in", 12)
    refused = hashlib.sha1(paths[1].read_bytes()).hexdigest()[:12]
    faulty = stub_server("--fail-every", "7", "--reject-digest", refused)  # row 6: 500; 1: 400
    module = load_script(OVIS)
    assert hub_run(module, FakeHub(tmp_path / "hub"), tmp_path, faulty, "a", "--max-retries",
                   "0", "--concurrency", "1") == 0
    repo = tmp_path / "hub" / "user/ocr-out"
    notes_file = repo / ".ocr" / "notes" / "shard-0-of-1.json"
    notes = json.loads(notes_file.read_text())
    assert notes["part-000000000-000000005.parquet"]["errors"] == {"1": "page"}
    assert notes["part-000000005-000000010.parquet"]["errors"] == {"6": "server"}
    notes_file.write_text(json.dumps({"part-000000010-000000012.parquet":
                                      notes.pop("part-000000010-000000012.parquet")}))
    (repo / "README.md").unlink()  # the rerun writes the card again
    hub, good = CountingHub(tmp_path / "hub"), stub_server()
    assert hub_run(module, hub, tmp_path, good, "b", "--retry-errors") == 0  # a fresh disk
    assert hub.parts_fetched == [] and good.requests() == []
    expected = [expected_text(p.read_bytes()) for p in paths]
    expected[1] = expected[6] = None
    assert load_output(repo)["markdown"] == expected
    assert "12 rows: 2 with text and 0 error rows (10 on the Hub were not counted)" in \
        hub_card_counts(tmp_path)


def hub_http_error(status: int, message: str) -> Exception:
    """A real HfHubHTTPError, on the response type of the installed huggingface_hub (httpx's,
    or requests' before 1.0)."""
    import importlib

    from huggingface_hub import errors
    response_type = errors.Response
    if response_type.__module__.startswith("requests"):
        response = response_type()
        response.status_code = status
    else:
        http = importlib.import_module(response_type.__module__.split(".")[0])
        response = response_type(status, request=http.Request("POST", "https://huggingface.co/api"))
    return errors.HfHubHTTPError(message, response=response)


@pytest.mark.parametrize("method, error, says", [
    ("create_repo", lambda: hub_http_error(403, "403 Forbidden: you don't have the rights to "
                                                "create a dataset under the namespace 'user'"),
     "the Hub refused OUTPUT user/ocr-out (HfHubHTTPError: 403 Forbidden"),
    ("list_repo_files", lambda: hub_http_error(500, "500 Server Error: Internal Server Error"),
     "the Hub failed while opening OUTPUT user/ocr-out (HfHubHTTPError: 500 Server Error"),
    ("create_repo", lambda: RuntimeError("the Hub client broke (injected)"),
     "the Hub failed while opening OUTPUT user/ocr-out (RuntimeError: the Hub client broke"),
])
def test_a_hub_that_refuses_or_fails_at_the_start_is_named_not_a_full_disk(
        tmp_path, stub_server, capsys, method, error, says):
    """A read-only token's 403 was 'cannot write to OUTPUT ... free space' (HfHubHTTPError is an
    OSError); a Hub error that is no OSError was a traceback."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    hub, exc = FakeHub(tmp_path / "hub"), error()
    setattr(hub, method, lambda *args, **kwargs: (_ for _ in ()).throw(exc))
    with pytest.raises(SystemExit) as exited:
        hub_run(load_script(OVIS), hub, tmp_path, stub, "stage", "--stats-json",
                str(tmp_path / "s.json"))
    assert exited.value.code == 5  # README: rows not written
    err = capsys.readouterr().err
    assert says in err and "Nothing was sent" in err and "free space" not in err
    if "403" in says:
        assert "needs write access (HF_TOKEN or --hf-token" in err
    assert json.loads((tmp_path / "s.json").read_text())["exit_code"] == 5
    assert stub.requests() == []


def test_private_on_an_existing_public_repo_says_it_stays_public(tmp_path, stub_server, capsys):
    """create_repo(exist_ok=True) changes no visibility: --private did nothing, silently."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    module, hub = load_script(OVIS), FakeHub(tmp_path / "hub")
    hub.create_repo("user/ocr-out", repo_type="dataset", private=False)
    assert hub_run(module, hub, tmp_path, stub, "stage", "--private") == 0
    assert "warning: user/ocr-out exists and is public: --private applies only to a repo it " \
           "creates" in capsys.readouterr().err
    hub = FakeHub(tmp_path / "hub2")  # a repo this run creates is private: nothing to say
    assert hub_run(module, hub, tmp_path, stub, "stage3", "--private") == 0
    assert "public" not in capsys.readouterr().err and hub.private["user/ocr-out"] is True


def test_a_card_that_cannot_be_staged_for_the_hub_exits_6_and_the_rerun_sends_it(
        tmp_path, stub_server, capsys):
    """Issue #28: the rows reached the Hub, the card did not: exit 6 (files that did not reach
    the Hub), said as the card, and the rerun sends it."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")
    stage = tmp_path / "laptop" / "user__ocr-out"
    stage.mkdir(parents=True)
    (stage / "README.md").symlink_to("/dev/full")  # the staging disk full at the card
    assert hub_run(module, hub, tmp_path, stub, "laptop") == 6
    assert "cannot write the dataset card" in capsys.readouterr().err
    assert len(load_output(tmp_path / "hub" / "user/ocr-out")) == 3
    (stage / "README.md").unlink()
    assert hub_run(module, hub, tmp_path, stub, "laptop") == 0
    assert (tmp_path / "hub" / "user/ocr-out" / "README.md").exists()


def shape_parts(module) -> tuple:
    """The script's shape's options and their checks, as its main() passes them."""
    if module.SCRIPT_SHAPE == "offline":
        return module.add_offline_arguments, module.offline_argument_problems
    return module.add_server_arguments, module.server_argument_problems


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_every_option_of_every_script_says_whether_it_is_part_of_the_runs_identity(script):
    """Issue #43 item 5: where an option is added it declares `identity=` (no default), so a
    forgotten one can neither leave the identity (mixing two runs) nor join it (refusing a
    resume) silently. Every script, every option: the shared ones, the shape's, the model's."""
    module = load_script(script)
    parser = module.argument_parser(module.__doc__, shape_parts(module)[0])
    parsed = vars(parser.parse_args(["in", "./out"]))
    options = [action for action in parser._actions if action.dest in parsed]
    assert len(options) == len(parsed) > 40
    assert [action.option_strings or action.dest for action in options
            if not isinstance(getattr(action, "identity", None), bool)] == []


# The options a rerun could change when the identity was every option but a closed list
# (blocks/common.py's MAY_CHANGE at commit c6ff1f5): existing OUTPUTs recorded what it left.
MAY_CHANGE_AT_C6FF1F5 = set("""input output revision shard_index max_samples concurrency
    request_timeout max_retries server api_key no_spawn server_timeout server_down_timeout
    max_restarts abort_after_failures abort_after_seconds min_window max_window adapt_interval
    max_inflight_memory api_server_count batch_size stats_json work_dir hf_token private part_rows
    part_seconds retry_errors restart overwrite no_sanity_check sanity_pages serve_args llm_kwargs
    pdf_workers pdf_page_timeout check_only loop_retries send_blank""".split())


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_runs_identity_is_the_options_declared_part_of_it_as_before(script, tmp_path):
    """The manifest's `options` are exactly the options declared identity=True (--seed with
    --shuffle only), the same ones as before the declarations (MAY_CHANGE_AT_C6FF1F5), so an
    OUTPUT written before resumes; engine flags are identity but for the speed-only ones."""
    module = load_script(script)
    (tmp_path / "in").mkdir()
    parts = shape_parts(module)
    declared = {action.dest for action in module.argument_parser(module.__doc__, parts[0])._actions
                if getattr(action, "identity", False)}
    source = argparse.Namespace(files=[], pdf=None, rows_full=0)  # a folder of no files
    for shuffle in ([], ["--shuffle"]):
        args = module.parse_arguments(module.__doc__, [str(tmp_path / "in"), str(tmp_path / "out"),
                                                       *shuffle], *parts)
        identity = module.run_identity(args, source, {"--gpu-memory-utilization": 0.5,
                                                      "--max-model-len": 8192})
        assert set(identity["options"]) == declared - ({"seed"} if not shuffle else set())
        assert set(vars(args)) - declared == MAY_CHANGE_AT_C6FF1F5 & set(vars(args))
        assert identity["engine"] == {"max-model-len": 8192}
