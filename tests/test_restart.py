"""--restart and the OUTPUTs a run may not write into: a shard's restart leaves the other
shards' rows alone, a killed restart resumes by the command it prints, a Hub OUTPUT that is
the INPUT or another dataset is refused before anything is written, and an OUTPUT an older
(or newer) version of the script wrote is refused in one line. Against the stub server and the
FakeHub, as a user runs the scripts."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (ROOT, FakeHub, expected_text, load_output, load_script, run_script,
                      write_image_folder)
from test_write_path import journal_rows, wait_for

OVIS = "ovis-ocr2-server.py"
REDONE = "redone by the restart"


def common(stub, *extra):
    return ["--server", stub.url, "--part-rows", "5", *extra]


def shard(i: int, *extra: str) -> list[str]:
    return ["--num-shards", "2", "--shard-index", str(i), *extra]


def part_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "data").glob("part-*.parquet"))}


def stopped_once_journaled(argv: list[str], out: Path, rows: int) -> tuple[int, str]:
    """Run the script with argv, SIGTERM it once `rows` rows are in OUTPUT's journal: its exit
    code and what it printed."""
    run = subprocess.Popen([sys.executable, str(ROOT / OVIS), *argv],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: journal_rows(out) >= rows, process=run)
        run.send_signal(signal.SIGTERM)
        stderr = run.communicate(timeout=60)[1]
    finally:
        if run.poll() is None:
            run.kill()
    return run.returncode, stderr


def reproduce_block(card: str) -> str:
    return card.split("Reproduce on Hugging Face Jobs:", 1)[1].split("```")[1]


# ---- a shard's --restart ------------------------------------------------------------------

def test_restart_of_one_shard_redoes_its_rows_only_and_the_card_reproduces_the_run(
        tmp_path, stub_server):
    """It deleted every shard's parts: 6 of 12 rows were left, and both shards exited 0."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    for i in (0, 1):
        assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub, *shard(i))) \
            .returncode == 0
    shard0 = {k: v for k, v in part_bytes(out).items() if k < "part-000000006"}
    assert shard0
    again = stub_server("--content", json.dumps(REDONE))
    run = run_script(OVIS, str(tmp_path / "in"), str(out), *common(again, *shard(1, "--restart")))
    assert run.returncode == 0, run.stderr
    assert len(again.requests()) == 6
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths[:6]] + [REDONE] * 6
    assert {k: v for k, v in part_bytes(out).items() if k in shard0} == shard0  # untouched
    command = reproduce_block((out / "README.md").read_text())
    assert "--num-shards 2 --shard-index 1" in command and "--restart" not in command
    assert "one Job each, with --shard-index 0 to 1" in (out / "README.md").read_text()


def test_restart_of_one_shard_on_the_hub_deletes_its_parts_only(tmp_path, stub_server):
    """Shard 1's "Restart the OCR run" commit removed shard 0's part too."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 12)
    module = load_script(OVIS)
    hub = FakeHub(tmp_path / "hub")

    def hub_run(server, stage, *extra):
        return module.main([str(tmp_path / "in"), "user/ocr-out", "--work-dir",
                            str(tmp_path / stage), *common(server, *extra)], hub_api=hub)

    assert hub_run(stub, "job-0", *shard(0)) == 0
    assert hub_run(stub, "job-1", *shard(1)) == 0
    repo = tmp_path / "hub" / "user/ocr-out"
    shard0 = {k: v for k, v in part_bytes(repo).items() if k < "part-000000006"}
    commits = len(hub.commits)
    again = stub_server("--content", json.dumps(REDONE))
    assert hub_run(again, "job-2", *shard(1, "--restart")) == 0  # a fresh Job's empty disk
    deleted = hub.commits[commits]
    assert deleted and all(f.startswith(("data/part-000000006", "data/part-000000010"))
                           or f == ".ocr/notes/shard-1-of-2.json" for f in deleted), deleted
    ds = load_output(repo)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths[:6]] + [REDONE] * 6
    assert {k: v for k, v in part_bytes(repo).items() if k in shard0} == shard0
    assert "holds 12 rows: 12 with text" in (repo / "README.md").read_text()
    # a restart that would make it another run beside shard 0's rows: refused, nothing touched
    commits = len(hub.commits)
    with pytest.raises(SystemExit) as refused:
        hub_run(again, "job-3", *shard(1, "--restart", "--max-tokens", "900"))
    assert refused.value.code == 2
    assert len(hub.commits) == commits and len(again.requests()) == 6


def test_a_restart_that_changes_the_run_beside_other_shards_rows_is_refused(tmp_path,
                                                                          stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    for i in (0, 1):
        assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub, *shard(i))) \
            .returncode == 0
    before, card = part_bytes(out), (out / "README.md").read_text()
    other = stub_server()
    run = run_script(OVIS, str(tmp_path / "in"), str(out),
                     *common(other, *shard(1, "--max-tokens", "900")))
    assert run.returncode == 2, run.stderr  # its advice was --restart, refused as below
    assert "pass --restart" not in run.stderr and "Write to a new OUTPUT" in run.stderr
    assert "a shard's --restart redoes its own rows only" in run.stderr
    run = run_script(OVIS, str(tmp_path / "in"), str(out),
                     *common(other, *shard(1, "--restart", "--max-tokens", "900")))
    assert run.returncode == 2, run.stderr
    assert "part-000000000-000000005.parquet" in run.stderr  # shard 0's rows, named
    assert "--max-tokens: was 16384, now 900" in run.stderr and "new OUTPUT" in run.stderr
    assert other.requests() == []
    assert part_bytes(out) == before and (out / "README.md").read_text() == card


def test_a_restart_beside_a_running_shard_touches_its_own_rows_only(tmp_path, stub_server):
    """A whole-run restart (--num-shards 1) is still refused while a shard writes, naming it.
    Shard 0's server answers its first page, then holds every answer until the test releases
    them: shard 0 is still running, whatever the machine's load, when shard 1 restarts."""
    release = tmp_path / "release-shard-0"
    held, fast = stub_server("--hold-after", "1", "--release-file", str(release)), stub_server()
    paths = write_image_folder(tmp_path / "in", 40)
    out = tmp_path / "out"
    shard0 = subprocess.Popen([sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(out),
                               *common(held, *shard(0), "--concurrency", "1")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: journal_rows(out) >= 1, process=shard0)
        run = run_script(OVIS, str(tmp_path / "in"), str(out), *common(fast, "--restart"))
        assert run.returncode == 2 and f"pid {shard0.pid}" in run.stderr, run.stderr
        run = run_script(OVIS, str(tmp_path / "in"), str(out),
                         *common(fast, *shard(1, "--restart")))
        assert run.returncode == 0, run.stderr
        assert shard0.poll() is None, shard0.stderr.read()  # it ran beside shard 0 all along
        release.touch()
        assert shard0.wait(timeout=120) == 0, shard0.stderr.read()
    finally:
        if shard0.poll() is None:
            shard0.kill()
    assert load_output(out)["file_name"] == [p.name for p in paths]


def test_a_shard_restart_beside_a_shard_that_has_no_row_yet_redoes_its_own_rows(tmp_path,
                                                                               stub_server):
    """Every shard launched with one command holding --restart (a job array): a shard that came
    second, while the first waited for its first answer, was refused ("--restart removes every
    shard's rows ... stop it first"), though a shard's restart touches its own rows only."""
    slow, fast = stub_server("--latency", "6.0"), stub_server()  # long past shard 1's claim
    paths = write_image_folder(tmp_path / "in", 4)
    out = tmp_path / "out"
    shard0 = subprocess.Popen([sys.executable, str(ROOT / OVIS), str(tmp_path / "in"), str(out),
                               *common(slow, *shard(0, "--restart"), "--concurrency", "1")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(slow.requests()) >= 1, process=shard0)  # the run claimed, no row
        assert journal_rows(out) == 0
        run = run_script(OVIS, str(tmp_path / "in"), str(out),
                         *common(fast, *shard(1, "--restart")))
        assert run.returncode == 0, run.stderr
        assert shard0.poll() is None
        changed = run_script(OVIS, str(tmp_path / "in"), str(out),
                             *common(fast, *shard(1, "--restart", "--max-tokens", "900")))
        assert changed.returncode == 2 and "--max-tokens: was 16384, now 900" in changed.stderr
        assert shard0.wait(timeout=120) == 0, shard0.stderr.read()
    finally:
        if shard0.poll() is None:
            shard0.kill()
    assert len(fast.requests()) == 2
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


# ---- a killed --restart resumes by the command it prints -------------------------------------

def test_a_sigtermed_restart_says_to_resume_without_restart(tmp_path, stub_server):
    """It said "rerun the same command to resume", and that command restarted from zero."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 12)
    out = tmp_path / "out"
    assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub)).returncode == 0
    slow = stub_server("--latency", "0.3")
    argv = [str(tmp_path / "in"), str(out), *common(slow, "--concurrency", "1", "--part-rows", "2")]
    code, stderr = stopped_once_journaled([*argv, "--restart"], out, 4)
    assert code == 128 + signal.SIGTERM, stderr
    assert "to resume, rerun the same command without --restart (with it, the run starts over)" \
        in stderr, stderr
    sent = len(slow.requests())
    resumed = run_script(OVIS, *argv)
    assert resumed.returncode == 0, resumed.stderr
    done = int(re.search(r"\((\d+) already done", resumed.stderr).group(1))
    assert done >= 4  # what the restarted run saved is kept, not redone
    assert len(slow.requests()) - sent == 12 - done
    ds = load_output(out)
    assert ds["file_name"] == [p.name for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


# ---- OUTPUTs a run may not write into ---------------------------------------------------------

def seed_foreign_repo(hub_root: Path, repo: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = hub_root / repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def foreign_parquet(tmp_path: Path) -> bytes:
    from conftest import page_image, write_parquet_dataset

    return write_parquet_dataset(tmp_path / "theirs", [page_image(0)]).read_bytes()


def test_a_hub_output_equal_to_the_hub_input_is_refused_before_anything(tmp_path, stub_server):
    stub = stub_server()
    run = run_script(OVIS, "user/scans", "User/Scans", "--server", stub.url, "--restart",
                     timeout=60)
    assert run.returncode == 2, run.stderr
    assert "OUTPUT must not be INPUT" in run.stderr and "user/scans-ocr" in run.stderr.lower()
    assert stub.requests() == []


@pytest.mark.parametrize("restart", [[], ["--restart"]])
def test_restart_into_the_hub_input_deletes_nothing(tmp_path, stub_server, monkeypatch, restart):
    """With --restart it deleted the input repo's data/ before reading it."""
    import datasets

    stub = stub_server()
    hub = FakeHub(tmp_path / "hub")
    seed_foreign_repo(tmp_path / "hub", "user/scans", {
        ".gitattributes": b"*.parquet filter=lfs\n", "README.md": b"# my scans\n",
        "data/train-00000-of-00001.parquet": foreign_parquet(tmp_path)})
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(SystemExit) as refused:
        load_script(OVIS).main(["user/scans", "user/scans", "--work-dir", str(tmp_path / "w"),
                                *common(stub, *restart)], hub_api=hub)
    assert refused.value.code == 2
    assert hub.calls == [] and hub.commits == []
    assert (tmp_path / "hub" / "user/scans" / "data" / "train-00000-of-00001.parquet").exists()


@pytest.mark.parametrize("files, refused", [
    ({"README.md": b"---\nlicense: mit\n---\n# Invoices\n", "data/train-00000-of-00001.parquet":
      None}, "data/train-00000-of-00001.parquet"),
    ({"README.md": b"---\nlicense: mit\n---\n# Invoices, to come\n"}, "README.md"),
    ({"images/0001.png": b"\x89PNG"}, "images/0001.png"),
    ({".gitattributes": b"*.parquet filter=lfs\n"}, None),  # a repo made empty: written
])
def test_a_hub_repo_that_holds_a_dataset_of_its_own_is_refused(tmp_path, stub_server, files,
                                                               refused, capsys):
    """It replaced the card, and load_dataset(repo) returned the old rows and none of the OCR."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    data = foreign_parquet(tmp_path)
    seed_foreign_repo(tmp_path / "hub", "user/ocr-out", {
        name: data if content is None else content for name, content in files.items()})
    hub = FakeHub(tmp_path / "hub")
    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(tmp_path / "w"), *common(stub)]
    if refused is None:
        assert load_script(OVIS).main(argv, hub_api=hub) == 0
        assert load_output(tmp_path / "hub" / "user/ocr-out").num_rows == 3
        return
    with pytest.raises(SystemExit) as exited:
        load_script(OVIS).main(argv + ["--restart"], hub_api=hub)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    said = next(line for line in err.splitlines() if line.startswith("error:"))
    assert "holds a dataset of its own (" in said and refused in said, said
    assert "would replace its card" in said and "new repo, e.g. user/ocr-out-ocr" in said
    assert hub.commits == [] and stub.requests() == []


# ---- OUTPUTs an older or newer version of the script wrote ------------------------------------

@pytest.mark.parametrize("change, says", [
    (lambda m: m.pop("format"), "older version of this script (manifest format 0"),
    (lambda m: m.update(format=1000), "newer version of this script (manifest format 1000"),
    (None, "older version of this script (manifest format 0"),  # rows, and no manifest at all
], ids=["without-format", "newer-format", "without-manifest"])
def test_an_output_of_another_manifest_format_is_refused_in_one_line(tmp_path, stub_server,
                                                                     change, says):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 6)
    out = tmp_path / "out"
    args = [str(tmp_path / "in"), str(out), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    path = out / ".ocr" / "manifest.json"
    if change is None:
        path.unlink()
    else:
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))
    card, sent = (out / "README.md").read_text(), len(stub.requests())
    run = run_script(OVIS, *args)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], run.stderr
    assert ("update the script" if "newer" in says else "pass --restart to redo the run, or "
            "write to a new OUTPUT") in errors[0]
    assert len(stub.requests()) == sent and (out / "README.md").read_text() == card
    run = run_script(OVIS, *args, "--restart")  # the way out
    assert run.returncode == 0, run.stderr
    assert len(stub.requests()) == sent + 6
    assert load_output(out)["file_name"] == [p.name for p in paths]
    assert json.loads(path.read_text())["format"] == load_script(OVIS).MANIFEST_FORMAT


def test_a_sharded_output_of_an_older_format_gives_advice_that_works(tmp_path, stub_server):
    """Its refusal said "pass --restart to redo the run", and a shard's --restart was refused
    saying the same again: beside other shards' rows, only a new OUTPUT is a way out."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 6)
    out = tmp_path / "out"
    for i in (0, 1):
        assert run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub, *shard(i))) \
            .returncode == 0
    path = out / ".ocr" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["format"]
    path.write_text(json.dumps(manifest))
    before, sent = part_bytes(out), len(stub.requests())
    for restart in ([], ["--restart"]):
        run = run_script(OVIS, str(tmp_path / "in"), str(out), *common(stub, *shard(1, *restart)))
        assert run.returncode == 2, run.stderr
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "older version of this script" in errors[0], run.stderr
        assert "--restart to redo" not in errors[0] and "write to a new OUTPUT" in errors[0]
    assert part_bytes(out) == before and len(stub.requests()) == sent

def test_a_hub_output_of_an_older_format_is_refused_on_a_fresh_disk(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 4)
    module, hub = load_script(OVIS), FakeHub(tmp_path / "hub")
    argv = [str(tmp_path / "in"), "user/ocr-out", *common(stub)]
    assert module.main([*argv, "--work-dir", str(tmp_path / "a")], hub_api=hub) == 0
    path = tmp_path / "hub" / "user/ocr-out" / ".ocr" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["format"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as refused:
        module.main([*argv, "--work-dir", str(tmp_path / "b")], hub_api=hub)
    assert refused.value.code == 2 and len(stub.requests()) == 4


def test_a_rerun_by_url_resumes_though_uv_names_each_copy_anew(tmp_path, stub_server):
    """`uv run URL` runs a temporary copy named <stem> plus six random characters: the run
    recorded that name, so every rerun by URL was refused as another script's run."""
    import tempfile

    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 4)
    out = tmp_path / "out"
    copies = [Path(tempfile.gettempdir()) / f"ovis-ocr2-server{tag}.py"
              for tag in ("Ab12Cd", "x9YzQw")]
    try:
        for copy in copies:
            copy.write_bytes((ROOT / OVIS).read_bytes())
            run = subprocess.run([sys.executable, str(copy), str(tmp_path / "in"), str(out),
                                  *common(stub)], capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stderr
    finally:
        for copy in copies:
            copy.unlink(missing_ok=True)
    assert len(stub.requests()) == 4  # the second copy resumed: nothing left to send
    assert load_output(out)["file_name"] == [p.name for p in paths]
    manifest = json.loads((out / ".ocr" / "manifest.json").read_text())
    assert manifest["identity"]["script"] == OVIS
    assert f" {OVIS} " in reproduce_block((out / "README.md").read_text())


def test_another_run_writing_the_same_rows_mid_run_stops_this_one_at_once(tmp_path, stub_server,
                                                                          capsys, monkeypatch):
    """A part of this shard's rows committed by another run mid-run stops this one at the next
    answer: the stop was raised in a page's task and lost, and every page was still sent."""
    stub = stub_server("--latency", "0.2")
    write_image_folder(tmp_path / "in", 60)

    class RacedHub(FakeHub):  # another run commits rows 50-60 as this one commits its first part
        def create_commit(self, repo_id, operations, **kwargs):
            raced = self.root / repo_id / "data" / "part-000000050-000000060.parquet"
            if any(op.path_in_repo.startswith("data/") for op in operations) and not raced.exists():
                seed_foreign_repo(self.root, repo_id, {f"data/{raced.name}": foreign_parquet(tmp_path)})
                self.head += 1
            return super().create_commit(repo_id, operations, **kwargs)

    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(tmp_path / "w"),
            "--concurrency", "2", "--no-sanity-check", *common(stub)]
    module = load_script(OVIS)
    due = module.OutputStore.commit_if_due

    def commit_soon(store):  # a commit every 0.5 s, not every 36 s: the race comes mid-run
        store.commit_interval = 0.5
        due(store)
    monkeypatch.setattr(module.OutputStore, "commit_if_due", commit_soon)
    code = module.main(argv, hub_api=RacedHub(tmp_path / "hub"))
    err = capsys.readouterr().err
    assert code == 2 and "another run is writing rows 0-60 of user/ocr-out" in err, err
    assert len(stub.requests()) < 40


def test_another_run_found_by_the_final_commit_is_said(tmp_path, stub_server, capsys):
    """Another run's part in this shard's rows lands just before the final commit, which the Hub
    refuses (412) and whose retry finds it: the run exited 2 without saying why."""
    stub = stub_server()
    write_image_folder(tmp_path / "in", 6)

    class RacedHub(FakeHub):  # another run commits rows 3-6 as this one sends its card
        def create_commit(self, repo_id, operations, **kwargs):
            raced = self.root / repo_id / "data" / "part-000000003-000000006.parquet"
            if any(op.path_in_repo == "README.md" for op in operations) and not raced.exists():
                seed_foreign_repo(self.root, repo_id, {f"data/{raced.name}": foreign_parquet(tmp_path)})
                self.head += 1
            return super().create_commit(repo_id, operations, **kwargs)

    argv = [str(tmp_path / "in"), "user/ocr-out", "--work-dir", str(tmp_path / "w"),
            "--no-sanity-check", *common(stub)]
    code = load_script(OVIS).main(argv, hub_api=RacedHub(tmp_path / "hub"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "another run is writing rows 0-6 of user/ocr-out at the same time" in err, err
    assert "did not reach the Hub" not in err
