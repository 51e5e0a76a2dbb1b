"""Benchmarks of the collection, side by side in one run (these machines are noisy: compare the
ratios, not the absolute figures). Not tests: nothing here asserts a speed.

    uv run --no-project --with-requirements tests/requirements.txt python benchmarks/run.py
    ... python benchmarks/run.py driver-cost memory     # some sections only

Sections (all by default):
  driver-cost    CPU per page of the driver against a zero-latency stub, on a realistic mix of
                 pages, next to a plain reference driver (benchmarks/reference_driver.py)
  memory         driver peak RSS at 8 and at 256 pages in flight (2048 px PNG pages, slow stub)
  ceiling        each server script against the real CPU engine, next to pre-encoded requests
                 sent from memory at the same concurrency (the best any client can do)
  shapes         lighton-ocr3.py (offline) vs lighton-ocr3-saturate.py with a fixed window of
                 32 and with the adaptive window, on the real engine with long-tailed page
                 lengths (benchmarks/page_length.py)
  scale-out      two shards as two processes, each with its own engine, into one OUTPUT,
                 against one single run
  startup        seconds from `uv run SCRIPT` to the first request, cold and warm uv cache
  stub-1000      a 1,000-page run of ovis-ocr2-server.py against a stub at 0.5 s per page

The real-engine sections use the CPU vLLM environment and tiny checkpoints the tests build.
Results go to bench-results/latest.json and a table is printed last.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_env  # noqa: E402
from conftest import free_port, load_script, wait_port, write_parquet_dataset  # noqa: E402
from engine import RunningServer, tiny_model  # noqa: E402
from pages import page_image  # noqa: E402

RESULTS: dict[str, dict] = {}
ROWS: list[tuple[str, str, str]] = []  # (section, measure, figure) for the final table


def note(section: str, measure: str, figure: str) -> None:
    ROWS.append((section, measure, figure))
    print(f"  {section:12s} {measure:58s} {figure}", flush=True)


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the child and its waited-for children, result)."""
    cpu0, wall0 = child_cpu(), time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    return time.monotonic() - wall0, child_cpu() - cpu0, run


def start_stub(*args: str, model: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "requests.jsonl"
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "stub_server.py"), "--port",
                                str(port), "--model", model, "--request-log", str(log), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return process, f"http://127.0.0.1:{port}", log


def page_mix(folder: Path, count: int) -> Path:
    """Half JPEG pages within the bound (1700x2200), a quarter grayscale PNG pages, a quarter
    A4 300 DPI JPEG pages (2480x3508, just above OvisOCR2's 8.29 MP bound)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        kind = i % 4
        if kind in (0, 1):
            data, ext = page_image(i, size=(1700, 2200), fmt="JPEG", grain=12), "jpg"
        elif kind == 2:
            data, ext = page_image(i, size=(1700, 2200), mode="L", fmt="PNG", grain=12), "png"
        else:
            data, ext = page_image(i, size=(2480, 3508), fmt="JPEG", grain=12), "jpg"
        (folder / f"page_{i:04d}.{ext}").write_bytes(data)
    return folder


# ---- driver cost ---------------------------------------------------------------------------

def bench_driver_cost(work: Path) -> None:
    script = "ovis-ocr2-server.py"
    module = load_script(script)
    n = 64
    mix = page_mix(work / "mix", n)
    one = work / "one"
    one.mkdir()
    first = sorted(mix.iterdir())[0]
    shutil.copy(first, one / first.name)
    stub, url, _ = start_stub("--no-decode", model=module.MODEL_ID)
    try:
        results = {"ours": [], "reference": []}
        for attempt in range(3):  # interleaved, medians: the machine is noisy
            out = work / f"out-{attempt}"
            wall, cpu, run = timed_run([sys.executable, str(ROOT / script), str(mix), str(out),
                                        "--server", url, "--no-sanity-check", "--concurrency", "32"])
            assert run.returncode == 0, run.stderr[-2000:]
            _, cpu1, run1 = timed_run([sys.executable, str(ROOT / script), str(one), str(out) + "-1",
                                       "--server", url, "--no-sanity-check"])
            assert run1.returncode == 0, run1.stderr[-2000:]
            results["ours"].append((wall, cpu, cpu1))
            wall, cpu, run = timed_run([sys.executable, str(ROOT / "benchmarks" / "reference_driver.py"),
                                        str(mix), url, module.MODEL_ID, str(out) + "-ref.parquet"])
            assert run.returncode == 0, run.stdout + run.stderr[-2000:]
            _, cpu1, _ = timed_run([sys.executable, str(ROOT / "benchmarks" / "reference_driver.py"),
                                    str(one), url, module.MODEL_ID, str(out) + "-ref1.parquet"])
            results["reference"].append((wall, cpu, cpu1))
    finally:
        stub.kill()
    per_page = {k: statistics.median((cpu - cpu1) / (n - 1) for _, cpu, cpu1 in v) for k, v in results.items()}
    rate = {k: statistics.median(n / wall for wall, _, _ in v) for k, v in results.items()}
    passthrough = sum(module.prepare_page(p.read_bytes()).passthrough for p in sorted(mix.iterdir()))
    ratio = per_page["reference"] / per_page["ours"]
    kinds = per_page_cpu_by_kind(module, mix)
    RESULTS["driver_cost"] = {"pages": n, "cpu_s_per_page": per_page, "pages_per_s": rate,
                              "reference_over_ours": ratio, "sent_bit_exact": passthrough,
                              "per_kind_ms": kinds}
    for kind, (ours, ref) in kinds.items():
        note("driver-cost", f"per-page CPU ms, {kind}: ours | reference", f"{ours:.0f} | {ref:.0f}")
    mix_ours = (2 * kinds["JPEG within bound"][0] + kinds["grayscale PNG"][0] + kinds["A4 JPEG above bound"][0]) / 4
    mix_ref = (2 * kinds["JPEG within bound"][1] + kinds["grayscale PNG"][1] + kinds["A4 JPEG above bound"][1]) / 4
    RESULTS["driver_cost"]["mix_ms"] = [mix_ours, mix_ref]
    note("driver-cost", "per-page CPU ms, the 2:1:1 mix: ours | reference",
         f"{mix_ours:.0f} | {mix_ref:.0f} = {mix_ref / mix_ours:.2f}x less (target >= 1.5)")
    note("driver-cost", "whole process CPU s/page, mix, median of 3: ours | reference",
         f"{per_page['ours']:.3f} | {per_page['reference']:.3f} = {ratio:.2f}x less")
    note("driver-cost", "pages/s incl. start-up: ours | reference", f"{rate['ours']:.1f} | {rate['reference']:.1f}")
    note("driver-cost", "pages sent bit-exact (no re-encode)", f"{passthrough}/{n}")


def per_page_cpu_by_kind(module, mix: Path, reps: int = 5) -> dict:
    """In-process CPU of turning one page into a request body: ours (prepare_page +
    request_body) against the reference (decode, RGB, LANCZOS, JPEG 95, base64, json), per kind
    of page, interleaved, median of `reps`."""
    import types

    import reference_driver

    args = types.SimpleNamespace(max_tokens=64, keep_image_tags=False)
    files = sorted(mix.iterdir())
    groups = {"JPEG within bound": files[0::4], "grayscale PNG": files[2::4],
              "A4 JPEG above bound": files[3::4]}
    out = {}
    for kind, paths in groups.items():
        samples = {"ours": [], "ref": []}
        for _ in range(reps):
            for name in ("ours", "ref"):
                started = time.process_time()
                for path in paths[:6]:
                    raw = path.read_bytes()
                    if name == "ours":
                        module.request_body(module.prepare_page(raw), module.MODEL_ID, args)
                    else:
                        json.dumps({"model": module.MODEL_ID, "messages": [{"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                                + reference_driver.encode_page(path)}}]}]})
                samples[name].append((time.process_time() - started) / len(paths[:6]) * 1000)
        out[kind] = (statistics.median(samples["ours"]), statistics.median(samples["ref"]))
    return out


# ---- memory per page in flight ---------------------------------------------------------------

def bench_memory(work: Path) -> None:
    script = "lighton-ocr3-saturate.py"
    module = load_script(script)
    folder = work / "pages2048"
    folder.mkdir()
    base = folder / "base.png"
    base.write_bytes(page_image(5, size=(1448, 2048), fmt="PNG", grain=12))
    size = base.stat().st_size
    for i in range(300):
        os.link(base, folder / f"page_{i:04d}.png")
    base.unlink()
    stub, url, _ = start_stub("--no-decode", "--latency", "25", model=module.MODEL_ID)
    rss = {}
    try:
        for window in (8, 256):
            stats = work / f"mem-{window}.json"
            limit = window + 8 if window == 8 else 300
            run = subprocess.run([sys.executable, str(ROOT / script), str(folder), str(work / f"mem-out-{window}"),
                                  "--server", url, "--concurrency", str(window), "--max-samples", str(limit),
                                  "--no-sanity-check", "--stats-json", str(stats)], capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-2000:]
            result = json.loads(stats.read_text())
            rss[window] = (result["peak_rss_bytes"], result["peak_in_flight"])
    finally:
        stub.kill()
    (rss8, n8), (rss256, n256) = rss[8], rss[256]
    per_page = (rss256 - rss8) / (n256 - n8)
    RESULTS["memory"] = {"page_bytes": size, "rss_8": rss8, "rss_256": rss256, "in_flight": [n8, n256],
                         "bytes_per_page_in_flight": per_page}
    note("memory", f"2048 px PNG page: {size / 2**20:.2f} MiB encoded", "")
    note("memory", f"peak RSS at {n8} | {n256} in flight", f"{rss8 / 2**20:.0f} | {rss256 / 2**20:.0f} MiB")
    note("memory", "(RSS256 - RSS8) / 248 per page in flight (target <= 10 MiB)", f"{per_page / 2**20:.2f} MiB")


# ---- the real engine ---------------------------------------------------------------------------

def engine_env_vars(extra: dict | None = None) -> dict:
    env = engine_env.engine_environ(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
    return env


def distinct_pages(folder: Path, count: int, size=(448, 576)) -> Path:
    cells = [page_image(1000 + i, size=size, fmt="JPEG") for i in range(count)]
    return write_parquet_dataset(folder, cells)


async def send_preencoded(url: str, bodies: list[bytes], concurrency: int) -> float:
    import httpx

    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        async def one(body):
            async with gate:
                response = await client.post(f"{url}/v1/chat/completions", content=body,
                                             headers={"Content-Type": "application/json"})
                assert response.status_code == 200, response.text
        started = time.monotonic()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.monotonic() - started


def bench_ceiling(work: Path) -> None:
    import types

    import datasets

    engine_env.build()
    model = tiny_model("qwen3_5")
    n, max_tokens = 96, 64
    source = distinct_pages(work / "ceiling-in", n)
    ovis = load_script("ovis-ocr2-server.py")
    serve = [*ovis.SERVE_ARGS, "--served-model-name", str(model), "HPD-Parsing"]
    server = RunningServer(model, free_port(), serve, work / "ceiling-serve.log")
    try:
        server.wait()
        cells = datasets.load_dataset("parquet", data_files=str(source), split="train").cast_column(
            "image", datasets.Image(decode=False))["image"]
        for script in ("ovis-ocr2-server.py", "lighton-ocr3-saturate.py", "deepseek-ocr-server.py",
                       "hpd-parsing-saturate.py"):
            module = load_script(script)
            name = "HPD-Parsing" if script.startswith("hpd") else str(model)
            args = types.SimpleNamespace(max_tokens=max_tokens, mode="plain", temperature=0.0,
                                         prompt=None, prompt_mode="document", no_fork=False,
                                         repetition_penalty=None, keep_image_tags=False, keep_raw=False)
            bodies = [module.request_body(module.prepare_page(c), name, args) for c in cells]
            arms = {"preencoded": [], "driver": []}
            for attempt in range(2):
                elapsed = asyncio.run(send_preencoded(server.url, bodies, 32))
                arms["preencoded"].append(n / elapsed)
                stats = work / f"ceiling-{script}-{attempt}.json"
                extra = ["--model", str(model)] if not script.startswith("hpd") else []
                extra += ["--concurrency", "32"]
                if "lighton" in script:
                    extra += ["--temperature", "0"]
                run = subprocess.run([sys.executable, str(ROOT / script), str(source),
                                      str(work / f"ceiling-out-{script}-{attempt}"), "--server", server.url,
                                      "--max-tokens", str(max_tokens), "--no-sanity-check",
                                      "--stats-json", str(stats), *extra], capture_output=True, text=True)
                assert run.returncode == 0, run.stderr[-2000:]
                result = json.loads(stats.read_text())
                arms["driver"].append(n / result["active_s"])  # first page in to last answer out
            best = {k: statistics.median(v) for k, v in arms.items()}
            ratio = best["driver"] / best["preencoded"]
            RESULTS.setdefault("ceiling", {})[script] = {**best, "ratio": ratio}
            note("ceiling", f"{script}: driver | pre-encoded pages/s",
                 f"{best['driver']:.2f} | {best['preencoded']:.2f} = {ratio:.0%}")
    finally:
        server.stop()


def bench_shapes(work: Path) -> None:
    engine_env.build()
    model = tiny_model("qwen3_5")
    n = 96
    source = distinct_pages(work / "shapes-in", n)
    env = engine_env_vars()
    processor = "page_length:PageLengthProcessor"
    common = [str(source), "--model", str(model), "--max-tokens", "768", "--no-sanity-check"]
    runs = {}
    # offline: vllm.LLM in batches of 16
    stats = work / "shape-offline.json"
    run = subprocess.run([str(engine_env.python()), str(ROOT / "lighton-ocr3.py"), *common[:1],
                          str(work / "shape-offline"), *common[1:], "--stats-json", str(stats),
                          "--llm-kwargs", json.dumps({"logits_processors": [processor]})],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    runs["offline (batches of 16)"] = json.loads(stats.read_text())
    # one server for both saturate arms, the page-length processor loaded
    lighton = load_script("lighton-ocr3-saturate.py")
    server = RunningServer(model, free_port(), [*lighton.SERVE_ARGS, "--logits-processors", processor],
                           work / "shapes-serve.log", env=env)
    try:
        server.wait()
        for label, extra in (("saturate, fixed window 32", ["--concurrency", "32"]),
                             ("saturate, adaptive window", ["--adapt-interval", "1"])):
            stats = work / f"shape-{len(runs)}.json"
            run = subprocess.run([sys.executable, str(ROOT / "lighton-ocr3-saturate.py"), *common[:1],
                                  str(work / f"shape-out-{len(runs)}"), *common[1:], "--server", server.url,
                                  "--stats-json", str(stats), *extra], capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-3000:]
            runs[label] = json.loads(stats.read_text())
    finally:
        server.stop()
    base_rate = n / runs["offline (batches of 16)"]["active_s"]  # engine start-up left out
    RESULTS["shapes"] = {}
    for label, result in runs.items():
        rate = n / result["active_s"]
        RESULTS["shapes"][label] = {"pages_per_s": rate, "steady": result["pages_per_s_steady"],
                                    "peak_in_flight": result["peak_in_flight"],
                                    "peak_rss_bytes": result["peak_rss_bytes"],
                                    "bound_by": result.get("bound_by")}
        extra = f", bound by {result['bound_by']}" if result.get("bound_by") else ""
        note("shapes", f"{label}: pages/s (x offline), peak in flight",
             f"{rate:.2f} ({rate / base_rate:.2f}x), {result['peak_in_flight']}{extra}")


def bench_scale_out(work: Path) -> None:
    engine_env.build()
    model = tiny_model("qwen3_5")
    source = distinct_pages(work / "scale-in", 12)
    common = ["--model", str(model), "--max-tokens", "32", "--no-sanity-check"]
    env = engine_env.engine_environ()
    single = subprocess.run([sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(source),
                             str(work / "scale-single"), "--server", f"http://127.0.0.1:{free_port()}",
                             *common], capture_output=True, text=True, env=env)
    assert single.returncode == 0, single.stderr[-2000:]
    started = time.monotonic()
    shards = [subprocess.Popen([sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(source),
                                str(work / "scale-sharded"), "--server", f"http://127.0.0.1:{free_port()}",
                                "--num-shards", "2", "--shard-index", str(i), *common],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
              for i in range(2)]
    codes = [p.wait() for p in shards]
    elapsed = time.monotonic() - started
    assert codes == [0, 0], [p.stderr.read()[-2000:] for p in shards]
    import datasets
    one = datasets.load_dataset("parquet", data_files=str(work / "scale-single" / "data" / "*.parquet"), split="train")
    two = datasets.load_dataset("parquet", data_files=str(work / "scale-sharded" / "data" / "*.parquet"), split="train")
    single = dict(zip(one["row_id"], one["markdown"]))
    sharded = dict(zip(two["row_id"], two["markdown"]))
    duplicates = len(two["row_id"]) - len(sharded)
    same_rows = set(single) == set(sharded)
    same_text = sum(single[k] == sharded.get(k) for k in single)
    RESULTS["scale_out"] = {"rows_single": one.num_rows, "rows_sharded": two.num_rows,
                            "same_rows": same_rows, "same_text": same_text, "duplicates": duplicates,
                            "elapsed_s": elapsed}
    note("scale-out", "2 shards x own engine -> one OUTPUT: rows, duplicates, lost",
         f"{two.num_rows}/{one.num_rows}, {duplicates}, {len(set(single) - set(sharded))}")
    note("scale-out", "same row set as the single run; texts byte-identical",
         f"{'yes' if same_rows else 'NO'}; {same_text}/{len(single)}")


def bench_startup(work: Path) -> None:
    module = load_script("ovis-ocr2-server.py")
    folder = work / "startup-in"
    folder.mkdir()
    (folder / "p.jpg").write_bytes(page_image(1, fmt="JPEG"))
    stub, url, log = start_stub(model=module.MODEL_ID)
    uv = shutil.which("uv")
    cache = work / "uv-cache"
    try:
        for label in ("cold uv cache", "warm uv cache"):
            seen = len(log.read_text().splitlines()) if log.exists() else 0
            started = time.time()
            run = subprocess.run([uv, "run", "--cache-dir", str(cache), str(ROOT / "ovis-ocr2-server.py"),
                                  str(folder), str(work / f"startup-out-{label[:4]}"), "--server", url,
                                  "--no-sanity-check"], capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-2000:]
            first = min(json.loads(line)["t"] for line in log.read_text().splitlines()[seen:])
            RESULTS.setdefault("startup", {})[label] = first - started
            note("startup", f"`uv run ovis-ocr2-server.py` to first request, {label}", f"{first - started:.1f} s")
    finally:
        stub.kill()


def bench_stub_1000(work: Path) -> None:
    """1,000 scan-like pages (A4 at 150 DPI, JPEG) through ovis-ocr2-server.py against a stub
    that takes 0.5 s per page, at the default concurrency of 32."""
    module = load_script("ovis-ocr2-server.py")
    folder = work / "pages"
    folder.mkdir()
    distinct = [page_image(2000 + i, size=(1240, 1754), fmt="JPEG", grain=12) for i in range(50)]
    for i in range(1000):
        (folder / f"page_{i:04d}.jpg").write_bytes(distinct[i % 50])
    stub, url, _ = start_stub("--latency", "0.5", "--no-decode", model=module.MODEL_ID)
    stats = work / "stats.json"
    try:
        run = subprocess.run([sys.executable, str(ROOT / "ovis-ocr2-server.py"), str(folder),
                              str(work / "out"), "--server", url, "--stats-json", str(stats),
                              "--no-sanity-check"], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
    finally:
        stub.kill()
    result = json.loads(stats.read_text())
    RESULTS["stub_1000"] = result
    note("stub-1000", "rows ok / failed", f"{result['rows_ok']} / {result['rows_failed']}")
    note("stub-1000", "pages/s overall | steady (stub: 0.5 s/page, 32 in flight)",
         f"{result['pages_per_s']:.1f} | {result['pages_per_s_steady']:.1f}")
    note("stub-1000", "peak RSS | peak pages in flight",
         f"{result['peak_rss_bytes'] / 2**20:.0f} MiB | {result['peak_in_flight']}")


SECTIONS = {"driver-cost": bench_driver_cost, "memory": bench_memory, "ceiling": bench_ceiling,
            "shapes": bench_shapes, "scale-out": bench_scale_out, "startup": bench_startup,
            "stub-1000": bench_stub_1000}


def main() -> int:
    chosen = [a for a in sys.argv[1:] if a in SECTIONS] or list(SECTIONS)
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"sections: {', '.join(chosen)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            started = time.monotonic()
            work = Path(tmp) / name
            work.mkdir()
            SECTIONS[name](work)
            RESULTS.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)
    (out / "latest.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    print("\n| section | measure | figure |\n| --- | --- | --- |")
    for section, measure, figure in ROWS:
        print(f"| {section} | {measure} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
