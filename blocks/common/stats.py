"""The run's figures: pages, rates, memory; for --stats-json and the card."""

import contextlib
import json
import re
import resource
import time
from pathlib import Path

from blocks.common.errors import log

def proc_bytes(path: str, key: str) -> int | None:
    """A "key: N kB" line of a /proc file (Linux), in bytes; None without it."""
    with contextlib.suppress(OSError, TypeError):  # no such file, or no such line
        return int(re.search(rf"^{key}:\s*(\d+)", Path(path).read_text(), re.M)[1]) * 1024
    return None


def peak_rss_bytes() -> int:
    """Peak resident memory: /proc's VmHWM (ru_maxrss counts the parent's too, before exec)."""
    return proc_bytes("/proc/self/status", "VmHWM") or \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RunStats:
    shape_keys: tuple = ()  # a shape's own keys (the saturate block's): null until it sets them

    def __init__(self, rows_total: int, rows_skipped: int):
        self.started, self.first_started = time.monotonic(), None  # first: a page went in
        self.rows_total, self.rows_skipped = rows_total, rows_skipped
        self.rows_ok = self.rows_failed = 0  # rows written, error rows included (by the writer)
        self.rows_text_layer = 0  # rows written from their PDF text layer, not sent
        self.rows_blank = 0  # of rows_ok: blank pages, not sent (an empty text)
        self.rows_recovered = 0  # rows written from a killed run's journal
        self.errors_seen = self.in_flight = self.peak_in_flight = 0
        self.loop_retried = self.still_looping = 0
        self.latencies, self.finished_at, self.tokens = [], [], []
        self.server_startup_s = self.vllm_version = None
        self.extra: dict = {}

    def enter(self) -> None:
        self.first_started = self.first_started or time.monotonic()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1

    def as_dict(self) -> dict:
        elapsed, done, ordered = time.monotonic() - self.started, len(self.finished_at), \
            sorted(self.latencies)
        active = done and self.first_started and self.finished_at[-1] - self.first_started
        a, b = done // 10, done - done // 10 - 1  # the middle 80%: no start-up, no tail
        span = done >= 2 and self.finished_at[b] - self.finished_at[a]

        def rounded(value, digits=4):
            return round(value, digits) if value else None

        return {
            "rows_total": self.rows_total, "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed, "rows_skipped": self.rows_skipped,
            "rows_text_layer": self.rows_text_layer, "rows_blank": self.rows_blank,
            "rows_not_written": self.rows_total - self.rows_ok - self.rows_failed
            - self.rows_skipped - self.rows_text_layer, "rows_recovered": self.rows_recovered,
            "elapsed_s": round(elapsed, 3), "active_s": rounded(active, 3),
            "pages_per_s": round(done / elapsed, 4) if elapsed > 0 else None,
            "pages_per_s_steady": rounded(span and (b - a) / span),
            "completion_tokens_per_s": rounded(span and sum(self.tokens[a + 1:b + 1]) / span, 2),
            "latency_p50_s": rounded(ordered and ordered[int(0.5 * len(ordered))]),
            "latency_p95_s": rounded(ordered and ordered[int(0.95 * len(ordered))]),
            # Little's law: how full the driver kept the server, whatever the server's speed
            "mean_in_flight": rounded(active and sum(ordered) / active, 2),
            "peak_in_flight": self.peak_in_flight,
            "pages_loop_retried": self.loop_retried, "pages_still_looping": self.still_looping,
            "peak_rss_bytes": peak_rss_bytes(),
            "server_startup_s": self.server_startup_s, "vllm_version": self.vllm_version,
            **dict.fromkeys(self.shape_keys), **self.extra,
        }


def write_stats(stats: dict, args) -> None:
    """--stats-json; a file that cannot be written is a warning with the stats in the log."""
    if args.stats_json:
        path = Path(args.stats_json).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stats, indent=2))
        except OSError as exc:
            log(f"warning: cannot write --stats-json {args.stats_json} ({exc.strerror or exc}); "
                f"the stats: {json.dumps(stats)}")
