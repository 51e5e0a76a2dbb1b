"""Benchmarks of the collection, side by side in one run (these machines are noisy: compare the
ratios, not the absolute figures). Not tests: nothing here asserts a speed.

    uv run --no-project --with-requirements tests/requirements.txt python benchmarks/run.py
    ... python benchmarks/run.py driver-cost memory     # some sections only

Sections (all by default, in this order; 8 to 11 minutes on 2 cores):
  driver-cost    CPU per page of the driver against a zero-latency stub, on a realistic mix of
                 pages, next to a plain reference driver (benchmarks/reference_driver.py)
  memory         driver peak RSS at 8 and at 256 pages in flight (2048 px PNG pages, slow stub)
  giant-pages    driver peak RSS on a folder of 12000x12000 16-bit grey PNGs with 2 and 8
                 preparation threads (with --baseline REF, REF's driver too, at 2 threads)
  startup        seconds from `uv run SCRIPT` to the first request, cold and warm uv cache
  stub-1000      a 1,000-page run of ovis-ocr2-server.py against a stub at 0.5 s per page
  scale-out      two shards as two processes, each with its own engine, into one OUTPUT,
                 against one single run
  ceiling        each server script against the real CPU engine, next to the same requests
                 pre-encoded and sent from memory at the same concurrency (the best any client
                 can do), in alternating rounds (--rounds) after warm-up passes, both clients
                 kept off the core vLLM's CPU worker computes on; pages/s per script and pooled,
                 and the mean pages in flight of each client. With --baseline REF the scripts at
                 REF run as a third arm in the same rounds: today's over REF's pages/s
  shapes         lighton-ocr3.py (offline) vs lighton-ocr3-saturate.py with a fixed window of
                 32 and with the adaptive window, on the real engine with long-tailed page
                 lengths (benchmarks/page_length.py)
  pdf            100- and 500-page PDFs through lighton-ocr3-saturate.py against a zero-latency
                 stub: pages/s with 1 and 2 render workers, and the peak memory (PSS) of the
                 driver with its workers, next to rendering every page up front as bitmaps
                 (what a tool that turns a PDF into a list of images does); plus the render
                 rate of one worker alone (in-process, no driver)
  compare        ocr-compare.py on 100,000 pages of 2,000 characters (Markdown, some pages
                 edited): parity of two outputs, and CER/WER against a ground-truth column;
                 wall and CPU seconds of the whole command (reading the parquet included).
                 Not in the default run (about 3 minutes): name it
  repetition     vLLM's repetition detection (issue #29) at the scripts' (P, C): the engine's
                 check per step at 32, 256 and 1,024 requests against a GPU decode step;
                 tokens per looping page by loop period (1, 8, 32, 128; forced by
                 benchmarks/forced_loop.py) with it off and on, through `vllm serve` and
                 `vllm.LLM`; pages/s off and on with 0, 2 and 10% of pages looping. Not in the
                 default run (about 6 minutes): name it

The real-engine sections use the CPU vLLM environment and tiny checkpoints the tests build, and
share one `vllm serve` (LightOnOCR-3's flags, the page-length processor loaded). Results go to
bench-results/latest.json and a table is printed last.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
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

def baseline_copy(script: str, work: Path) -> Path | None:
    """The script as it was at --baseline (a git ref), for measuring both in one run."""
    if not BASELINE:
        return None
    path = work / "before" / script
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE}:{script}"],
                                        capture_output=True, check=True).stdout)
    return path


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
        drivers = {"ours": ROOT / script}
        if BASELINE:  # the same script at another commit, measured in the same run
            drivers["before"], results["before"] = baseline_copy(script, work), []
        for attempt in range(3):  # interleaved, medians: the machine is noisy
            for arm, driver in drivers.items():
                out = work / f"out-{arm}-{attempt}"
                wall, cpu, run = timed_run([sys.executable, str(driver), str(mix), str(out),
                                            "--server", url, "--no-sanity-check", "--concurrency", "32"])
                assert run.returncode == 0, run.stderr[-2000:]
                _, cpu1, run1 = timed_run([sys.executable, str(driver), str(one), str(out) + "-1",
                                           "--server", url, "--no-sanity-check"])
                assert run1.returncode == 0, run1.stderr[-2000:]
                results[arm].append((wall, cpu, cpu1))
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
    if BASELINE:
        note("driver-cost", f"whole process CPU s/page, mix, median of 3: ours | at {BASELINE}",
             f"{per_page['ours']:.3f} | {per_page['before']:.3f} = "
             f"{per_page['ours'] / per_page['before']:.0%} (target <= 105%)")
    note("driver-cost", "pages sent bit-exact (no re-encode)", f"{passthrough}/{n}")


def per_page_cpu_by_kind(module, mix: Path, reps: int = 3) -> dict:
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
    for i in range(256):
        os.link(base, folder / f"page_{i:04d}.png")
    base.unlink()
    # 10 s per answer: long enough for every page of a window to be in flight at once
    stub, url, _ = start_stub("--no-decode", "--latency", "10", model=module.MODEL_ID)
    rss = {}
    try:
        for window in (8, 256):
            stats = work / f"mem-{window}.json"
            limit = window  # one wave: the peak is every page of the window in flight
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


# ---- giant 16-bit pages ----------------------------------------------------------------------

GIANT_ARMS = {"now": (2, 8), "before": (2,)}  # preparation threads per arm: the code at
# --baseline took 2.4 GB per page at once, so it runs with 2 threads only (8 would be ~20 GB)


def bench_giant_pages(work: Path) -> None:
    """Issue #28: a folder of 12000x12000 16-bit grey PNGs (300 KB each on disk), driver peak
    RSS with N preparation threads (os.cpu_count() set to N in the driver), against a slow stub."""
    import numpy as np
    from PIL import Image

    script = "ovis-ocr2-server.py"
    module = load_script(script)
    folder = work / "giants"
    folder.mkdir()
    page = np.full((12000, 12000), 40000, dtype=np.uint16)
    page[:3000] = 8000
    Image.fromarray(page).save(folder / "base.png")
    del page
    for i in range(8):
        os.link(folder / "base.png", folder / f"page_{i}.png")
    (folder / "base.png").unlink()
    stub, url, _ = start_stub("--no-decode", "--latency", "2", model=module.MODEL_ID)
    threads_wrapper = ("import os, runpy, sys; n = int(sys.argv.pop(1)); os.cpu_count = lambda: n; "
                       "sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')")
    drivers = {"now": ROOT / script}
    if BASELINE:
        drivers["before"] = baseline_copy(script, work)
    figures = {}
    try:
        for arm, driver in drivers.items():
            for threads in GIANT_ARMS[arm]:
                stats = work / f"giant-{arm}-{threads}.json"
                wall, _, run = timed_run([sys.executable, "-c", threads_wrapper, str(threads), str(driver),
                                          str(folder), str(work / f"giant-out-{arm}-{threads}"),
                                          "--server", url, "--concurrency", "8", "--no-sanity-check",
                                          "--stats-json", str(stats)])
                assert run.returncode == 0, run.stderr[-2000:]
                result = json.loads(stats.read_text())
                assert result["rows_ok"] == 8, result
                figures[f"{arm}-{threads}"] = (result["peak_rss_bytes"], wall)
                note("giant-pages", f"8 pages 12000x12000 16-bit, {threads} prep threads, "
                     f"{'at ' + BASELINE if arm == 'before' else 'now'}: peak RSS, wall",
                     f"{result['peak_rss_bytes'] / 2**20:.0f} MiB, {wall:.0f} s"
                     + (" (target < 1536 MiB)" if threads == 8 else ""))
    finally:
        stub.kill()
    RESULTS["giant_pages"] = {k: {"peak_rss_bytes": rss, "wall_s": wall} for k, (rss, wall) in figures.items()}


# ---- the real engine ---------------------------------------------------------------------------

def engine_env_vars(extra: dict | None = None) -> dict:
    env = engine_env.engine_environ(extra)
    env["VLLM_CPU_CI_ENV"] = "0"  # measured as users run the engine: compiled (the tests trace only)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
    return env


def distinct_pages(folder: Path, count: int) -> Path:
    """`count` different JPEG pages of different sizes. The sizes differ in their number of
    image tokens (multiples of the 32 px merge unit), so every prompt differs and
    benchmarks/page_length.py gives each page its own length; same-size pages would share one."""
    sizes, seen = [], set()
    for index in range(10_000):
        columns, rows = 10 + index % 9, 14 + (index * 7) % 17  # 320-576 px by 448-960 px
        if columns * rows not in seen:
            seen.add(columns * rows)
            sizes.append((32 * columns, 32 * rows))
        if len(sizes) == count:
            break
    assert len(sizes) == count, f"only {len(sizes)} distinct page sizes"
    cells = [page_image(1000 + i, size=size, fmt="JPEG") for i, size in enumerate(sizes)]
    return write_parquet_dataset(folder, cells)


# Every engine here runs without torch.compile: for the tiny checkpoint it changes nothing in
# throughput (pre-encoded, 96 pages, 6 runs each: 20.1 pages/s eager, 20.4 compiled) and halves
# the start-up (29 s against 59 s), which the benchmark pays four times.
EAGER_SERVE = ["--enforce-eager"]
PAGE_LENGTHS = "page_length:PageLengthProcessor"  # importable with benchmarks/ on PYTHONPATH


class SharedEngine:
    """One `vllm serve` of the tiny Qwen3.5 checkpoint with LightOnOCR-3's serve flags and the
    page-length processor, shared by the sections that need a running server (each start costs
    about a minute on 2 cores). Answers as the checkpoint's path and as "HPD-Parsing"."""

    def __init__(self, work: Path):
        self.work, self.server, self.ready = work, None, False

    def __enter__(self) -> "SharedEngine":
        return self

    def begin(self) -> None:
        """Start booting; `start()` waits for it."""
        if self.server is None:
            engine_env.build()
            self.model = tiny_model("qwen3_5")
            lighton = load_script("lighton-ocr3-saturate.py")
            serve = [*lighton.SERVE_ARGS, *EAGER_SERVE, "--served-model-name", str(self.model),
                     "HPD-Parsing", "--logits-processors", PAGE_LENGTHS]
            self.began = time.monotonic()
            self.server = RunningServer(self.model, free_port(), serve, self.work / "shared-serve.log",
                                        env=engine_env_vars())

    def start(self) -> "SharedEngine":
        self.begin()
        if not self.ready:
            self.server.wait()
            self.ready = True
            RESULTS["shared_engine_start_s"] = round(time.monotonic() - self.began, 1)
            print(f"  shared vllm serve ready after {RESULTS['shared_engine_start_s']} s", flush=True)
        return self

    @property
    def url(self) -> str:
        return self.start().server.url

    def compute_cores(self) -> set[int]:
        """The cores vLLM's CPU worker bound its OpenMP threads to, from the serve log."""
        found = re.findall(r"core ids=\[([\d, ]+)\]", self.server.log.read_text(errors="replace"))
        return {int(core) for core in found[-1].split(",")} if found else set()

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()


async def send_preencoded(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, int, float]:
    """(seconds to get every answer, completion tokens, mean requests in flight) with
    `concurrency` requests in flight: the best a client can do."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    tokens, latencies = [], []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        async def one(body):
            async with gate:
                sent = time.monotonic()
                response = await client.post(f"{url}/v1/chat/completions", content=body,
                                             headers={"Content-Type": "application/json"})
                latencies.append(time.monotonic() - sent)
                assert response.status_code == 200, response.text
                tokens.append(response.json()["usage"]["completion_tokens"])
        started = time.monotonic()
        await asyncio.gather(*(one(b) for b in bodies))
        elapsed = time.monotonic() - started
        return elapsed, sum(tokens), sum(latencies) / elapsed


class ClientCores:
    """Keep this process and the drivers it starts off the cores where vLLM's CPU worker runs
    the model. On a GPU the model's arithmetic never waits for a client thread; here the worker
    binds its OpenMP threads to those cores, and a client thread scheduled there stalls the
    whole forward pass. Both arms of a comparison get the same cores."""

    def __init__(self, engine_cores: set[int]):
        self.before = os.sched_getaffinity(0)
        self.cores = self.before - engine_cores

    def __enter__(self) -> set[int]:
        if self.cores:
            os.sched_setaffinity(0, self.cores)
        return self.cores or self.before

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.before)


def bench_ceiling(work: Path, engine: SharedEngine) -> None:
    """Each server script against the same engine fed pre-encoded requests from memory, in
    ROUNDS rounds whose order alternates (pre-encoded first, then driver first) so that drift
    on a shared machine falls on both arms, after WARM_UP untimed passes (the CPU engine runs
    its first batches of each new shape slower); medians of each arm, and their ratio. Also
    the mean pages in flight of each arm (Little's law), which the engine's speed does not
    move: how full each client kept the server."""
    import datasets

    n, max_tokens, concurrency = 96, 64, 32
    source = distinct_pages(work / "ceiling-in", n)
    url, model = engine.url, engine.model
    cells = datasets.load_dataset("parquet", data_files=str(source), split="train").cast_column(
        "image", datasets.Image(decode=False))["image"]
    with ClientCores(engine.compute_cores()) as cores:
        RESULTS["ceiling_client_cores"] = sorted(cores)
        for script in ("ovis-ocr2-server.py", "lighton-ocr3-saturate.py", "deepseek-ocr-server.py",
                       "hpd-parsing-saturate.py"):
            ceiling_of_script(script, work, source, cells, url, model, n, max_tokens, concurrency)
    # The four drivers run the same copied pipeline: pooled over every round of every script,
    # the run-to-run swings of this machine average out (pages over seconds, per arm).
    everything = RESULTS["ceiling"].values()
    pooled = {arm: sum(n for r in everything for _ in r["rounds"][arm])
              / sum(n / rate for r in everything for rate in r["rounds"][arm])
              for arm in ("driver", "preencoded")}
    in_flight = {arm: statistics.mean(x for r in everything for x in r["in_flight"][arm])
                 for arm in ("driver", "preencoded")}
    RESULTS["ceiling_pooled"] = {**pooled, "ratio": pooled["driver"] / pooled["preencoded"],
                                 "in_flight": in_flight}
    if BASELINE:
        rate = {arm: sum(n for r in everything for _ in r["rounds"][arm])
                / sum(n / x for r in everything for x in r["rounds"][arm])
                for arm in ("driver", "before")}
        RESULTS["ceiling_pooled"]["now_over_before"] = rate["driver"] / rate["before"]
        note("ceiling", f"all four, pooled: driver now | at {BASELINE} pages/s (target >= 95%)",
             f"{rate['driver']:.2f} | {rate['before']:.2f} = {rate['driver'] / rate['before']:.0%}")
    note("ceiling", f"all four, {ROUNDS} rounds each, pooled: driver | pre-encoded pages/s (target >= 95%)",
         f"{pooled['driver']:.2f} | {pooled['preencoded']:.2f} = {pooled['driver'] / pooled['preencoded']:.0%}")
    note("ceiling", f"all four: mean pages in flight, driver | pre-encoded (of {concurrency})",
         f"{in_flight['driver']:.1f} | {in_flight['preencoded']:.1f} = "
         f"{in_flight['driver'] / in_flight['preencoded']:.1%}")


def ceiling_of_script(script: str, work: Path, source: Path, cells, url: str, model: Path,
                      n: int, max_tokens: int, concurrency: int) -> None:
    module = load_script(script)
    extra = ["--model", str(model)] if not script.startswith("hpd") else []
    extra += ["--concurrency", str(concurrency), "--max-tokens", str(max_tokens), "--no-sanity-check"]
    # the pre-encoded bodies are the ones the script sends: built from its own parsed arguments
    args = module.argument_parser(module.__doc__, module.add_server_arguments).parse_args(
        [str(source), str(work / "unused"), "--server", url, *extra])
    name = "HPD-Parsing" if script.startswith("hpd") else str(model)
    bodies = [module.request_body(module.prepare_page(c), name, args) for c in cells]
    names = ["preencoded", "driver"] + ["before"] * bool(BASELINE)
    arms, tokens, in_flight = ({name: [] for name in names} for _ in range(3))
    scripts = {"driver": ROOT / script, "before": baseline_copy(script, work)}

    def preencoded():
        elapsed, completion_tokens, mean_in_flight = asyncio.run(send_preencoded(url, bodies, concurrency))
        arms["preencoded"].append(n / elapsed)
        tokens["preencoded"].append(completion_tokens)
        in_flight["preencoded"].append(mean_in_flight)

    def driver(arm: str = "driver"):
        attempt = len(arms[arm])
        stats = work / f"ceiling-{arm}-{script}-{attempt}.json"
        output = work / f"ceiling-out-{arm}-{script}-{attempt}"
        run = subprocess.run([sys.executable, str(scripts[arm]), str(source), str(output),
                              "--server", url, "--stats-json", str(stats), *extra],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        result = json.loads(stats.read_text())
        assert result["rows_ok"] == n, result
        arms[arm].append(n / result["active_s"])  # first page in to last answer out
        tokens[arm].append(sum(completion_lengths(output)))
        in_flight[arm].append(result["mean_in_flight"])

    def before():
        driver("before")

    for _ in range(WARM_UP):
        asyncio.run(send_preencoded(url, bodies, concurrency))
    order = [preencoded, driver] + [before] * bool(BASELINE)
    for round_ in range(ROUNDS):  # A B (C), (C) B A, ...: drift falls on every arm alike
        for arm in (order if round_ % 2 == 0 else order[::-1]):
            arm()
    median = {k: statistics.median(v) for k, v in arms.items()}
    ratio = median["driver"] / median["preencoded"]
    pairs = [d / p for d, p in zip(arms["driver"], arms["preencoded"])]
    same_work = len(set(tokens["driver"] + tokens["preencoded"])) == 1
    RESULTS.setdefault("ceiling", {})[script] = {**median, "ratio": ratio, "rounds": arms,
                                                 "round_ratios": pairs, "completion_tokens": tokens,
                                                 "in_flight": in_flight}
    if BASELINE:
        now_over_before = [d / b for d, b in zip(arms["driver"], arms["before"])]
        RESULTS["ceiling"][script]["now_over_before"] = now_over_before
        note("ceiling", f"{script}: driver now | at {BASELINE}, median pages/s",
             f"{median['driver']:.2f} | {median['before']:.2f} = "
             f"{median['driver'] / median['before']:.0%} (rounds {min(now_over_before):.0%}-"
             f"{max(now_over_before):.0%}; target >= 95%)")
    note("ceiling", f"{script}: driver | pre-encoded, median pages/s",
         f"{median['driver']:.2f} | {median['preencoded']:.2f} = {ratio:.0%} "
         f"(rounds {min(pairs):.0%}-{max(pairs):.0%}; in flight "
         f"{statistics.mean(in_flight['driver']):.1f} | {statistics.mean(in_flight['preencoded']):.1f}; "
         f"same tokens: {'yes' if same_work else 'NO ' + str(tokens)})")


def completion_lengths(output: Path) -> list[int]:
    import pyarrow.parquet as pq

    table = pq.read_table(sorted((output / "data").glob("*.parquet")),
                          columns=["markdown_completion_tokens"])
    return sorted(table.column(0).to_pylist())


def bench_shapes(work: Path, engine: SharedEngine) -> None:
    """lighton-ocr3.py (vllm.LLM, batches of 16) against lighton-ocr3-saturate.py (fixed window
    of 32, then adaptive; two runs each, in alternating order) on one long-tailed workload: each
    page ends at its own length (benchmarks/page_length.py), max_tokens 768 as the ceiling."""
    n = 96
    source = distinct_pages(work / "shapes-in", n)
    model = engine.start().model
    common = [str(source), "--model", str(model), "--max-tokens", "768", "--no-sanity-check"]
    stats, output = work / "shape-offline.json", work / "shape-offline"
    run = subprocess.run([str(engine_env.python()), str(ROOT / "lighton-ocr3.py"), *common[:1],
                          str(output), *common[1:], "--stats-json", str(stats),
                          "--llm-kwargs", json.dumps({"logits_processors": [PAGE_LENGTHS], "enforce_eager": True})],
                         capture_output=True, text=True, env=engine_env_vars())
    assert run.returncode == 0, run.stderr[-3000:]
    runs = {"offline (batches of 16)": [json.loads(stats.read_text())]}
    outputs = {"offline (batches of 16)": output}
    arms = [("saturate, fixed window 32", ["--concurrency", "32"]),
            ("saturate, adaptive window", ["--adapt-interval", "1"])]
    for round_ in range(2):  # fixed then adaptive, then the other way round
        for label, extra in (arms if round_ == 0 else arms[::-1]):
            stats, output = work / f"shape-{round_}-{extra[0]}.json", work / f"shape-out-{round_}-{extra[0]}"
            run = subprocess.run([sys.executable, str(ROOT / "lighton-ocr3-saturate.py"), *common[:1],
                                  str(output), *common[1:], "--server", engine.url,
                                  "--stats-json", str(stats), *extra], capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-3000:]
            runs.setdefault(label, []).append(json.loads(stats.read_text()))
            outputs[label] = output
    lengths = {label: completion_lengths(output) for label, output in outputs.items()}
    first = next(iter(lengths.values()))
    note("shapes", "page lengths in tokens: min | median | p90 | max, same in every arm",
         f"{first[0]} | {first[n // 2]} | {first[int(n * 0.9)]} | {first[-1]}; "
         f"{'yes' if all(v == first for v in lengths.values()) else 'NO'}")
    base_rate = n / runs["offline (batches of 16)"][0]["active_s"]  # engine start-up left out
    RESULTS["shapes"] = {"lengths": first}
    for label, results in runs.items():
        rates = [n / result["active_s"] for result in results]
        rate = statistics.median(rates)
        verdicts = sorted({r["bound_by"] for r in results if r.get("bound_by")})
        RESULTS["shapes"][label] = {"pages_per_s": rate, "rounds": rates,
                                    "peak_in_flight": max(r["peak_in_flight"] for r in results),
                                    "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
                                    "bound_by": verdicts}
        extra = f", bound by {' / '.join(verdicts)}" if verdicts else ""
        runs_note = f" (runs: {', '.join(f'{r:.2f}' for r in rates)})" if len(rates) > 1 else ""
        note("shapes", f"{label}: pages/s (x offline), peak in flight",
             f"{rate:.2f} ({rate / base_rate:.2f}x){runs_note}, "
             f"{RESULTS['shapes'][label]['peak_in_flight']}{extra}")


def bench_scale_out(work: Path, engine: SharedEngine) -> None:
    """Two shards of lighton-ocr3-saturate.py as two processes into one OUTPUT, each spawning its
    own `vllm serve`, against one single run on the shared engine (the same flags). Nothing here
    is timed, so the shards boot while the shared engine does."""
    engine.begin()
    model = engine.model
    source = distinct_pages(work / "scale-in", 12)
    script = "lighton-ocr3-saturate.py"  # its serve flags are the shared engine's
    common = ["--model", str(model), "--max-tokens", "32", "--temperature", "0", "--no-sanity-check"]
    env = engine_env_vars()
    started = time.monotonic()
    # the shards' engines: the shared one's flags, the page-length processor loaded
    shard_serve = ["--serve-args", " ".join([*EAGER_SERVE, "--logits-processors", PAGE_LENGTHS])]
    shards = [subprocess.Popen([sys.executable, str(ROOT / script), str(source),
                                str(work / "scale-sharded"), "--server", f"http://127.0.0.1:{free_port()}",
                                "--num-shards", "2", "--shard-index", str(i), *common, *shard_serve],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
              for i in range(2)]
    codes = [p.wait() for p in shards]
    elapsed = time.monotonic() - started
    assert codes == [0, 0], [p.stderr.read()[-2000:] for p in shards]
    single = subprocess.run([sys.executable, str(ROOT / script), str(source),
                             str(work / "scale-single"), "--server", engine.url, *common],
                            capture_output=True, text=True, env=env)
    assert single.returncode == 0, single.stderr[-2000:]
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


# ---- ocr-compare.py --------------------------------------------------------------------------

COMPARE_PAGES, COMPARE_CHARS = 100_000, 2_000


def compare_corpus(folder: Path, pages: int, chars: int, seed: int = 19) -> tuple[Path, Path]:
    """Two collection-shaped outputs of the same pages: A, and B with a few characters changed
    on every third page; A also holds the ground truth (the plain text, hyphenation unjoined).
    Pages are Markdown: a heading, bold words, 80-character lines, some hyphenated line ends."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz\u00e4\u00f6\u00fc\u00df\u00e9"
    vocab = ["".join(rng.choices(letters, k=rng.randint(1, 11))) for _ in range(20_000)]
    a, b, truth = [], [], []
    for page in range(pages):
        words = rng.choices(vocab, k=chars // 5)
        plain = " ".join(words)[:chars]
        truth.append(plain)
        lines = [plain[i:i + 80] for i in range(0, len(plain), 80)]
        body = "\n".join(line + ("-" if k % 7 == 3 and line[-1:].isalpha() else "")
                         for k, line in enumerate(lines[1:]))
        start = body.index(" ") + 1
        end = body.index(" ", start)
        markdown = f"# {lines[0]}\n\n{body[:start]}**{body[start:end]}**{body[end:]}"  # one bold word
        a.append(markdown)
        if page % 3 == 0:
            edited = list(markdown)
            for _ in range(20):
                edited[rng.randrange(len(edited))] = rng.choice(letters)
            markdown = "".join(edited)
        b.append(markdown)
    names = [f"page_{i:06d}.png" for i in range(pages)]
    for name, texts, extra in (("a", a, {"text": truth}), ("b", b, {})):
        (folder / name / "data").mkdir(parents=True)
        pq.write_table(pa.table({"file_name": names, "markdown": texts,
                                 "markdown_error": pa.nulls(pages, pa.string()),
                                 "markdown_finish_reason": ["stop"] * pages, **extra}),
                       folder / name / "data" / f"part-000000000-{pages:09d}.parquet")
    return folder / "a", folder / "b"


def bench_compare(work: Path) -> None:
    began = time.monotonic()
    a, b = compare_corpus(work, COMPARE_PAGES, COMPARE_CHARS)
    note("compare", f"{COMPARE_PAGES:,} pages of {COMPARE_CHARS:,} characters written",
         f"{time.monotonic() - began:.0f} s")
    uv = shutil.which("uv")
    for label, args in (("parity of two outputs", [str(a), str(b)]),
                        ("CER/WER against ground truth", [str(a), "--reference-column", "text"])):
        report = work / "compare.json"
        # under uv, as a user runs it (the environment is cached by then: --help ran first)
        subprocess.run([uv, "run", "-q", str(ROOT / "ocr-compare.py"), "--help"], capture_output=True)
        wall, cpu, run = timed_run([uv, "run", "-q", str(ROOT / "ocr-compare.py"), *args,
                                    "--json", str(report)])
        assert run.returncode == 0, run.stderr[-2000:]
        figures = json.loads(report.read_text())
        RESULTS.setdefault("compare", {})[label] = {"wall_s": wall, "cpu_s": cpu,
                                                    "inside_s": figures["seconds"],
                                                    "loading_s": figures["seconds_loading"]}
        note("compare", f"ocr-compare.py, {label}: wall | CPU | reading the parquet",
             f"{wall:.1f} s | {cpu:.1f} s | {figures['seconds_loading']:.1f} s")
    load = os.getloadavg()[0]
    note("compare", "load average when it ended (other work on the machine)", f"{load:.1f}")


# ---- PDF input -----------------------------------------------------------------------------------

PDF_PAGES = (100, 500)
UP_FRONT = ("import sys; sys.path.insert(0, sys.argv[1]); import run; "
            "print(*run.pdf_render_rates(sys.argv[2], sys.argv[3]))")


def pdf_render_rates(script: str, pdf: str, encoded: int = 50) -> tuple[int, float, float]:
    """(pages, seconds to render every page up front as bitmaps at the size the driver sends,
    as a tool that turns a PDF into a list of images returns them; pages/s of a render
    worker's own work, render then encode, on the first `encoded` pages)."""
    import pypdfium2 as pdfium

    module = load_script(script)
    args = module.argument_parser(module.__doc__, module.add_server_arguments).parse_args(
        [pdf, "unused"])
    document = pdfium.PdfDocument(pdf)
    sent = module._render_pdf_page(document[0], args)
    scale = sent.width / document[0].get_size()[0]  # the benchmark's pages are one size
    began = time.monotonic()
    pages = [page.render(scale=scale).to_pil() for page in document]
    elapsed = time.monotonic() - began
    some = list(document)[:encoded]
    began = time.monotonic()
    for page in some:
        module._render_pdf_page(page, args)
    return len(pages), elapsed, len(some) / (time.monotonic() - began)


def tree_peak_pss(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, the peak of the summed PSS of the process and its children, stdout),
    sampled every 0.1 s: the render workers count, and pages they share with the driver
    (forked) are counted once."""
    import psutil

    began = time.monotonic()
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        try:
            tree = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_full_info().pss for p in tree))
        except psutil.Error:
            pass
        time.sleep(0.1)
    out, err = process.communicate()
    assert process.returncode == 0, err[-2000:]
    return time.monotonic() - began, peak, out


def bench_pdf(work: Path) -> None:
    from pdfs import Page, colour_of, make_pdf

    script = "lighton-ocr3-saturate.py"
    module = load_script(script)
    text = "\n".join(f"Line {i}: a page of a long report, with words in it." for i in range(40))
    stub, url, _ = start_stub("--no-decode", model=module.MODEL_ID)
    figures: dict = {}
    try:
        for pages in PDF_PAGES:
            folder = work / f"pdf{pages}"
            folder.mkdir()
            pdf = folder / "report.pdf"
            pdf.write_bytes(make_pdf([Page(colour=colour_of(i), text=text) for i in range(pages)]))
            _, up_front, out = tree_peak_pss([sys.executable, "-c", UP_FRONT,
                                              str(ROOT / "benchmarks"), script, str(pdf)])
            count, elapsed, encoded = out.split()
            figures[pages] = {"up_front_peak_pss": up_front,
                              "render_only_pages_per_s": int(count) / float(elapsed),
                              "render_and_encode_pages_per_s": float(encoded)}
            for workers in (1, 2) if pages == max(PDF_PAGES) else (2,):
                stats = work / f"pdf-{pages}-{workers}.json"
                wall, pss, _ = tree_peak_pss([
                    sys.executable, str(ROOT / script), str(folder), str(work / f"out-{pages}-{workers}"),
                    "--server", url, "--concurrency", "8", "--pdf-workers", str(workers),
                    "--no-sanity-check", "--stats-json", str(stats)])
                result = json.loads(stats.read_text())
                figures[pages][f"driver_{workers}_workers"] = {
                    "pages_per_s": result["pages_per_s"], "peak_pss": pss, "wall_s": wall,
                    "driver_peak_rss": result["peak_rss_bytes"]}
    finally:
        stub.kill()
    RESULTS["pdf"] = figures
    big, small = max(PDF_PAGES), min(PDF_PAGES)
    mib = lambda value: f"{value / 2**20:.0f}"  # noqa: E731
    note("pdf", "Letter pages with text, sent at 1568x2048 (PNG); 8 pages in flight", "")
    note("pdf", "one render worker's work alone, in-process: render | render + PNG encode, pages/s",
         f"{figures[big]['render_only_pages_per_s']:.1f} | "
         f"{figures[big]['render_and_encode_pages_per_s']:.1f}")
    note("pdf", f"driver, {big} pages, 1 | 2 render workers: pages/s end to end",
         f"{figures[big]['driver_1_workers']['pages_per_s']:.1f} | "
         f"{figures[big]['driver_2_workers']['pages_per_s']:.1f}")
    note("pdf", f"peak PSS, driver + 2 workers: {small} | {big} pages",
         f"{mib(figures[small]['driver_2_workers']['peak_pss'])} | "
         f"{mib(figures[big]['driver_2_workers']['peak_pss'])} MiB")
    note("pdf", f"peak PSS, every page rendered up front (bitmaps): {small} | {big} pages",
         f"{mib(figures[small]['up_front_peak_pss'])} | {mib(figures[big]['up_front_peak_pss'])} MiB")


# ---- repetition detection (issue #29, item 3) --------------------------------------------------

# A GPU decode step to weigh the check against: OvisOCR2 on a10g-small at a window of 32 ran
# 4,057 tokens/s (../shared/MODEL-FACTS.md, seed 000), 32 / 4,057 = 7.9 ms per step. No larger
# window was measured: a step over more requests takes no less, so at 256 and 1,024 the same
# 7.9 ms gives an upper bound of the check's share.
GPU_STEP_S = 32 / 4057
BUDGETS = {"ovis-ocr2": 16384, "lighton-ocr3": 12288, "hpd-parsing": 8000, "deepseek-ocr": 7195}


def loop_bodies(model: str, detection: dict | None, xargs: list[dict],
                max_tokens: int) -> list[bytes]:
    return [json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0.0,
                        "messages": [{"role": "user", "content": "A page:"}], "vllm_xargs": x,
                        **({"repetition_detection": detection} if detection else {})}).encode()
            for x in xargs]


async def send_fresh(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, int]:
    """(seconds, completion tokens) for every body, `concurrency` at once, each on a new
    connection (a kept-alive one the server closed while idle fails the request)."""
    import httpx

    gate, tokens = asyncio.Semaphore(concurrency), []
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) \
            as client:
        async def one(body):
            async with gate:
                response = await client.post(f"{url}/v1/chat/completions", content=body,
                                             headers={"Content-Type": "application/json"})
                tokens.append(response.json()["usage"]["completion_tokens"])
        started = time.monotonic()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.monotonic() - started, sum(tokens)


def bench_repetition(work: Path) -> None:
    import random

    from forced_loop import PERIODS
    from page_length import page_length

    scripts = {s: load_script(s).REPETITION_DETECTION for s in
               ("ovis-ocr2-server.py", "deepseek-ocr-server.py")}
    pc = scripts["ovis-ocr2-server.py"]
    engine_env.build()
    py = str(engine_env.python())
    bench = str(ROOT / "benchmarks" / "forced_loop.py")
    for p, c in sorted(set(scripts.values())):
        cost = json.loads(subprocess.run([py, bench, "check-cost", str(p), str(c)], text=True,
                                         capture_output=True, env=engine_env_vars(),
                                         check=True).stdout.strip().splitlines()[-1])
        RESULTS.setdefault("repetition_check_s", {})[f"{p}:{c}"] = cost
        note("repetition", f"engine check at P={p} C={c}: 32 | 256 | 1,024 requests per step",
             " | ".join(f"{cost[n] * 1e3:.3f} ms ({cost[n] / GPU_STEP_S:.1%})"
                        for n in ("32", "256", "1024")) + " of a 7.9 ms GPU step")
    max_tokens = 4096
    model = tiny_model("qwen3_5")
    serve = [*EAGER_SERVE, "--max-model-len", str(max_tokens + 256), "--logits-processors",
             "forced_loop:ForcedLoopProcessor"]
    server = RunningServer(model, free_port(), serve, work / "serve.log", env=engine_env_vars())
    try:
        server.wait()
        detection = {"max_pattern_size": pc[0], "min_count": pc[1]}
        served = {}
        for mode, field in (("off", None), ("on", detection)):
            bodies = loop_bodies(str(model), field, [{"loop_period": q} for q in PERIODS],
                                 max_tokens)
            for q, body in zip(PERIODS, bodies):
                import httpx
                answer = httpx.post(f"{server.url}/v1/chat/completions", content=body, timeout=900,
                                    headers={"Content-Type": "application/json"}).json()
                served.setdefault(q, {})[mode] = (answer["usage"]["completion_tokens"],
                                                  answer["choices"][0]["finish_reason"])
                print(f"  served period {q} detection {mode}: {served[q][mode]}", flush=True)
        # pages/s: 96 pages of long-tailed lengths (benchmarks/page_length.py), 0, 2 and 10%
        # of them looping (periods 1, 8, 32 in turn) to max_tokens 2,048 (real budgets / 8,
        # as the page lengths are), at 32 in flight; detection off and on, alternating
        rng = random.Random(7)
        rates = {}
        for share in (0.0, 0.02, 0.10):
            looping = set(rng.sample(range(96), round(96 * share)))
            xargs = [{"loop_period": PERIODS[i % 3], "salt": i} if i in looping else
                     {"page_length": page_length(i), "salt": i} for i in range(96)]
            for rnd in range(2):
                for mode, field in (("off", None), ("on", detection))[::1 if rnd % 2 == 0 else -1]:
                    elapsed, tokens = asyncio.run(send_fresh(
                        server.url, loop_bodies(str(model), field, xargs, 2048), 32))
                    rates.setdefault(share, {}).setdefault(mode, []).append((96 / elapsed, tokens))
    except Exception:
        print((work / "serve.log").read_text(errors="replace")[-4000:], flush=True)
        raise
    finally:
        server.stop()
    offline = json.loads(subprocess.run(
        [py, bench, "offline", str(model), str(pc[0]), str(pc[1]), str(max_tokens)], text=True,
        capture_output=True, env=engine_env_vars(), cwd=work).stdout.strip().splitlines()[-1])
    RESULTS["repetition"] = {"served": served, "offline": offline, "rates": rates}
    for q in PERIODS:
        (off, _), (on, why) = served[q]["off"], served[q]["on"]
        llm_off, llm_on = offline["off"][str(q)][0], offline["on"][str(q)][0]
        ratios = ", ".join(f"{name} {budget / on if why == 'repetition' else 1:.1f}x"
                           for name, budget in BUDGETS.items())
        note("repetition", f"period {q}: tokens per looping page off | on (serve; vllm.LLM)",
             f"{off} | {on} {why}; {llm_off} | {llm_on}; at each budget: {ratios}")
    for share, modes in rates.items():
        note("repetition", f"pages/s, {share:.0%} of pages looping: off | on (2 rounds each)",
             " | ".join(f"{statistics.mean(r for r, _ in modes[m]):.2f} ({modes[m][0][1]:,} tok)"
                        for m in ("off", "on")))


# In this order: the stub sections, then scale-out (its shards boot while the shared engine
# does), then the timed real-engine sections with nothing else running.
SECTIONS = {"driver-cost": bench_driver_cost, "memory": bench_memory,
            "giant-pages": bench_giant_pages, "startup": bench_startup,
            "stub-1000": bench_stub_1000, "scale-out": bench_scale_out, "ceiling": bench_ceiling,
            "shapes": bench_shapes, "pdf": bench_pdf, "compare": bench_compare,
            "repetition": bench_repetition}
NOT_BY_DEFAULT = {"compare", "repetition"}  # run when named: another tool; vLLM's own check
NEEDS_ENGINE = {"ceiling", "shapes", "scale-out"}
ROUNDS = 4
BASELINE = None  # a git ref: driver-cost measures the script at that commit too
WARM_UP = 2  # untimed pre-encoded passes per script before the ceiling's rounds


def main() -> int:
    import argparse

    global ROUNDS, BASELINE
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"some of: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--baseline", metavar="GIT_REF",
                        help="driver-cost, giant-pages and ceiling also measure the scripts at this commit, "
                             "alternating with today's in the same rounds")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"alternating rounds per script in `ceiling` (default: {ROUNDS})")
    options = parser.parse_args()
    ROUNDS, BASELINE = options.rounds, options.baseline
    unknown = [name for name in options.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    chosen = [name for name in SECTIONS if name in options.sections] or \
        [name for name in SECTIONS if name not in NOT_BY_DEFAULT]
    # This machine sets PYTHONDONTWRITEBYTECODE, so every driver process would compile its
    # imports again (about 4 s of CPU); users' Pythons keep bytecode.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"sections: {', '.join(chosen)}", flush=True)
    begun = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, SharedEngine(Path(tmp)) as engine:
        for name in chosen:
            started = time.monotonic()
            work = Path(tmp) / name
            work.mkdir()
            if name in NEEDS_ENGINE:
                SECTIONS[name](work, engine)
            else:
                SECTIONS[name](work)
            RESULTS.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)
    RESULTS["total_seconds"] = round(time.monotonic() - begun, 1)
    (out / "latest.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    print("\n| section | measure | figure |\n| --- | --- | --- |")
    for section, measure, figure in ROWS:
        print(f"| {section} | {measure} | {figure} |")
    print(f"\n{RESULTS['total_seconds']:.0f} s in all: " + ", ".join(
        f"{k} {v:.0f} s" for k, v in RESULTS["section_seconds"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
