"""Local inputs, end to end against the stub server: what a folder is read as (images with their
metadata, a Hub snapshot with splits and configs, a save_to_disk folder), and every input a user
can get wrong answered up front (OUTPUT inside INPUT, odd file names, empty files, symlinked
folders, image columns the scripts cannot send), never a traceback, never rows silently lost.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import expected_text, load_output, page_image, run_script, write_image_folder


OVIS = "ovis-ocr2-server.py"


def common(stub, *extra):
    return ["--server", stub.url, "--part-rows", "5", "--request-timeout", "20", *extra]


def no_traceback(run):
    assert "Traceback" not in run.stderr, run.stderr


def write_table(path: Path, columns: dict, features: dict | None = None) -> Path:
    """A parquet file written by `datasets` (so an Image column carries its feature type)."""
    import datasets

    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features) if features else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(path))
    return path


def image_table(path: Path, seeds: list[int], **extra) -> list[bytes]:
    import datasets

    cells = [page_image(s, fmt="JPEG") for s in seeds]
    features = {"image": datasets.Image(), "seed": datasets.Value("int64")}
    columns = {"image": [{"bytes": c, "path": None} for c in cells], "seed": seeds}
    write_table(path, columns, features)
    return cells


# ---- OUTPUT inside INPUT -----------------------------------------------------------------------

@pytest.mark.parametrize("where", ["inside", "equal", "inside_through_a_symlink"])
def test_an_output_inside_the_input_folder_is_refused_before_anything_is_written(
        tmp_path, stub_server, where):
    stub = stub_server()
    source = tmp_path / "scans"
    write_image_folder(source, 4)
    if where == "inside":
        output = source / "ocr"
    elif where == "equal":
        output = source
    else:
        (tmp_path / "link").symlink_to(source)
        output = tmp_path / "link" / "ocr"
    before = sorted(p.name for p in source.rglob("*"))
    run = run_script(OVIS, str(source), str(output), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "inside INPUT" in run.stderr and str(tmp_path / "scans-ocr") in run.stderr
    no_traceback(run)
    assert sorted(p.name for p in source.rglob("*")) == before  # nothing written
    assert stub.requests() == []


@pytest.mark.parametrize("kind", ["folder", "parquet"])
def test_an_input_inside_the_output_folder_is_refused_before_anything_is_written(
        tmp_path, stub_server, kind):
    """load_dataset(OUTPUT) reads every data file under OUTPUT: INPUT's images or parquet
    there would come back as rows of the output (found by trying it: 14 rows for 7)."""
    stub = stub_server()
    output = tmp_path / "out"
    if kind == "folder":
        source = output / "scans"
        write_image_folder(source, 3)
    else:
        source = output / "pages.parquet"
        image_table(source, [1, 2, 3])
    before = sorted(p.name for p in output.rglob("*"))
    run = run_script(OVIS, str(source), str(output), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "INPUT must not be inside OUTPUT" in run.stderr and str(tmp_path / "out-ocr") in run.stderr
    no_traceback(run)
    assert sorted(p.name for p in output.rglob("*")) == before  # nothing written
    assert stub.requests() == []


# ---- a folder of images: its own reader, with the metadata datasets would join ----------------

def test_an_image_file_that_cannot_be_read_is_an_error_row_and_the_output_still_iterates(
        tmp_path, stub_server):
    """A dangling symlink among the scans (found by trying to break it: the error row kept the
    path, and iterating the output raised FileNotFoundError)."""
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 2)
    (tmp_path / "in" / "page_0009.png").symlink_to(tmp_path / "gone.png")
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    rows = list(ds)  # every image decodes, or is none
    assert [row["file_name"] for row in rows] == [p.name for p in paths] + ["page_0009.png"]
    assert rows[2]["image"] is None and rows[2]["markdown"] is None
    assert "page_0009.png" in rows[2]["markdown_error"]
    assert "in/in/" not in rows[2]["markdown_error"]  # the path as it is, not joined twice
    assert [row["markdown"] for row in rows[:2]] == [expected_text(p.read_bytes()) for p in paths]

def test_every_image_file_datasets_reads_is_a_row_whatever_its_extension(tmp_path, stub_server):
    """.jfif (a browser's JPEG), .jpe, .ppm and .pgm (what SANE's scanimage writes) beside a
    .png: `datasets` reads every one as an image, and so must the folder's rows (found by trying
    to break it: only the .png was read, the rest silently left out, exit 0)."""
    import json

    from PIL import Image

    from pages import with_ink

    colours = {"a.png": (200, 30, 30), "b.jfif": (30, 200, 30), "c.jpe": (30, 30, 200),
               "d.ppm": (200, 200, 30), "e.pgm": (90, 90, 90)}
    (tmp_path / "in").mkdir()
    for name, colour in colours.items():
        formats = {".jfif": "JPEG", ".jpe": "JPEG", ".pgm": "PPM"}
        image = with_ink(Image.new("L" if name.endswith(".pgm") else "RGB", (300, 400),
                                   colour[0] if name.endswith(".pgm") else colour))
        image.save(tmp_path / "in" / name, format=formats.get(Path(name).suffix, None))
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({",".join(map(str, c)): n for n, c in colours.items()}))
    stub = stub_server("--answer-map", str(answers))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == list(colours)
    assert ds["markdown"] == list(colours)  # each row its own page's text


def test_a_metadata_parquet_beside_the_images_is_joined_not_read_instead(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 5)
    write_table(tmp_path / "in" / "metadata.parquet",
                {"file_name": [p.name for p in paths[:4]], "page_no": [10, 11, 12, 13]})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths]  # every image, the unlisted one too
    assert ds["page_no"] == [10, 11, 12, 13, None]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_a_metadata_jsonl_in_a_subfolder_joins_by_its_own_relative_names(tmp_path, stub_server):
    stub = stub_server()
    top = write_image_folder(tmp_path / "in", 1)
    sub = write_image_folder(tmp_path / "in" / "box1", 2)
    (tmp_path / "in" / "box1" / "metadata.jsonl").write_text(
        "".join(f'{{"file_name": "{p.name}", "shelf": "B{i}"}}\n' for i, p in enumerate(sub)))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [f"box1/{p.name}" for p in sub] + [top[0].name]
    assert ds["shelf"] == ["B0", "B1", None]


def test_a_metadata_file_naming_an_image_twice_gives_it_one_row(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 3)
    (tmp_path / "in" / "metadata.csv").write_text(
        f"file_name,shelf\n{paths[0].name},A\n{paths[1].name},B\n{paths[0].name},C\n"
        f"{paths[2].name},D\n")
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [p.name for p in paths] and ds["shelf"] == ["A", "B", "D"]
    assert len(stub.requests()) == 3


def test_a_data_parquet_beside_the_images_is_refused_naming_both_ways_out(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 3)
    image_table(tmp_path / "in" / "old" / "scores.parquet", [1, 2])
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "3 image" in run.stderr and "scores.parquet" in run.stderr
    assert "move" in run.stderr and "as INPUT" in run.stderr
    no_traceback(run)
    assert stub.requests() == []


# ---- a Hub snapshot on disk: read as datasets reads it -----------------------------------------

def snapshot(folder: Path) -> dict:
    train = image_table(folder / "data" / "train-00000-of-00001.parquet", [0, 1, 2])
    test = image_table(folder / "data" / "test-00000-of-00001.parquet", [7, 8])
    return {"train": train, "test": test}


def test_a_hub_snapshot_honours_split(tmp_path, stub_server):
    stub = stub_server()
    cells = snapshot(tmp_path / "snap")
    run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "out"),
                     *common(stub, "--split", "test"))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["seed"] == [7, 8]
    assert ds["markdown"] == [expected_text(c) for c in cells["test"]]


def test_a_missing_split_lists_the_splits(tmp_path, stub_server):
    stub = stub_server()
    snapshot(tmp_path / "snap")
    run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "out"),
                     *common(stub, "--split", "validation"))
    assert run.returncode == 2, run.stderr
    assert "validation" in run.stderr and "train, test" in run.stderr
    no_traceback(run)


def test_a_split_or_config_a_single_split_input_cannot_honour_is_refused(tmp_path, stub_server):
    """A save_to_disk of one Dataset (or one parquet file) OCR'd its rows whatever --split or
    --config said, exit 0 without a word."""
    import datasets

    stub = stub_server()
    image_table(tmp_path / "one.parquet", [0, 1])
    table = datasets.load_dataset("parquet", data_files=str(tmp_path / "one.parquet"), split="train")
    table.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "dict"))
    for source, extra, said in [
            ("saved", ["--split", "test"], "--split test (its one split is train)"),
            ("saved", ["--config", "x"], "--config x (it has no configs)"),
            ("one.parquet", ["--config", "x"], "--config x (it has no configs)"),
            ("dict", ["--config", "x"], "--config x (it has no configs)")]:
        run = run_script(OVIS, str(tmp_path / source), str(tmp_path / "out"), *common(stub, *extra))
        assert run.returncode == 2, run.stderr
        assert "cannot honour " + said in run.stderr
        no_traceback(run)
        assert not (tmp_path / "out").exists()
    assert stub.requests() == []
    run = run_script(OVIS, str(tmp_path / "saved"), str(tmp_path / "out"),
                     *common(stub, "--split", "train"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["seed"] == [0, 1]
    # what worked before must still work (found by looking for false refusals): a file is
    # whatever split the user names it (a Hub download's test-00000-of-00001.parquet), and
    # `default` is the config name datasets gives data without configs
    (tmp_path / "one.parquet").rename(tmp_path / "test-00000-of-00001.parquet")
    for n, (source, extra) in enumerate([("test-00000-of-00001.parquet", ["--split", "test"]),
                                         ("test-00000-of-00001.parquet", ["--config", "default"]),
                                         ("saved", ["--config", "default"]),
                                         ("dict", ["--config", "default"])]):
        run = run_script(OVIS, str(tmp_path / source), str(tmp_path / f"ok{n}"), *common(stub, *extra))
        assert run.returncode == 0, run.stderr
        assert load_output(tmp_path / f"ok{n}")["seed"] == [0, 1]


def test_every_local_input_answers_split_and_config_by_one_rule(tmp_path, stub_server):
    """A folder of images has one split, train, and no configs: a --split or --config it cannot
    honour is refused as a file's is (it was ignored, with a note). The default split takes a
    lone split of another name (a saved DatasetDict of `test` only was refused without --split)."""
    import datasets

    stub = stub_server()
    write_image_folder(tmp_path / "scans", 2)
    for extra, said in [(["--split", "test"], "--split test (its one split is train)"),
                        (["--config", "x"], "--config x (it has no configs)")]:
        run = run_script(OVIS, str(tmp_path / "scans"), str(tmp_path / "out"), *common(stub, *extra))
        assert run.returncode == 2, run.stderr
        assert "cannot honour " + said in run.stderr
        no_traceback(run)
        assert not (tmp_path / "out").exists()
    assert stub.requests() == []
    image_table(tmp_path / "one.parquet", [3, 4])
    table = datasets.load_dataset("parquet", data_files=str(tmp_path / "one.parquet"), split="train")
    datasets.DatasetDict({"test": table}).save_to_disk(str(tmp_path / "dict"))
    run = run_script(OVIS, str(tmp_path / "dict"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "out")["seed"] == [3, 4]


CONFIGS_CARD = """---
configs:
- config_name: letters
  data_files:
  - split: train
    path: letters/*.parquet
- config_name: maps
  data_files:
  - split: train
    path: maps/*.parquet
---
# two configs
"""


def test_configs_are_honoured_and_a_missing_one_lists_them(tmp_path, stub_server):
    stub = stub_server()
    image_table(tmp_path / "snap" / "letters" / "a.parquet", [0, 1])
    maps = image_table(tmp_path / "snap" / "maps" / "a.parquet", [5, 6, 7])
    (tmp_path / "snap" / "README.md").write_text(CONFIGS_CARD)
    for extra in ([], ["--config", "charters"]):
        run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "out"), *common(stub, *extra))
        assert run.returncode == 2, run.stderr
        assert "letters, maps" in run.stderr and "--config" in run.stderr
        no_traceback(run)
    run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "out"),
                     *common(stub, "--config", "maps"))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["seed"] == [5, 6, 7] and ds["markdown"] == [expected_text(c) for c in maps]


def test_a_changed_input_folder_is_read_fresh_not_from_the_datasets_cache(tmp_path, stub_server):
    """datasets caches a README config by its name alone: a folder changed between two runs
    would come back stale (the scripts pass the resolved files, whose dates are hashed)."""
    stub = stub_server()
    image_table(tmp_path / "snap" / "maps" / "a.parquet", [5, 6])
    image_table(tmp_path / "snap" / "letters" / "a.parquet", [0])
    (tmp_path / "snap" / "README.md").write_text(CONFIGS_CARD)
    run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "one"),
                     *common(stub, "--config", "maps"))
    assert run.returncode == 0, run.stderr
    image_table(tmp_path / "snap" / "maps" / "a.parquet", [5, 6, 9])
    run = run_script(OVIS, str(tmp_path / "snap"), str(tmp_path / "two"),
                     *common(stub, "--config", "maps"))
    assert run.returncode == 0, run.stderr
    assert load_output(tmp_path / "two")["seed"] == [5, 6, 9]


# ---- names, empty files, symlinks -------------------------------------------------------------

def test_a_file_name_that_is_not_utf8_is_refused_with_the_way_out(tmp_path, stub_server):
    stub = stub_server()
    write_image_folder(tmp_path / "in", 2)
    latin1 = os.path.join(os.fsencode(tmp_path / "in"), b"caf\xe9.png")
    with open(latin1, "wb") as f:
        f.write(page_image(42))
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "caf\\xe9.png" in run.stderr and "not UTF-8" in run.stderr and "convmv" in run.stderr
    no_traceback(run)
    assert stub.requests() == [] and not (tmp_path / "out").exists()


def test_a_folder_with_no_data_is_refused_in_one_line(tmp_path, stub_server):
    """A folder of neither images, PDFs, tables nor a saved dataset: `datasets` says so."""
    stub = stub_server()
    (tmp_path / "in").mkdir()
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "doesn't contain any data files" in run.stderr and str(tmp_path / "in") in run.stderr
    assert "--config" not in run.stderr  # no config to pick: the way out is to fill the folder
    no_traceback(run)
    assert stub.requests() == [] and not (tmp_path / "out").exists()


def test_an_empty_image_file_is_an_error_row(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 2)
    (tmp_path / "in" / "blank.png").write_bytes(b"")
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == ["blank.png"] + [p.name for p in paths]
    assert "empty image bytes" in ds["markdown_error"][0]
    assert ds["markdown_error"][1:] == [None, None]


@pytest.mark.parametrize("layout", ["zero_bytes", "zero_bytes_in_folder"])
def test_an_empty_parquet_file_exits_2_with_a_message(tmp_path, stub_server, layout):
    stub = stub_server()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "input.parquet").write_bytes(b"")
    target = tmp_path / "in" / "input.parquet" if layout == "zero_bytes" else tmp_path / "in"
    run = run_script(OVIS, str(target), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "0 bytes" in run.stderr and "input.parquet" in run.stderr
    no_traceback(run)


@pytest.mark.parametrize("layout", ["file", "folder"])
def test_a_parquet_with_no_rows_is_nothing_to_do(tmp_path, stub_server, layout):
    import datasets

    stub = stub_server()
    path = write_table(tmp_path / "in" / "input.parquet", {"image": []},
                       {"image": datasets.Image()})
    target = path if layout == "file" else tmp_path / "in"
    run = run_script(OVIS, str(target), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    assert "no rows" in run.stderr
    no_traceback(run)
    assert stub.requests() == []


def test_symlinked_subfolders_are_followed_and_a_loop_is_not(tmp_path, stub_server):
    stub = stub_server()
    own = write_image_folder(tmp_path / "in", 2)
    elsewhere = write_image_folder(tmp_path / "elsewhere", 2)
    (tmp_path / "in" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "in" / "loop").symlink_to(tmp_path / "in", target_is_directory=True)
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["file_name"] == [f"linked/{p.name}" for p in elsewhere] + [p.name for p in own]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in elsewhere + own]


def test_a_symlink_to_a_parent_folder_does_not_read_output_as_input(tmp_path, stub_server):
    """`INPUT/up -> ..` reaches OUTPUT beside INPUT: the first run went well, and every rerun
    was refused, OUTPUT's own parts taken for table files of INPUT ("ambiguous")."""
    stub = stub_server()
    own = write_image_folder(tmp_path / "work" / "in", 3)
    (tmp_path / "work" / "in" / "up").symlink_to(tmp_path / "work", target_is_directory=True)
    args = [str(tmp_path / "work" / "in"), str(tmp_path / "work" / "out"), *common(stub)]
    assert run_script(OVIS, *args).returncode == 0
    run = run_script(OVIS, *args)
    assert run.returncode == 0, run.stderr
    assert "3 already done" in run.stderr
    assert len(stub.requests()) == 3
    ds = load_output(tmp_path / "work" / "out")
    assert ds["file_name"] == [p.name for p in own]


# ---- image columns the scripts cannot send: one message up front ------------------------------

def test_a_column_of_lists_of_images_is_refused_up_front(tmp_path, stub_server):
    import datasets

    stub = stub_server()
    pages = [[{"bytes": page_image(i), "path": None}, {"bytes": page_image(i + 9), "path": None}]
             for i in range(3)]
    write_table(tmp_path / "in" / "books.parquet", {"image": pages},
                {"image": datasets.Sequence(datasets.Image())})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "'image'" in run.stderr and "list" in run.stderr.lower()
    assert "one image per row" in run.stderr
    no_traceback(run)
    assert stub.requests() == []


def test_relative_path_strings_that_do_not_resolve_are_refused_up_front(tmp_path, stub_server):
    stub = stub_server()
    write_table(tmp_path / "in" / "list.parquet", {"image": ["scans/a.png", "scans/b.png"]})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "'image'" in run.stderr and "scans/a.png" in run.stderr and "absolute" in run.stderr
    no_traceback(run)
    assert stub.requests() == []


def test_path_strings_relative_to_the_input_folder_or_absolute_are_read(tmp_path, stub_server):
    stub = stub_server()
    paths = write_image_folder(tmp_path / "in" / "scans", 3)
    cells = ["scans/" + paths[0].name, str(paths[1]), "scans/" + paths[2].name]
    write_table(tmp_path / "in" / "list.parquet", {"image": cells})
    run = run_script(OVIS, str(tmp_path / "in" / "list.parquet"), str(tmp_path / "out"),
                     *common(stub))
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out")
    assert ds["image"] == cells
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


@pytest.mark.parametrize("bytes_type, from_input_folder", [("binary", False), ("null", False),
                                                            ("binary", True)])
def test_an_image_column_of_paths_relative_to_the_input_is_embedded_in_the_output(
        tmp_path, stub_server, bytes_type, from_input_folder):
    """An Image column whose cells hold only a path beside the parquet file: the output holds
    the image itself, so it loads anywhere, whatever folder the script ran from. Written as
    `datasets` writes an Image column it was not asked to embed (a struct of bytes and path, the
    feature in the schema's metadata), or as pyarrow infers it (`bytes` typed null when no cell
    has any: once exit 5 on every rerun); run from INPUT's folder, where `datasets` would store
    the path alone since it names a file there (found by trying to break it)."""
    import json

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    stub = stub_server()
    paths = write_image_folder(tmp_path / "in", 2)
    cells = pa.array([{"bytes": None, "path": p.name} for p in paths],
                     pa.struct([("bytes", getattr(pa, bytes_type)()), ("path", pa.string())]))
    features = {"info": {"features": {"image": {"_type": "Image"}}}}
    pq.write_table(pa.table({"image": cells}).replace_schema_metadata(
        {"huggingface": json.dumps(features)}), tmp_path / "in" / "list.parquet")
    run = run_script(OVIS, str(tmp_path / "in" / "list.parquet"), str(tmp_path / "out"),
                     *common(stub), cwd=tmp_path / "in" if from_input_folder else None)
    assert run.returncode == 0, run.stderr
    ds = load_output(tmp_path / "out").cast_column("image", datasets.Image(decode=False))
    assert [cell["bytes"] for cell in ds["image"]] == [p.read_bytes() for p in paths]
    assert ds["markdown"] == [expected_text(p.read_bytes()) for p in paths]


def test_a_column_of_another_type_is_refused_up_front(tmp_path, stub_server):
    stub = stub_server()
    write_table(tmp_path / "in" / "t.parquet", {"page": [1, 2], "image": [0.5, 0.7]})
    run = run_script(OVIS, str(tmp_path / "in"), str(tmp_path / "out"), *common(stub))
    assert run.returncode == 2, run.stderr
    assert "'image'" in run.stderr and "float64" in run.stderr and "--image-column" in run.stderr
    no_traceback(run)
    assert stub.requests() == []


# ---- a Hub dataset's path cells (issue 41, item 6) ----------------------------------------------
# A Hub INPUT is read through the fake Hub (tests/fake_hub_server.py) as `datasets` reads the
# real one: its files downloaded into the runner's Hub cache, which HOME here holds.

@pytest.fixture
def fake_hub(tmp_path):
    from fake_hub_server import FakeHubServer

    server = FakeHubServer(tmp_path / "hub").start()
    yield server
    server.stop()


def hub_env(tmp_path: Path, hub) -> dict:
    cache = tmp_path / "home" / "hf"
    return {"HOME": str(tmp_path / "home"), "HF_HOME": str(cache), "HF_ENDPOINT": hub.url,
            "HF_HUB_CACHE": str(cache / "hub"), "HF_DATASETS_CACHE": str(cache / "datasets"),
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "0"}


def read_parts(out: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted((out / "data").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(part) for part in parts]).to_pydict()


def test_a_hub_repo_of_plain_image_files_still_reads(tmp_path, stub_server, fake_hub):
    """`datasets` downloads such a repo's files into the Hub cache and its cells name them there
    (no bytes): those files are read, sent and embedded in OUTPUT."""
    from pages import page_image

    stub = stub_server()
    pages = [page_image(seed) for seed in (1, 2)]
    fake_hub.push_files("dataset", "user/plain", {"train/a.png": pages[0], "train/b.png": pages[1]})
    run = run_script(OVIS, "user/plain", str(tmp_path / "out"), *common(stub),
                     env=hub_env(tmp_path, fake_hub))
    assert run.returncode == 0, run.stderr
    rows = read_parts(tmp_path / "out")
    assert rows["markdown"] == [expected_text(p) for p in pages]
    assert [cell["bytes"] for cell in rows["image"]] == pages


@pytest.mark.parametrize("kind", ["string", "image"])
def test_a_hub_datasets_path_cells_never_make_the_script_read_this_machines_files(
        tmp_path, stub_server, fake_hub, kind):
    """An image column of a Hub dataset naming a file of the runner's disk (absolute, `../..`,
    lexically inside the dataset's cache but leading out, a link in its cache leading out,
    another dataset's cached file), in a string cell or an Image cell without bytes: each is an
    error row saying why; the file is never sent, nor written into OUTPUT. Before: read, sent
    and published, exit 0. A cell with bytes beside them is read as ever."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pages import page_image

    stub = stub_server()
    env = hub_env(tmp_path, fake_hub)
    secret = tmp_path / "private" / "secret.png"
    secret.parent.mkdir()
    secret.write_bytes(page_image(7))
    fake_hub.push_files("dataset", "user/plain", {"train/a.png": page_image(1)})
    assert run_script(OVIS, "user/plain", str(tmp_path / "plain-out"), *common(stub),
                      env=env).returncode == 0
    cache = Path(env["HF_HUB_CACHE"])
    other = next(cache.glob("datasets--user--plain/snapshots/*/train/a.png"))
    mine = cache / "datasets--user--hostile"
    mine.mkdir(parents=True)
    (mine / "link.png").symlink_to(secret)
    hostile = [str(secret), "../../private/secret.png", f"{mine}/../../../../private/secret.png",
               str(mine / "link.png"), str(other)]
    good = page_image(3)
    if kind == "string":
        table = pa.table({"image": hostile})
    else:
        cells = [{"bytes": None, "path": p} for p in hostile] + [{"bytes": good, "path": "g.png"}]
        table = pa.table({"image": pa.array(cells, pa.struct([("bytes", pa.binary()),
                                                              ("path", pa.string())]))})
        meta = {"info": {"features": {"image": {"_type": "Image"}}}}  # as datasets writes it
        table = table.replace_schema_metadata({"huggingface": json.dumps(meta)})
    pq.write_table(table, tmp_path / "hostile.parquet")
    fake_hub.push_files("dataset", "user/hostile", {
        "data/train-00000-of-00001.parquet": (tmp_path / "hostile.parquet").read_bytes()})
    workdir = tmp_path / "work" / "sub"
    workdir.mkdir(parents=True)
    sent_before = len(stub.requests())
    run = run_script(OVIS, "user/hostile", str(tmp_path / "out"), *common(stub), env=env,
                     cwd=workdir)
    assert run.returncode == 0, run.stderr
    no_traceback(run)
    rows = read_parts(tmp_path / "out")
    n = len(hostile)
    assert rows["markdown"][:n] == [None] * n
    assert rows["image"][:n] == (hostile if kind == "string" else [None] * n)  # cells, not files
    assert all("not read" in error and "Hub" in error for error in rows["markdown_error"][:n]), \
        rows["markdown_error"]
    assert rows["markdown_error_kind"][:n] == ["page"] * n
    assert rows["markdown"][n:] == [expected_text(good)] * (kind == "image")
    assert len(stub.requests()) - sent_before == (kind == "image")
    stored = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert secret.read_bytes()[:64] not in stored
