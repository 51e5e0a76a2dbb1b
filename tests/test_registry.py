"""models.json, the README and the scripts agree; serving-unlimited-ocr.md's client works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ALL_SCRIPTS, ROOT, load_script, page_image

REGISTRY = json.loads((ROOT / "models.json").read_text())
ENTRIES = {entry["script"]: entry for entry in REGISTRY["scripts"]}


def header(script: str) -> dict:
    """The PEP 723 metadata block, parsed as TOML."""
    text = (ROOT / script).read_text()
    block = re.search(r"^# /// script\n(.*?)^# ///$", text, re.S | re.M).group(1)
    return tomllib.loads("".join(line[2:] if line.startswith("# ") else line[1:]
                                 for line in block.splitlines(keepends=True)))


def test_registry_matches_its_schema():
    import jsonschema
    schema = json.loads((ROOT / "tests" / "models.schema.json").read_text())
    jsonschema.validate(REGISTRY, schema)


def test_every_script_has_an_entry_and_every_entry_a_script():
    assert sorted(ENTRIES) == ALL_SCRIPTS
    assert len(ENTRIES) == len(REGISTRY["scripts"])


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_entry_agrees_with_the_scripts_own_constants(script):
    entry, module = ENTRIES[script], load_script(script)
    assert entry["model"] == module.MODEL_ID
    assert entry["revision"] == module.MODEL_REVISION
    assert entry["shape"] == module.SCRIPT_SHAPE
    assert entry["image"] == module.JOB_IMAGE
    assert entry["image_tag_moving"] == module.IMAGE_TAG_MOVING
    if entry["image"].startswith("vllm/vllm-openai:"):  # vLLM's own images: a pinned release
        assert re.fullmatch(r"v\d+\.\d+\.\d+", entry["image"].split(":", 1)[1])
        assert not module.IMAGE_TAG_MOVING
    else:  # a vendor tag that moves must say so (HPD-Parsing's only tag is latest-nvidia-gpu)
        assert module.IMAGE_TAG_MOVING == ("latest" in entry["image"].split(":")[-1])
    assert entry["max_model_len"] == module.MAX_MODEL_LEN
    assert entry["max_tokens"] == module.DEFAULT_MAX_TOKENS
    assert entry["prefix_caching"] == module.PREFIX_CACHING
    assert entry["output_columns"] == module.result_column_names("markdown") + ["inference_info"]
    assert (entry["run_command"] is None) == module.IMAGE_HAS_UV
    meta = header(script)
    jobs = meta.get("tool", {}).get("hf-jobs")
    if module.IMAGE_HAS_UV:
        assert jobs["image"] == entry["image"] and jobs["flavor"] == entry["flavor"]
        assert jobs["timeout"] == entry["timeout"], "Jobs stop a job after 30 min otherwise"
        assert "HF_TOKEN" in jobs["secrets"]
    else:
        assert jobs is None, "an image without uv cannot serve `hf jobs uv run`: no table"
        assert entry["image"] in entry["run_command"] and "pip install -q uv" in entry["run_command"]
        assert f"--timeout {entry['timeout']}" in entry["run_command"]
        assert f"--flavor {entry['flavor']}" in entry["run_command"]


@pytest.mark.parametrize("script", [s for s in ALL_SCRIPTS if load_script(s).IMAGE_HAS_UV])
def test_hf_jobs_dry_run_resolves_image_and_flavor_from_the_header(script):
    hf = Path(sys.executable).parent / "hf"
    run = subprocess.run([str(hf), "jobs", "uv", "run", "--dry-run", script, "user/in", "user/out"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    entry = ENTRIES[script]
    assert f"image    {entry['image']} (from script)" in run.stdout
    assert f"flavor   {entry['flavor']} (from script)" in run.stdout
    assert f"timeout  {entry['timeout']} (from script)" in run.stdout
    assert "Job not submitted" in run.stdout


def test_readme_table_is_generated_from_the_registry():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "render_readme.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", quick, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    assert commands[0].startswith("uv run ") and "pytest" not in commands[0]
    test_command = commands[1].split("  #")[0].strip()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_the_readme_and_its_reference_page_link_only_to_what_exists():
    """The guide sends readers to REFERENCE.md's sections: every relative link names a file of
    the repository and, after '#', a heading of that file (GitHub's anchor for it)."""
    def anchors(path):
        headings = re.findall(r"^#+ (.*)$", path.read_text(), re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}

    for page in ("README.md", "REFERENCE.md"):
        text = re.sub(r"```.*?```|`[^`]*`", "", (ROOT / page).read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            name, _, anchor = target.partition("#")
            path = ROOT / (name or page)
            assert path.exists(), f"{page} links to {target}"
            assert not anchor or anchor in anchors(path), f"{page} links to {target}"
    assert "REFERENCE.md" in (ROOT / "README.md").read_text()


def test_unlimited_ocr_endpoint_is_started_with_a_timeout_the_page_explains():
    """Jobs stop a Job after 30 minutes unless given a timeout (MODEL-FACTS, rules): the start
    command carries one, and the page says what it bounds."""
    doc = (ROOT / "serving-unlimited-ocr.md").read_text()
    start = re.search(r"## Start it\n\n```bash\n(.*?)```", doc, re.S).group(1)
    timeout = re.search(r"--timeout (\d+[smhd])\b", start)
    assert timeout and start.index("--timeout") < start.index("vllm/vllm-openai"), start
    assert "30 minutes" in doc and "until it is stopped:" not in doc
    assert f"`--timeout {timeout.group(1)}`" in doc


def test_unlimited_ocr_client_example_works_against_the_stub(tmp_path, stub_server):
    doc = (ROOT / "serving-unlimited-ocr.md").read_text()
    example = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "client.py").write_text(example)
    (tmp_path / "page.jpg").write_bytes(page_image(3, fmt="JPEG"))
    stub = stub_server("--model", "Unlimited-OCR", "--api-key", "hf_test_token")
    run = subprocess.run([sys.executable, str(tmp_path / "client.py"), str(tmp_path / "page.jpg")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OCR_ENDPOINT": f"{stub.url}/v1",
                              "HF_TOKEN": "hf_test_token"})
    assert run.returncode == 0, run.stderr
    assert "# Page" in run.stdout
    assert "hf_test_token" not in run.stdout + run.stderr
    (request,) = stub.requests()
    assert request["texts"] == ["<image>document parsing."]
    assert request["skip_special_tokens"] is False
    assert request["vllm_xargs"] == {"ngram_size": 35, "window_size": 128}
    assert request["temperature"] == 0 and request["max_tokens"] == 8192
