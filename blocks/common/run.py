"""The steps of a run, which main() calls in order: its state, the exits it may take, its end."""

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from blocks.common.arguments import _RUN_ARGV
from blocks.common.card import build_card
from blocks.common.errors import (
    EXIT_NOT_UPLOADED, EXIT_NOT_WRITTEN, EXIT_USAGE, fail, log, RunAborted,
)
from blocks.common.inputs import check_output_columns, InputSource, open_input, resolve_output
from blocks.common.jobs_command import rerun_advice
from blocks.common.loops import DegenerateCheck
from blocks.common.manifest import claim_output, pinned_input, run_digest, run_identity
from blocks.common.pdf import PdfRenderer
from blocks.common.plan import plan_rows, RowPlan
from blocks.common.saving import output_features, PartWriter
from blocks.common.secrets import redact_argv
from blocks.common.stats import RunStats, write_stats
from blocks.common.store import OutputStore

class Interrupts:
    """SIGINT and SIGTERM (a cancelled Job) stop the run as KeyboardInterrupt, but never while
    the finished rows are saved: a signal then waits for them (the run stops once they are)."""

    def __init__(self):
        self.signum, self.saving = None, False
        self.task = None  # asyncio.run's task while it runs (run_async): a signal cancels it
        self.previous = {sig: signal.signal(sig, self.on_signal)
                         for sig in (signal.SIGINT, signal.SIGTERM)
                         if threading.current_thread() is threading.main_thread()}

    def on_signal(self, signum, frame) -> None:
        if self.saving:
            self.signum = self.signum or signum
            return log("saving the finished rows first; the run stops once they are on disk")
        while frame and frame.f_code.co_name != "__del__" and \
                not frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            frame = frame.f_back
        if frame:  # a finalizer, whose exception Python ignores (and prints): the signal again
            return threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        self.signum, self.saving = signum, True  # the rows are saved before another one counts
        if self.task is not None and not self.task.done():
            # inside the event loop a KeyboardInterrupt can land in asyncio's or httpx's own
            # bookkeeping and leave a future nobody resolves (seen: an exit that hung for good);
            # the task stops at its next await instead, as asyncio.run does with a Ctrl-C
            self.task.cancel()
            return
        raise KeyboardInterrupt

    def exit_code(self) -> int:  # 130 for SIGINT, 143 for SIGTERM
        return 128 + int(self.signum or signal.SIGINT)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@dataclass
class Run:
    """One run's state, which main()'s steps fill in their order."""
    args: argparse.Namespace
    engine: dict  # the engine's settings: part of the run's identity
    info_entry: dict  # the inference's record, in the card and OUTPUT's info
    interrupts: Interrupts = field(default_factory=Interrupts)  # SIGINT, SIGTERM from here on
    store: OutputStore | None = None
    source: InputSource | None = None
    identity: dict | None = None
    plan: RowPlan | None = None
    stats: RunStats | None = None
    check: DegenerateCheck | None = None
    writer: PartWriter | None = None
    renderer: PdfRenderer | None = None  # PDF input: the processes that render its pages
    result: dict | None = None  # the stats, as written
    exit_code: int | None = None


@contextlib.contextmanager
def any_stop_said(run: Run):
    """What stops the steps inside is said, as the exit code; before plan_run, with no trace of
    the run left but its stats (and fail()'s exit goes on)."""
    try:
        yield
        run.exit_code = 0 if run.writer is not None else None
    except SystemExit as exc:  # fail() said why
        run.exit_code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if run.writer is None:
            raise
    except RunAborted as exc:
        log(f"error: {exc}")
        run.exit_code = exc.code
    except KeyboardInterrupt:
        log("interrupted" + (": saving the finished rows" if run.writer is not None else
                             " before any page was sent"))
        run.exit_code = run.interrupts.exit_code()
    except Exception as exc:
        run.exit_code, started = EXIT_NOT_WRITTEN, run.writer is not None
        if not started and isinstance(exc, OSError):  # a full or read-only disk, say
            log(f"error: cannot write to OUTPUT {run.args.output}: {exc}. Nothing was sent; free "
                f"space (or choose another OUTPUT), then rerun the same command.")
        else:  # a bug or an unforeseen failure: keep what is finished, then say what
            import traceback
            traceback.print_exc()
            log("error: the run failed" + ("; saving the finished rows" if started else ""))
    finally:
        if run.writer is None:  # refused, or only a check: no trace of this run
            run.interrupts.restore()
            if run.store is not None:
                run.store.abandon()
            if run.exit_code is not None and not run.args.check_only:  # every run's stats keys
                write_stats({**RunStats(0, 0).as_dict(), "exit_code": run.exit_code}, run.args)


def open_output_and_input(run: Run, hub_api=None) -> None:
    """OUTPUT and its lock (a Hub's refusal: exit 5), then INPUT as OUTPUT's run read it."""
    args = run.args
    try:
        run.store = store = OutputStore(args.output, args, hub_api)  # hub_api: a test's
    except Exception as exc:
        local_disk = isinstance(exc, OSError) and not isinstance(exc, ConnectionError) \
            and not hasattr(exc, "response")  # HfHubHTTPError is an OSError too
        if local_disk or resolve_output(args.output)[0] != "hub":
            raise
        said = ": ".join([type(exc).__name__, *str(exc).strip().splitlines()[:1]])
        refused = getattr(getattr(exc, "response", None), "status_code", None) in (401, 403, 404)
        fail(f"the Hub {'refused' if refused else 'failed while opening'} OUTPUT {args.output} "
             f"({said}). Nothing was sent; " + ("the token needs write access (HF_TOKEN or "
             "--hf-token) to that namespace." if refused else "rerun once the Hub answers."),
             EXIT_NOT_WRITTEN)
    if args.private and store.api is not None:  # create_repo(exist_ok=True) leaves it as it is
        with contextlib.suppress(Exception):  # only a warning: never a reason to stop
            if store.api.repo_info(store.target, repo_type="dataset").private is False:
                log(f"warning: {store.target} exists and is public: --private applies only to a "
                    f"repo it creates, so this one stays public (make it private in its settings)")
    run.source = open_input(pinned_input(store, args))
    check_output_columns(run.source, args)
    store.shard_range = (run.source.lo, run.source.hi)


def claim_run_output(run: Run) -> None:
    """OUTPUT's manifest records this run, or a rerun is checked to be the same run."""
    run.identity = run_identity(run.args, run.source, run.engine)
    if not run.args.check_only:  # a read-only store: claim_output compares, records nothing
        run.store.drop_stale_staged_parts()
    claim_output(run.store, run.identity, run.args, run.source.pdf)


def report_check(run: Run) -> int:
    """--check-only: the last stdout line is JSON: every shard's rows (PDF pages), the run."""
    source, identity = run.source, run.identity
    n = len(source.dataset)
    rows = n if source.pdf is None or source.pdf.per_document else source.pdf.first_row(n)
    revision = identity["input"].get("revision")
    log(f"check passed: {rows} rows -> {run.store.location()}; nothing was written")
    secret: list = []  # the options holding a secret (the launcher keeps them out of Jobs)
    redact_argv(_RUN_ARGV, None, secret)
    digest = run_digest(json.loads(json.dumps(identity)), run.args)  # as the manifest reads
    print(json.dumps({"rows": rows, "run": digest,
                      **({"input_revision": revision} if revision else {}),
                      **({"secret_options": secret} if secret else {})}))
    return 0


def plan_run(run: Run) -> None:
    """The rows to send and what writes them (PDF: render processes, forked before any thread);
    from here on the finished rows are saved whatever stops the run."""
    args, source, store = run.args, run.source, run.store
    run.plan = plan = plan_rows(source, store, args)
    store.resend_local_parts()
    run.stats = RunStats(rows_total=source.hi - source.lo, rows_skipped=plan.skipped)
    run.stats.rows_recovered = len(plan.recovered)
    run.check = DegenerateCheck(not args.no_sanity_check and not plan.earlier_ok,
                                args.sanity_pages, plan.send)
    run.info_entry["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.writer = PartWriter(store, source, plan, output_features(source, args), run.info_entry,
                            run.check, args)
    log(f"{len(plan.pending)} of {run.stats.rows_total} rows to do, {len(plan.send)} pages to "
        f"send ({plan.skipped} already done, {len(plan.recovered)} recovered from the "
        f"journal; {len(plan.redo)} error rows redone) -> {store.location()}")
    if source.pdf is not None and plan.send:
        run.renderer = PdfRenderer(source.pdf, args)
    for result in plan.recovered.values():  # journaled by a killed run: judged first
        if result.error is None and result.skipped is None:
            run.check.observe(result)


def save_rows(run: Run, stop_engine=lambda force: None) -> None:
    """The finished rows saved (a signal waits), unless all degenerate; then the engine stopped."""
    interrupts, check, writer, store = run.interrupts, run.check, run.writer, run.store
    interrupts.saving = True  # from here a signal waits for the finished rows to be saved
    try:
        check.finish()
    except RunAborted as exc:
        log(f"error: {exc}")
        run.exit_code = run.exit_code or exc.code
    if check.tripped:
        store.journal.close(discard=True)
        log("the pages finished so far are all degenerate: nothing is written")
    else:
        writer.flush(final=True)
        store.journal.close()
    if interrupts.signum and not run.exit_code:  # a signal while the rows were saved
        run.exit_code = interrupts.exit_code()
    pages = sum(map(len, writer.open_documents.values()))
    if run.exit_code and not check.tripped and (writer.rows_ok + writer.rows_failed or pages):
        pages = f" (and {pages} pages of unfinished documents)" if pages else ""
        log(f"saved: {writer.rows_ok + writer.rows_failed} finished rows{pages} are in "
            f"{store.location()}; to resume, {rerun_advice()}")
    interrupts.saving = False  # saved: a signal now stops the engine at once, or the last commit
    try:
        stop_engine(False)
    except KeyboardInterrupt:
        stop_engine(True)
        interrupts.saving = False
    if run.renderer is not None:
        run.renderer.close()


def write_card(run: Run) -> None:
    """The rows counted (one not written: exit 5), then the card and the last commit."""
    stats, writer, store = run.stats, run.writer, run.store
    stats.rows_ok, stats.rows_failed = writer.rows_ok - writer.rows_text_layer, writer.rows_failed
    stats.rows_text_layer, stats.rows_blank = writer.rows_text_layer, writer.rows_blank
    run.result = stats.as_dict()
    if run.result["rows_not_written"] and not run.exit_code:
        run.exit_code = EXIT_NOT_WRITTEN
        log(f"error: {run.result['rows_not_written']} row(s) were not written"
            + (f" ({writer.write_errors[-1]})" if writer.write_errors else "")
            + f"; to finish them, {rerun_advice()}")
    wrote = writer.rows_ok + writer.rows_failed or store.sent_parts
    try:
        if not wrote and not store.parts() and not list(store.journal.folder.glob("*.jsonl")):
            store.forget_run()  # nothing written: the next run may be another one
        if store.api is not None and wrote:  # the card counts what other shards wrote since
            with contextlib.suppress(Exception):  # (else what this run saw)
                store.read_hub(others_only=True)
        card_missing = store.parts() and not (store.card_on_hub if store.api is not None else
                                              (store.root / "README.md").exists())
        store.finish((lambda: build_card(run.source, store, run.args, run.result, run.info_entry))
                     if (wrote or card_missing) and not run.check.tripped else None)
    except (KeyboardInterrupt, OSError) as exc:  # the rows are saved: a rerun ends the output
        stopped = isinstance(exc, KeyboardInterrupt)
        run.exit_code = run.exit_code or (run.interrupts.exit_code() if stopped else
                                          EXIT_NOT_UPLOADED if store.api is not None else
                                          EXIT_NOT_WRITTEN)
        log(f"{'interrupted' if stopped else f'error: {exc}'} before the card and the last "
            f"commit; the finished rows are in {store.root}: to finish, {rerun_advice()}")


def finish_run(run: Run) -> int:
    """The exit code, the stats (every exit's) and the closing line."""
    store, result = run.store, run.result
    code = run.exit_code or (EXIT_USAGE if store.conflict else
                             EXIT_NOT_UPLOADED if store.upload_failures else 0)
    result["exit_code"] = code
    write_stats(result, run.args)
    text_layer = f"{result['rows_text_layer']} from their text layer, " \
        if result["rows_text_layer"] else ""
    blank = f" ({result['rows_blank']} blank, not sent)" if result["rows_blank"] else ""
    log(f"done: {result['rows_ok']} ok{blank}, {result['rows_failed']} failed, {text_layer}"
        f"{result['rows_skipped']} skipped, {result['rows_not_written']} not written in "
        f"{result['elapsed_s']:.1f} s ({result['pages_per_s'] or 0:.2f} pages/s) -> "
        f"{store.location()} (exit {code})")
    run.interrupts.restore()
    return code
