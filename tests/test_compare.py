"""ocr-compare.py: hand-computed CER/WER under each normalisation, parity figures, key matching,
a reference dataset joined by key, clear errors, and the distances cross-checked against an
independent Levenshtein (editdistance). The parity of real engine outputs is checked in
tests/test_engine.py (test_ocr_compare_agrees_with_the_parity_test)."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ALL_SCRIPTS, ROOT, TOOL_SCRIPTS, load_script

SCRIPT = "ocr-compare.py"


@pytest.fixture(scope="module")
def compare():
    return load_script(SCRIPT)


def run_compare(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, str(ROOT / SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def figures(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"figures-{len(list(tmp_path.glob('figures-*')))}.json"
    run = run_compare(*args, "--json", out)
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text())


def write_output(folder: Path, columns: dict, part: str = "part-000000000-000000100.parquet") -> Path:
    """A collection-shaped output: data/*.parquet (string columns unless given otherwise)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({name: pa.array(values, type=pa.string()) if all(
        v is None or isinstance(v, str) for v in values) else pa.array(values)
        for name, values in columns.items()}), folder / "data" / part)
    return folder


# ---- normalisation -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("  Hello\n\n  World \t", "Hello World"),
    ("Cafe\u0301", "Caf\u00e9"),                      # NFC composes: 4 code points
    ("# Title **bold**", "# Title **bold**"),        # markup is kept
    ("\ufb01ne \u201cquoted\u201d", "\ufb01ne \u201cquoted\u201d"),  # NFC keeps ligatures, quotes
])
def test_diplomatic(compare, raw, expected):
    assert compare.normalise_diplomatic(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("# Title\n\nSome **bold** and *italic* and _under_ text", "title some bold and italic and under text"),
    ("<p>One<br>two</p><table><tr><td>a</td><td>b</td></tr></table>", "one two a b"),
    ("| a | b |\n|---|:---:|\n| c | d |", "a b c d"),
    ("[the link](http://x.org) ![figure](images/f.jpg) end", "the link end"),
    ("> quoted\n- item one\n* item two\n1. kept number", "quoted item one item two 1. kept number"),
    ("\u201cHi\u201d \u2018there\u2019 \u00abyes\u00bb", "\"hi\" 'there' \"yes\""),
    ("a\u2013b \u2014 c\u2212d", "a-b - c-d"),
    ("exam-\nple and hyphen\u00ac\n  ated, not split - here", "example and hyphenated, not split - here"),
    ("zero\u200bwidth soft\u00adhyphen \ufeffbom", "zerowidth softhyphen bom"),
    ("\ufb01ne STRASSE Stra\u00dfe", "fine strasse strasse"),     # NFKC, then case folding
    ("Tom &amp; Jerry &lt;3 &#x201C;x&#x201D;", "tom & jerry <3 \"x\""),
    ("\\*not emphasis\\* 2 * 3 = 6", "*not emphasis* 2 * 3 = 6"),
    ("```python\ncode here\n```", "code here"),
    ("snake_case_name stays", "snake_case_name stays"),
])
def test_reading(compare, raw, expected):
    assert compare.normalise_reading(raw) == expected


def test_normalisations_are_named_and_versioned(compare):
    assert {n.label for n in compare.NORMALISATIONS.values()} == {"diplomatic-v1", "reading-v1"}


# ---- distances: rapidfuzz against an independent implementation --------------------------------

def test_edit_distance_agrees_with_editdistance(compare):
    import editdistance
    rng = random.Random(19)
    alphabet = "abc de\u00e9\u00df\u4e2d\U0001f600\n"
    pairs = []
    for _ in range(300):
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        b = list(a)
        for _ in range(rng.choice([0, 1, 5, 40, 300])):  # near (banded path) and far (full path)
            k = rng.randrange(len(b) + 1)
            op = rng.choice("sid")
            if op == "i" or not b:
                b.insert(k, rng.choice(alphabet))
            elif op == "d" and k < len(b):
                del b[k]
            elif k < len(b):
                b[k] = rng.choice(alphabet)
        pairs.append((a, "".join(b)))
    pairs += [("", ""), ("", "abc"), ("kitten", "sitting"), ("x" * 2000, "y" * 1500)]
    for a, b in pairs:
        assert compare.edit_distance(a, b) == editdistance.eval(a, b), (a, b)
        words_a, words_b = a.split(), b.split()
        assert compare.edit_distance(words_a, words_b) == editdistance.eval(words_a, words_b)
    assert compare.edit_distance("kitten", "sitting") == 3  # and both are right
    assert compare.edit_distance("\U0001f600\U0001f600", "\U0001f600") == 1  # code points, not bytes


def test_similarity_and_quantiles(compare):
    assert compare.similarity(1, 10, 9) == pytest.approx(0.9)
    assert compare.similarity(0, 0, 0) == 1.0
    assert compare.quantile([4, 1, 3, 2], 0.5) == 2.5
    assert compare.quantile([0.9, 1.0], 0.05) == pytest.approx(0.905)
    assert compare.quantile([], 0.5) is None


def test_looping_detector_answers_as_the_model_scripts_copy(compare):
    scripts = load_script("ovis-ocr2-server.py")
    rng = random.Random(7)
    texts = ["", "a", "aa", "ab" * 50, "x" * 300, "plain text of a page", "  \n\n  "]
    for _ in range(1500):
        unit = "".join(rng.choice("ab c\n") for _ in range(rng.randint(1, 30)))
        head = "".join(rng.choice("abcdef \n") for _ in range(rng.randint(0, 300)))
        texts.append(head + unit * rng.randint(0, 30) + unit[:rng.randint(0, len(unit))])
    assert sum(scripts.looks_degenerate(t) for t in texts) > 100  # both answers occur
    for text in texts:
        assert compare.repeated_tail(text) == scripts.repeated_tail(text), text
        assert compare.looks_degenerate(text) == scripts.looks_degenerate(text), text
    assert compare.is_looping("the end " * 30, "length")
    assert not compare.is_looping("a normal page that ran out of tokens half way", "length")
    assert not compare.is_looping(None, None)


# ---- accuracy: hand-computed figures -----------------------------------------------------------

R0 = "aaaa bbbb cccc dddd eeee"                  # 24 chars, 5 words
R1 = "aaaa bbbb cccc dddd eeee ffff gggg hhhh"   # 39 chars, 8 words
R2 = "some page text that is long"               # 27 chars, 6 words
R6 = "heading the end of it"                     # 21 chars, 5 words


def accuracy_output(folder: Path) -> Path:
    return write_output(folder, {
        "file_name": ["p0", "p1", "p2", "p3", "p4", "p5", "p6"],
        "markdown": [R0, "aaaa bbbx cccc dddd eeee ffff gggx hhhh", "xy" * 100, None,
                     "short", "no reference here", "# Heading\n\nThe **end** of it"],
        "markdown_error": [None, None, None, "boom", None, None, None],
        "markdown_finish_reason": ["stop", "stop", "length", None, "stop", "stop", "stop"],
        "gt": [R0, R1, R2, "an error page with long text", "short", None, R6],
        "volume": ["v1", "v1", "v2", "v2", "v2", "v2", "v2"],
    })


def test_accuracy_reading(tmp_path):
    out = accuracy_output(tmp_path / "out")
    f = figures(tmp_path, out, "--reference-column", "gt")
    # scored: p0 (0 edits), p1 (2 of 39), p2 (looping: 27 of 27, capped), p6 (markup only: 0)
    assert f["normalisation"] == "reading-v1" and "code points" in f["characters"]
    assert f["rows_compared"] == 4
    assert f["rows_excluded"] == 3
    assert f["excluded"] == {"error": 1, "skipped": 0, "short_reference": 1, "no_reference": 1,
                             "unmatched": 0}
    assert f["cer_micro"] == pytest.approx(29 / 111)
    assert f["cer_median"] == pytest.approx((0 + 2 / 39) / 2)
    assert f["cer_mean"] == pytest.approx((0 + 2 / 39 + 1 + 0) / 4)
    assert f["wer_micro"] == pytest.approx(8 / 24)
    assert f["wer_median"] == pytest.approx(0.125)
    assert f["wer_mean"] == pytest.approx((0 + 0.25 + 1 + 0) / 4)
    assert f["cer_micro_without_looping"] == pytest.approx(2 / 84)
    assert f["cer_median_without_looping"] == 0
    assert f["cer_mean_without_looping"] == pytest.approx(2 / 39 / 3)
    assert f["looping_pages"] == 1 and f["looping_rate"] == pytest.approx(0.25)
    assert f["error_rows"] == 1 and f["error_rate"] == pytest.approx(1 / 5)


def test_accuracy_diplomatic(tmp_path):
    out = accuracy_output(tmp_path / "out")
    f = figures(tmp_path, out, "--reference-column", "gt", "--normalise", "diplomatic")
    # p6 now costs 8 edits ("# ", H/h, T/t, two "**") and 4 word edits
    assert f["normalisation"] == "diplomatic-v1"
    assert f["cer_micro"] == pytest.approx(37 / 111)
    assert f["cer_median"] == pytest.approx((2 / 39 + 8 / 21) / 2)
    assert f["cer_mean"] == pytest.approx((0 + 2 / 39 + 1 + 8 / 21) / 4)
    assert f["wer_micro"] == pytest.approx(12 / 24)
    assert f["wer_median"] == pytest.approx((0.25 + 0.8) / 2)


def test_min_reference_chars_and_the_by_breakdown(tmp_path):
    out = accuracy_output(tmp_path / "out")
    f = figures(tmp_path, out, "--reference-column", "gt", "--min-reference-chars", "25",
                "--by", "volume")
    assert f["rows_compared"] == 2  # p1 (39) and p2 (27) only
    assert f["excluded"]["short_reference"] == 3
    assert f["cer_micro"] == pytest.approx((2 + 27) / (39 + 27))
    groups = f["by"]["groups"]
    assert groups["v1"]["rows_compared"] == 1 and groups["v1"]["cer_micro"] == pytest.approx(2 / 39)
    assert groups["v2"]["looping_pages"] == 1 and groups["v2"]["cer_micro"] == 1.0
    assert groups["v2"]["error_rows"] == 1


def test_reference_dataset_joined_by_key(tmp_path):
    out = accuracy_output(tmp_path / "out")
    # the ground truth elsewhere, in another order, with rows the run did not do
    gt = write_output(tmp_path / "gt", {"file_name": ["p6", "extra", "p2", "p1", "p0", "p3"],
                                        "text": [R6, "not in the run at all", R2, R1, R0,
                                                 "an error page with long text"]})
    f = figures(tmp_path, out, "--reference", gt)
    assert f["matched_by"] == "file_name" and f["reference_column"] == "text"
    assert f["rows_compared"] == 4 and f["excluded"]["unmatched"] == 2  # p4, p5 have no truth
    assert f["cer_micro"] == pytest.approx(29 / 111)
    assert f["wer_micro"] == pytest.approx(8 / 24)
    # two systems against one truth: B is A with p1 corrected
    b = write_output(tmp_path / "b", {"file_name": ["p0", "p1", "p2", "p6"],
                                      "markdown": [R0, R1, R2, R6]})
    f2 = figures(tmp_path, out, b, "--reference", gt)
    assert f2["cer_micro"] == pytest.approx(29 / 111)
    assert f2["b"]["cer_micro"] == 0 and f2["b"]["rows_compared"] == 4


def test_accuracy_table_names_its_figures(tmp_path):
    out = accuracy_output(tmp_path / "out")
    run = run_compare(out, "--reference-column", "gt")
    assert run.returncode == 0, run.stderr
    for words in ("pooled (micro)", "per-page median", "per-page mean", "reading-v1",
                  "code points", "without looping", "error rows 1"):
        assert words in run.stdout, words


# ---- parity ------------------------------------------------------------------------------------

def parity_pair(tmp_path: Path) -> tuple[Path, Path]:
    a = write_output(tmp_path / "a", {
        "file_name": ["f1", "f2", "f3", "f4", "f5"],
        "markdown": ["hello world", "abcdefghij", "Same Text", None, "only in a"],
        "markdown_error": [None, None, None, "boom", None]})
    b = write_output(tmp_path / "b", {
        "file_name": ["f3", "f6", "f2", "f1", "f4"],
        "markdown": ["same text", "only in b", "abcdefghiX", "hello world", "x"]})
    return a, b


def test_parity_reading(tmp_path):
    a, b = parity_pair(tmp_path)
    f = figures(tmp_path, a, b)
    assert f["matched_by"] == "file_name"
    assert f["rows_matched"] == 4 and f["rows_compared"] == 3
    assert f["identical"] == 1 and f["identical_share"] == pytest.approx(1 / 3)
    assert f["identical_normalised"] == 2  # "Same Text" / "same text" after case folding
    assert f["similarity_min"] == pytest.approx(0.9)
    assert f["similarity_median"] == pytest.approx(0.95)
    assert f["similarity_p5"] == pytest.approx(0.905)
    assert f["excluded"] == {"a_failed": 1, "b_failed": 0, "both_failed": 0, "skipped": 0, "only_in_a": 1,
                             "only_in_b": 1}
    assert f["rows_excluded"] == 3


def test_parity_diplomatic_and_the_table(tmp_path):
    a, b = parity_pair(tmp_path)
    f = figures(tmp_path, a, b, "--normalise", "diplomatic")
    assert f["identical"] == 1 and f["identical_normalised"] == 1
    assert f["similarity_min"] == pytest.approx(1 - 2 / 9)
    assert f["similarity_median"] == pytest.approx((1 - 2 / 9 + 0.9) / 2)
    run = run_compare(a, b)
    assert run.returncode == 0, run.stderr
    assert "byte-identical (raw text)               1 / 3" in run.stdout
    assert "worst pairs" in run.stdout and "f2: similarity 0.9000" in run.stdout
    assert "f4: A has no text" in run.stdout


def test_parity_flags_looping_rows(tmp_path):
    loop = "the same line\n" * 40
    a = write_output(tmp_path / "a", {"markdown": [loop, "fine page text"],
                                      "markdown_finish_reason": ["length", "stop"]})
    b = write_output(tmp_path / "b", {"markdown": ["a real page", "fine page text"],
                                      "markdown_finish_reason": ["stop", "stop"]})
    f = figures(tmp_path, a, b)
    assert f["matched_by"] == "row order"
    assert f["looping_a"] == 1 and f["looping_b"] == 0


def test_keys_file_name_and_page_number(tmp_path):
    a = write_output(tmp_path / "a", {"file_name": ["doc.pdf", "doc.pdf"], "page_number": [1, 2],
                                      "markdown": ["page one", "page two"]})
    b = write_output(tmp_path / "b", {"file_name": ["doc.pdf", "doc.pdf"], "page_number": [2, 1],
                                      "markdown": ["page two", "page one"]})
    f = figures(tmp_path, a, b)
    assert f["matched_by"] == "file_name and page_number" and f["identical"] == 2
    g = figures(tmp_path, a, b, "--key", "page_number")
    assert g["matched_by"] == "key page_number" and g["identical"] == 2


def test_row_order_needs_equal_lengths_and_a_key_must_be_unique(tmp_path):
    a = write_output(tmp_path / "a", {"markdown": ["x", "y", "z"]})
    b = write_output(tmp_path / "b", {"markdown": ["x", "y"]})
    run = run_compare(a, b)
    assert run.returncode == 2 and "3 rows" in run.stderr and "--key" in run.stderr
    assert "Traceback" not in run.stderr
    c = write_output(tmp_path / "c", {"file_name": ["p", "p"], "markdown": ["x", "y"]})
    run = run_compare(c, c)
    assert run.returncode == 2 and "not unique" in run.stderr


def test_manifest_row_identity_hook(tmp_path):
    """Only the hook's own contract: the run manifest (issue 15) does not exist yet, so the
    field it will use is assumed here as `row_identity`. With it, two runs of different lengths
    and no file_name are matched by the column it names; without it, refused."""
    a = write_output(tmp_path / "a", {"row_id": ["0", "1", "2"], "markdown": ["x", "y", "z"]})
    b = write_output(tmp_path / "b", {"row_id": ["2", "0"], "markdown": ["z", "x"]})
    assert run_compare(a, b).returncode == 2
    for side in (a, b):
        (side / ".ocr").mkdir()
        (side / ".ocr" / "manifest.json").write_text(json.dumps({"row_identity": "row_id"}))
    f = figures(tmp_path, a, b)
    assert "manifest" in f["matched_by"] and f["identical"] == 2 and f["excluded"]["only_in_a"] == 1


# ---- pairing the pages of real runs (issue 41, item 4) ------------------------------------------
# Outputs of ovis-ocr2-server.py against the stub, whose answer is a function of the page's bytes:
# the same page gives the same text in every run, whatever its position.

def run_ovis(stub, source: Path, out: Path, *extra: str) -> Path:
    from conftest import run_script

    run = run_script("ovis-ocr2-server.py", str(source), str(out), "--server", stub.url,
                     "--part-rows", "3", *extra)
    assert run.returncode == 0, run.stderr
    return out


def eight_row_input(folder: Path, seeds: list[int]) -> tuple[Path, list[bytes]]:
    """The issue's input: a parquet of JPEG pages and a row_id, no file_name."""
    from conftest import write_parquet_dataset
    from pages import page_image

    cells = [page_image(seed, fmt="JPEG") for seed in seeds]
    return write_parquet_dataset(folder, cells), cells


def output_table(out: Path) -> dict:
    """Every part of an output, in row order, as columns of Python values."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted((out / "data").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(part) for part in parts]).to_pydict()


def test_two_shuffles_of_one_input_pair_every_page_with_itself(tmp_path, stub_server):
    """The issue's scenario: one 8-row parquet without file_name, `--shuffle --seed 1` against
    `--seed 2`: 8 of 8 byte-identical (was 0 of 8, paired by row order); against one reference
    the two score the same CER (was 0.0000 and 0.2651). A reference without the page's identity
    is paired by --key, never by position against a shuffled run."""
    from conftest import expected_text
    import pyarrow as pa
    import pyarrow.parquet as pq

    stub = stub_server()
    source, cells = eight_row_input(tmp_path / "in", list(range(8)))
    a = run_ovis(stub, source, tmp_path / "a", "--shuffle", "--seed", "1")
    b = run_ovis(stub, source, tmp_path / "b", "--shuffle", "--seed", "2")
    assert output_table(a)["row_id"] != output_table(b)["row_id"]  # two orders indeed
    f = figures(tmp_path, a, b)
    assert (f["identical"], f["rows_compared"]) == (8, 8), f
    assert "input_digest" in f["matched_by"]
    card_row = next(line for line in (a / "README.md").read_text().splitlines()
                    if line.startswith("| `input_digest` |"))  # the card's column table says it
    assert card_row.endswith("|") and "byte-identical" in card_row
    truth = [expected_text(c).replace("mean", "mien") for c in cells]  # in input order
    pq.write_table(pa.table({"row_id": list(range(8)), "text": truth}), tmp_path / "ref.parquet")
    refused = run_compare(a, b, "--reference", tmp_path / "ref.parquet")
    assert refused.returncode == 2 and "--key COLUMN" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "shuffled" in refused.stderr
    g = figures(tmp_path, a, b, "--reference", tmp_path / "ref.parquet", "--key", "row_id")
    assert g["cer_micro"] > 0 and g["cer_micro"] == g["b"]["cer_micro"], g
    # a reference that carries the runs' page identity needs no key
    first = output_table(a)
    pq.write_table(pa.table({"input_digest": first["input_digest"], "text": [
        truth[i] for i in first["row_id"]]}), tmp_path / "ref-by-page.parquet")
    h = figures(tmp_path, b, "--reference", tmp_path / "ref-by-page.parquet")
    assert h["cer_micro"] == g["cer_micro"] and h["rows_compared"] == 8, h


def test_byte_identical_pages_are_interchangeable_and_subsets_pair_what_they_share(
        tmp_path, stub_server):
    """Duplicates (four pages twice each) match as multisets, never "appears twice"; a
    --max-samples subset of another shuffle pairs its 5 pages, the other 3 counted as only in B."""
    stub = stub_server()
    source, _ = eight_row_input(tmp_path / "in", [0, 1, 2, 3, 0, 1, 2, 3])
    a = run_ovis(stub, source, tmp_path / "a", "--shuffle", "--seed", "1")
    b = run_ovis(stub, source, tmp_path / "b", "--shuffle", "--seed", "2")
    assert output_table(a)["row_id"] != output_table(b)["row_id"]
    f = figures(tmp_path, a, b)
    assert (f["identical"], f["rows_compared"], f["rows_excluded"]) == (8, 8, 0), f
    unique, _ = eight_row_input(tmp_path / "in8", list(range(8)))
    c = run_ovis(stub, unique, tmp_path / "c", "--shuffle", "--seed", "1", "--max-samples", "5")
    d = run_ovis(stub, unique, tmp_path / "d", "--shuffle", "--seed", "2")
    g = figures(tmp_path, c, d)
    assert (g["identical"], g["rows_compared"]) == (5, 5), g
    assert g["excluded"]["only_in_a"] == 0 and g["excluded"]["only_in_b"] == 3, g


def test_a_stacked_run_keeps_its_inputs_page_identity(tmp_path, stub_server):
    """A run whose INPUT is another run's OUTPUT keeps the input's input_digest column (its
    manifest names it), so it pairs with a third run of the original input in another order;
    a stacked run over an output without the column adds its own, the same values."""
    import json as json_

    stub = stub_server()
    source, _ = eight_row_input(tmp_path / "in", list(range(8)))
    a = run_ovis(stub, source, tmp_path / "a", "--shuffle", "--seed", "1")
    stacked = run_ovis(stub, a, tmp_path / "stacked", "--output-column", "again",
                       "--shuffle", "--seed", "3")
    first, second = output_table(a), output_table(stacked)
    by_row = dict(zip(first["row_id"], first["input_digest"]))
    assert [by_row[r] for r in second["row_id"]] == second["input_digest"]
    assert json_.loads((stacked / ".ocr" / "manifest.json").read_text())["row_identity"] == \
        "input_digest"
    b = run_ovis(stub, source, tmp_path / "b", "--shuffle", "--seed", "2")
    f = figures(tmp_path, stacked, b, "--column", "again", "--column-b", "markdown")
    assert (f["identical"], f["rows_compared"]) == (8, 8), f
    # over an output written before the column: the stacked run adds it
    make_old(a)
    again = run_ovis(stub, a, tmp_path / "again", "--output-column", "again")
    third = output_table(again)
    assert [by_row[r] for r in third["row_id"]] == third["input_digest"]


def test_pdf_pages_are_identified_by_their_document_and_number(tmp_path, stub_server):
    """A PDF page's identity is its document's digest (the journal's) and `#page=N`: two copies
    of one PDF under other names give equal values, page by page; --per-document rows carry the
    document's alone; a shuffled run pairs page with page."""
    from pdfs import raw_image_pdf

    stub = stub_server()
    script = load_script("ovis-ocr2-server.py")
    twin = raw_image_pdf([(200, 40, 40), (40, 200, 40)])
    (tmp_path / "in").mkdir()
    for name, data in (("a.pdf", twin), ("b.pdf", twin), ("c.pdf", raw_image_pdf([(9, 9, 90)]))):
        (tmp_path / "in" / name).write_bytes(data)
    a = run_ovis(stub, tmp_path / "in", tmp_path / "a")
    rows = output_table(a)
    digest = script.input_digest(twin)
    assert rows["input_digest"][:4] == [f"{digest}#page={n}" for n in (1, 2, 1, 2)], rows
    assert rows["input_digest"][4] == f"{script.input_digest((tmp_path / 'in' / 'c.pdf').read_bytes())}#page=1"
    b = run_ovis(stub, tmp_path / "in", tmp_path / "b", "--shuffle", "--seed", "2")
    f = figures(tmp_path, a, b)
    assert (f["identical"], f["rows_compared"]) == (5, 5) and "input_digest" in f["matched_by"]
    whole = output_table(run_ovis(stub, tmp_path / "in", tmp_path / "whole", "--per-document"))
    assert whole["input_digest"][:2] == [digest, digest]


def test_outputs_on_the_hub_are_paired_by_their_manifests_row_identity(tmp_path, stub_server):
    """Two shuffled runs pushed to the (fake) Hub: ocr-compare.py reads each repo's
    .ocr/manifest.json and pairs the rows by the column it names."""
    from fake_hub_server import FakeHubServer

    stub = stub_server()
    source, _ = eight_row_input(tmp_path / "in", list(range(8)))
    hub = FakeHubServer(tmp_path / "hub").start()
    try:
        for name, seed in (("a", "1"), ("b", "2")):
            out = run_ovis(stub, source, tmp_path / name, "--shuffle", "--seed", seed)
            hub.push_files("dataset", f"user/run-{name}", {
                str(path.relative_to(out)): path.read_bytes() for path in out.rglob("*")
                if path.is_file() and (path.parent.name == "data" or path.name in (
                    "README.md", "manifest.json"))})
        home = tmp_path / "home"
        env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url, "HOME": str(home),
               "HF_HOME": str(home / "hf"), "HF_HUB_CACHE": str(home / "hf" / "hub"),
               "HF_DATASETS_CACHE": str(home / "hf" / "datasets")}
        out = tmp_path / "hub.json"
        run = run_compare("user/run-a", "user/run-b", "--json", out, env=env)
        assert run.returncode == 0, run.stderr
        f = json.loads(out.read_text())
        assert (f["identical"], f["rows_compared"]) == (8, 8) and "input_digest" in f["matched_by"]
    finally:
        hub.stop()


def make_old(out: Path) -> None:
    """An output as written before the page identity: no input_digest column, manifest format 1
    without row_identity (its --shuffle recorded as before)."""
    import pyarrow.parquet as pq

    for part in (out / "data").glob("*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["input_digest"]), part)
    path = out / ".ocr" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.pop("row_identity")
    path.write_text(json.dumps({**manifest, "format": 1}))


def test_an_output_without_the_page_identity_is_paired_by_position_only_when_allowed(
        tmp_path, stub_server):
    """Outputs written before the column: by row order when neither run was shuffled and the
    counts agree; a shuffled one is refused in one line naming --key COLUMN, and --key works."""
    stub = stub_server()
    source, _ = eight_row_input(tmp_path / "in", list(range(8)))
    plain = [run_ovis(stub, source, tmp_path / name) for name in ("p1", "p2")]
    shuffled = run_ovis(stub, source, tmp_path / "s", "--shuffle", "--seed", "1")
    for out in [*plain, shuffled]:
        make_old(out)
    f = figures(tmp_path, *plain)
    assert f["matched_by"] == "row order" and f["identical"] == 8, f
    for pair in ((plain[0], shuffled), (shuffled, plain[0])):
        run = run_compare(*pair)
        assert run.returncode == 2 and "--key COLUMN" in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and "shuffled" in run.stderr
    g = figures(tmp_path, plain[0], shuffled, "--key", "row_id")
    assert g["identical"] == 8, g


def test_an_older_unfinished_output_is_refused_with_the_way_out(tmp_path, stub_server):
    """Its parts lack the input_digest column: continuing would mix two schemas in one
    dataset's parts (datasets refuses to load those), so a rerun is refused, naming --restart
    or a new OUTPUT; --restart redoes it with the column."""
    from conftest import run_script

    stub = stub_server()
    source, _ = eight_row_input(tmp_path / "in", list(range(8)))
    out = run_ovis(stub, source, tmp_path / "out", "--max-samples", "4")
    make_old(out)
    run = run_script("ovis-ocr2-server.py", str(source), str(out), "--server", stub.url)
    assert run.returncode == 2 and "--restart" in run.stderr and "older" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    run_ovis(stub, source, out, "--restart")
    table = output_table(out)
    assert len(table["row_id"]) == 8 and None not in table["input_digest"]


@pytest.mark.parametrize("args, message", [
    (["{a}", "{b}", "--column", "text"], "column 'text' not in A"),
    (["{a}", "{b}", "--key", "volume"], "key column(s) volume not in A"),
    (["{a}", "--reference-column", "gt"], "reference column 'gt' not in A"),
    (["{a}", "{b}", "--by", "volume"], "--by column 'volume' is in none of"),
    (["{a}", "./no/such/folder"], "does not exist"),
    (["{a}", "nobody/no-such-dataset-ocr-compare"], "cannot load B 'nobody/no-such-dataset-ocr-compare'"),
    (["{a}", "bare-word"], "neither an existing path nor a Hub dataset id"),
    (["{a}"], "give B to compare two runs"),
    (["{a}", "{b}", "--json", "/proc/x.json"], "--json /proc/x.json cannot be written"),
    (["{a}", "{b}", "--rows", "{a}"], "is a folder: name a file"),
    (["{a}", "{b}", "--plot", "/etc/hostname/x.png"], "/etc/hostname is not a folder"),
])
def test_clear_errors_instead_of_tracebacks(tmp_path, args, message):
    a, b = parity_pair(tmp_path)
    run = run_compare(*[x.format(a=a, b=b) for x in args])
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_output_files_go_into_folders_they_make(tmp_path):
    """--plot nodir/x.png gave a traceback after the whole comparison ran: the folder is made,
    as the model scripts make --stats-json's."""
    a, b = parity_pair(tmp_path)
    run = run_compare(a, b, "--plot", tmp_path / "new" / "x.png", "--json", tmp_path / "j" / "f.json",
                      "--rows", tmp_path / "r" / "rows.csv")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "new" / "x.png").stat().st_size > 5000
    assert json.loads((tmp_path / "j" / "f.json").read_text())["rows_matched"] == 4
    assert (tmp_path / "r" / "rows.csv").read_text().startswith("key,")


@pytest.mark.parametrize("args, message", [
    ([], "column 'markdown' of B"),
    (["--reference-column", "markdown", "--reference"], "column 'markdown' of reference"),
])
def test_a_text_column_that_is_not_text_is_named_with_its_type(tmp_path, args, message):
    """An int `markdown` column gave AttributeError: 'int' object has no attribute 'strip'."""
    a, _ = parity_pair(tmp_path)
    numbers = write_output(tmp_path / "n", {"file_name": ["f1", "f2"], "markdown": [1, 2]})
    run = run_compare(a, *args, numbers)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr and "is not text: it holds int values" in run.stderr
    assert "Traceback" not in run.stderr


def test_help_teaches_and_abbreviations_are_refused():
    shown = run_compare("--help")
    assert shown.returncode == 0
    for words in ("uv run ocr-compare.py ./run-offline ./run-server", "--reference-column",
                  "diplomatic", "reading", "code points", "--plot", "--by"):
        assert words in shown.stdout, words
    assert run_compare("a", "b", "--norm", "reading").returncode == 2  # allow_abbrev=False


@pytest.mark.parametrize("option, value", [("--workers", "-3"), ("--workers", "0"),
                                           ("--show", "-1"), ("--min-reference-chars", "-5")])
def test_a_count_below_its_floor_is_refused_in_one_line(option, value):
    """--workers -3 and --show -1 were taken silently (--min-reference-chars -5 was refused)."""
    run = run_compare("a", "b", option, value)
    assert run.returncode == 2 and f"{option} must be >= " in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


# ---- inputs and outputs ------------------------------------------------------------------------

def test_local_output_is_read_as_it_is_now(tmp_path):
    """datasets caches a local folder by its name; the script must see a rerun's new files."""
    a, b = parity_pair(tmp_path)
    assert figures(tmp_path, a, b)["identical"] == 1
    write_output(a, {"file_name": ["f1", "f2", "f3"],
                     "markdown": ["hello world", "abcdefghiX", "same text"]})
    assert figures(tmp_path, a, b)["identical"] == 3


def test_saved_dataset_and_parquet_file_inputs(tmp_path):
    import datasets
    datasets.Dataset.from_dict({"file_name": ["f1", "f2"], "markdown": ["hello world", "abc"]}) \
        .save_to_disk(str(tmp_path / "saved"))
    a, _ = parity_pair(tmp_path)
    f = figures(tmp_path, tmp_path / "saved", next((a / "data").glob("*.parquet")))
    assert f["rows_matched"] == 2 and f["identical"] == 1


def test_plot_and_rows_files(tmp_path):
    out = accuracy_output(tmp_path / "out")
    png, rows = tmp_path / "cer.png", tmp_path / "rows.csv"
    run = run_compare(out, "--reference-column", "gt", "--plot", png, "--rows", rows)
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    import csv
    table = list(csv.DictReader(rows.open()))
    assert [r["status"] for r in table] == ["ok", "ok", "looping", "error", "short reference",
                                            "no reference", "ok"]
    assert float(table[1]["cer"]) == pytest.approx(2 / 39)
    a, b = parity_pair(tmp_path)
    run = run_compare(a, b, "--plot", tmp_path / "sim.png")
    assert run.returncode == 0 and (tmp_path / "sim.png").stat().st_size > 5000


def test_worker_processes_give_the_same_figures(tmp_path):
    rng = random.Random(3)
    texts = ["".join(rng.choice("abcde fgh\n") for _ in range(rng.randint(30, 200)))
             for _ in range(2400)]
    other = [t if k % 3 else t[::-1] for k, t in enumerate(texts)]
    a = write_output(tmp_path / "a", {"markdown": texts, "gt": other})
    b = write_output(tmp_path / "b", {"markdown": other})
    one = figures(tmp_path, a, b, "--workers", "1")
    two = figures(tmp_path, a, b, "--workers", "2")
    def figures_only(result: dict) -> dict:
        return {k: v for k, v in result.items() if not k.startswith(("seconds", "worker"))}

    assert figures_only(one) == figures_only(two)
    assert (one["worker_processes"], two["worker_processes"]) == (1, 2)
    acc1 = figures(tmp_path, a, "--reference-column", "gt", "--workers", "1")
    acc2 = figures(tmp_path, a, "--reference-column", "gt", "--workers", "2")
    assert figures_only(acc1) == figures_only(acc2) and acc2["worker_processes"] == 2
    assert one["identical"] == 1600


# ---- a tool, not a model script ----------------------------------------------------------------

def test_compare_is_a_tool_not_a_model_script():
    registry = json.loads((ROOT / "models.json").read_text())
    assert SCRIPT in TOOL_SCRIPTS and SCRIPT not in ALL_SCRIPTS
    assert SCRIPT not in {entry["script"] for entry in registry["scripts"]}
    text = (ROOT / SCRIPT).read_text()
    assert "# ==== BEGIN" not in text, "a tool carries none of the model scripts' helper blocks"
    assert text.startswith("# /// script\n") and "rapidfuzz" in text.split("# ///", 2)[1]
    import re
    assert not re.search(r"^\s*(import|from) (Levenshtein|difflib)\b", text, re.M)  # GPL; autojunk
    assert SCRIPT in (ROOT / "README.md").read_text()


def test_hub_loader_selects_columns_through_the_builder(compare, tmp_path, monkeypatch):
    """The Hub path (no network here): load_dataset_builder and load_dataset(columns=...) on a
    folder the datasets library resolves the way it resolves a Hub repo of parquet files."""
    import types
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    out = accuracy_output(tmp_path / "repo")
    args = types.SimpleNamespace(hf_token=None, config=None, revision=None, split="train")
    side = compare._load_hub("A", str(out), ["markdown", "markdown_finish_reason", "gt", "nope"], args)
    assert side.num_rows == 7 and sorted(side.columns) == ["gt", "markdown", "markdown_finish_reason"]
    assert "volume" in side.available and side.column("gt")[0] == R0
    with pytest.raises(compare.UsageError, match="column 'text' not in A"):
        compare._load_hub("A", str(out), ["text"], args)


def test_a_blank_page_is_not_sent_and_not_an_empty_answer(tmp_path):
    """Issue #44: a page the rule judged blank is written with an empty text and its reason in
    `<column>_skipped`; parity and accuracy leave it out and count it apart, never as a page
    that came back empty (which would read as a CER of 1, or as a difference)."""
    blank = "blank page: no ink found (--send-blank sends such pages)"
    a = write_output(tmp_path / "a", {
        "file_name": ["f1", "f2", "f3"], "markdown": ["hello world", "", "third page"],
        "markdown_skipped": [None, blank, None], "gt": ["hello world", "12", "third page"]})
    b = write_output(tmp_path / "b", {
        "file_name": ["f1", "f2", "f3"], "markdown": ["hello world", "Invented text", "third page"],
        "markdown_skipped": [None, None, None]})
    f = figures(tmp_path, a, b)
    assert f["rows_compared"] == 2 and f["identical"] == 2 and f["excluded"]["skipped"] == 1
    assert f["skipped_a"] == 1 and f["skipped_b"] == 0
    f = figures(tmp_path, a, "--reference-column", "gt", "--min-reference-chars", "0")
    assert f["rows_compared"] == 2 and f["excluded"]["skipped"] == 1 and f["cer_micro"] == 0
