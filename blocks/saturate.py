"""The SATURATE HELPERS block of the -saturate.py scripts (edit here, then run
tools/sync_helpers.py). The names imported below come from an earlier block."""

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
from pathlib import Path

import httpx

from blocks.common.arguments import option
from blocks.common.stats import proc_bytes, RunStats
from blocks.server.pipeline import PAGES_PER_ENGINE, Window
from blocks.server.process import ServerManager
from blocks.server.serve_args import serve_arg_value

# ==== BEGIN SATURATE HELPERS (edit blocks/saturate.py, then run tools/sync_helpers.py) ====
# The adaptive window (read from vLLM's /metrics), its telemetry and options; the API servers.
API_SERVER_COUNT = globals().get("API_SERVER_COUNT", 1)  # a model section's measured count
API_SERVERS_MIN_CPUS = 12  # where more API servers helped (one preprocesses on one core); on
# smaller flavors they ran out of memory


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask (os.cpu_count() where there is none)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


METRICS = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
           "vllm:kv_cache_usage_perc": "kv", "vllm:gpu_cache_usage_perc": "kv",
           "vllm:prefix_cache_hits_total": "prefix_hits",
           "vllm:prefix_cache_queries_total": "prefix_queries"}


def parse_metrics(text: str) -> dict:
    """The vLLM gauges of METRICS, summed over label sets (kv: the fullest); missing ones absent."""
    out: dict = {}
    for line in text.splitlines():  # a comment's or a blank line's name is none of them
        if key := METRICS.get(line.split("{", 1)[0].split(" ", 1)[0]):
            with contextlib.suppress(IndexError, ValueError):
                value = float(line.rsplit(" ", 1)[1])
                out[key] = max(out.get(key, 0.0), value) if key == "kv" else \
                    out.get(key, 0.0) + value
    return out


# the best tokens/s decays by this a sample: an early burst of short pages does not stop growth
RATE_MEMORY = 0.9


class AdaptiveWindow(Window):
    """Grows while tokens/s rise with no queue; shrinks on a queue or a near-full KV cache."""

    def __init__(self, args, run):
        super().__init__(args, run)
        self.limit = max(1, args.concurrency or args.min_window)
        self.args, self.stats = args, run.stats
        self.budget = int(args.max_inflight_memory * (1 << 20)) if args.max_inflight_memory \
            else (proc_bytes("/proc/meminfo", "MemAvailable") or 8 << 30) // 4
        self.telemetry = Path(args.stats_json).expanduser().with_suffix(".telemetry.jsonl") \
            if args.stats_json else run.store.meta / "logs" / "telemetry.jsonl"
        self.telemetry.parent.mkdir(parents=True, exist_ok=True)
        self.seen = self.resized_at = 0  # pages finished by the last sample, the last resize
        self.best_rate, self.prefix_hit_rate = 0.0, None
        self.samples: list[str] = []
        self.last_sample = time.monotonic()

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, group) -> None:
        group = parser.add_argument_group("saturation (the window adapts to keep the engine busy)")
        option(group, "--concurrency", type=int, at_least=1, default=None, identity=False,
               help="a fixed window of N pages instead of the adaptive one")
        option(group, "--max-inflight-memory", type=float, above=0, default=None, identity=False,
               help="MiB of host memory that pages in flight may hold (default: a quarter of "
               "the memory available at start)")
        option(group, "--min-window", type=int, at_least=1, default=PAGES_PER_ENGINE,
               identity=False, help="smallest window, and the one it starts from (default: "
               "%(default)s, the server scripts' fixed window)")
        option(group, "--max-window", type=int, at_least=1, default=1024, identity=False,
               help="largest window (default: 1024)")
        option(group, "--adapt-interval", type=float, above=0, default=2.0, identity=False,
               help="seconds between window decisions (default: 2)")
        option(group, "--api-server-count", type=int, at_least=1, default=None, identity=False,
               help=f"API server processes of a spawned server (default: {API_SERVER_COUNT} "
               f"with {API_SERVERS_MIN_CPUS}+ CPUs, else 1)")

    @staticmethod
    def serve_args(args, serve_args: list[str]) -> list[str]:
        if serve_arg_value(serve_args, "--api-server-count") is not None:
            return []
        count = args.api_server_count or \
            (API_SERVER_COUNT if usable_cpus() >= API_SERVERS_MIN_CPUS else 1)
        return ["--api-server-count", str(count)] if count > 1 else []

    def memory_cap(self) -> int:
        """Pages the budget holds: each in flight keeps its request body, plus a margin."""
        if not self.body_sizes:
            return max(1, self.args.min_window)
        mean = sum(self.body_sizes) / len(self.body_sizes)
        return max(1, int(self.budget // (mean * 1.5 + (64 << 10))))

    async def adapt(self, client, server: ServerManager) -> None:
        while True:
            await asyncio.sleep(self.args.adapt_interval)
            await self.sample(client, server)

    async def sample(self, client, server: ServerManager) -> None:
        """Read the gauges, decide, write a telemetry row (also once at the end)."""
        now = time.monotonic()
        dt, self.last_sample = max(1e-3, now - self.last_sample), now
        try:
            response = await client.get(f"{server.base}/metrics", headers=server.headers, timeout=5)
            metrics = parse_metrics(response.text) if response.status_code == 200 else {}
        except httpx.HTTPError:
            metrics = {}
        if queries := metrics.get("prefix_queries"):
            self.prefix_hit_rate = round(metrics.get("prefix_hits", 0) / queries, 4)
        done = len(self.stats.finished_at)
        rate, page_rate = sum(self.stats.tokens[self.seen:done]) / dt, (done - self.seen) / dt
        self.seen = done
        await self.tick(metrics, rate)
        with open(self.telemetry, "a") as telemetry:
            telemetry.write(json.dumps({
                "t": round(now - self.stats.started, 2), "window": self.limit,
                "in_flight": self.stats.in_flight, "preparing": self.preparing,
                "running": metrics.get("running"), "waiting": metrics.get("waiting"),
                "kv_cache": metrics.get("kv"), "tokens_per_s": round(rate, 1),
                "pages_per_s": round(page_rate, 3), "memory_cap": self.memory_cap(),
                "bound_by": self.samples[-1]}) + "\n")

    async def tick(self, metrics: dict, rate: float) -> None:
        """One decision; a queue is "long" only when as many wait as run."""
        limit, cap = self.limit, self.memory_cap()
        waiting, running, kv = metrics.get("waiting"), metrics.get("running") or 0, \
            metrics.get("kv") or 0
        long_queue = waiting is not None and waiting > max(4, running)
        some_queue = waiting is not None and waiting > max(2, running / 4)
        full = self.stats.in_flight >= limit * 0.9
        if self.input_done:
            verdict = "tail"  # the last pages draining: says nothing about the steady state
        elif not self.stats.finished_at:
            verdict = "start"  # the first pages still on their way: nor does the filling
        elif some_queue or kv > 0.9:
            verdict = "engine"
        elif full and limit >= cap:
            verdict = "memory"
        elif self.preparing >= max(2, self.stats.in_flight // 2):
            verdict = "preprocessing"
        elif not full:
            verdict = "input"
        else:
            verdict = "engine" if waiting is None and rate < self.best_rate * 1.02 else "window"
        self.samples.append(verdict)
        if self.args.concurrency:
            return
        new = limit
        if limit > cap:
            new = cap  # the host-memory budget comes first
        elif long_queue or kv > 0.95:
            new = max(self.args.min_window, int(limit * 0.85))  # over-full: give some back
        elif full and not some_queue and kv <= 0.9 and \
                len(self.stats.finished_at) - self.resized_at >= max(2, limit // 4) and \
                not (self.best_rate and rate < self.best_rate * 0.95):
            # a full window, no queue, answers back through it, tokens/s still rising: widen
            new = min(cap, self.args.max_window, int(math.ceil(limit * 1.5)))
        self.best_rate = max(rate, self.best_rate * RATE_MEMORY)  # an old burst fades
        if new != limit:
            self.resized_at = len(self.stats.finished_at)
            self.resize(new)

    def summary(self) -> dict:
        """The stats; bound_by: the steady state's commonest verdict ("window" only if alone)."""
        steady = [s for s in self.samples if s not in ("start", "tail")]
        bounded = [s for s in steady if s != "window"] or ["engine"]
        bound_by = max(set(bounded), key=bounded.count) if steady else \
            "input" if self.samples else None
        return {"bound_by": bound_by, "window_final": self.limit,
                "memory_budget_bytes": self.budget, "prefix_cache_hit_rate": self.prefix_hit_rate}


RunStats.shape_keys = ("bound_by", "window_final", "memory_budget_bytes", "prefix_cache_hit_rate")
# ==== END SATURATE HELPERS ====
