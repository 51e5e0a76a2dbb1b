"""One run from start to end: interrupts, the output opened, steps, exit code."""

import argparse
import contextlib
import json
import os
import signal
import threading
import time

from blocks.common.arguments import _RUN_ARGV
from blocks.common.card import build_card
from blocks.common.errors import (
    EXIT_NOT_UPLOADED, EXIT_NOT_WRITTEN, EXIT_USAGE, fail, log, RunAborted,
)
from blocks.common.inputs import check_output_columns, open_input, resolve_output
from blocks.common.jobs_command import rerun_advice
from blocks.common.loops import DegenerateCheck
from blocks.common.manifest import claim_output, pinned_input, run_digest, run_identity
from blocks.common.pdf import _RENDERER, PdfRenderer
from blocks.common.plan import plan_rows
from blocks.common.saving import output_features, PartWriter
from blocks.common.secrets import redact_argv
from blocks.common.stats import RunStats, write_stats
from blocks.common.store import OutputStore

class Interrupts:
    """SIGINT and SIGTERM (a cancelled Job) stop the run as KeyboardInterrupt, but never while
    the finished rows are saved: a signal then waits for them (the run stops once they are)."""

    def __init__(self):
        self.signum, self.saving = None, False
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
        raise KeyboardInterrupt

    def exit_code(self) -> int:  # 130 for SIGINT, 143 for SIGTERM
        return 128 + int(self.signum or signal.SIGINT)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def open_output(args, hub_api) -> OutputStore:
    """The output and its lock; a Hub that refuses or fails is one line, exit 5."""
    try:
        store = OutputStore(args.output, args, hub_api)
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
    return store


def run_script(args, hub_api, engine: dict, info_entry: dict, ready, work,
               stop_engine=lambda force: None) -> int:
    """Either shape's run: ready(check_only), the output, input and manifest (--check-only stops
    there), then work(run). Whatever ends it, the finished rows are saved (signals wait), the
    engine stopped, then the card, the stats (every exit's) and an exit code telling the truth."""
    interrupts, code, run, store = Interrupts(), None, None, None
    try:
        ready(args.check_only)
        store = open_output(args, hub_api)
        source = open_input(pinned_input(store, args))  # at the revision OUTPUT's run read
        check_output_columns(source, args)
        store.shard_range = (source.lo, source.hi)
        identity = run_identity(args, source, engine)
        if not args.check_only:  # a read-only store: claim_output compares, records nothing
            store.drop_stale_staged_parts()
        claim_output(store, identity, args, source.pdf)
        if args.check_only:  # the last stdout line is JSON: every shard's rows (PDF pages)
            n = len(source.dataset)
            rows = n if source.pdf is None or source.pdf.per_document else source.pdf.first_row(n)
            revision = identity["input"].get("revision")
            log(f"check passed: {rows} rows -> {store.location()}; nothing was written")
            secret: list = []  # the options holding a secret (the launcher keeps them out of Jobs)
            redact_argv(_RUN_ARGV, None, secret)
            run = run_digest(json.loads(json.dumps(identity)), args)  # as the manifest reads
            print(json.dumps({"rows": rows, "run": run,
                              **({"input_revision": revision} if revision else {}),
                              **({"secret_options": secret} if secret else {})}))
            return 0
        plan = plan_rows(source, store, args)
        store.resend_local_parts()
        stats = RunStats(rows_total=source.hi - source.lo, rows_skipped=plan.skipped)
        stats.rows_recovered = len(plan.recovered)
        check = DegenerateCheck(not args.no_sanity_check and not plan.earlier_ok,
                                args.sanity_pages, plan.send)
        info_entry["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        writer = PartWriter(store, source, plan, output_features(source, args), info_entry,
                            check, args)
        run = argparse.Namespace(args=args, store=store, source=source, plan=plan, stats=stats,
                                 writer=writer, check=check, info_entry=info_entry)
        log(f"{len(plan.pending)} of {stats.rows_total} rows to do, {len(plan.send)} pages to "
            f"send ({stats.rows_skipped} already done, {len(plan.recovered)} recovered from the "
            f"journal; {len(plan.redo)} error rows redone) -> {store.location()}")
        if source.pdf is not None and plan.send:
            _RENDERER[:] = [PdfRenderer(source.pdf, args)]  # forked before the driver's threads
        for result in plan.recovered.values():  # journaled by a killed run: judged first
            if result.error is None and result.skipped is None:
                check.observe(result)
        if plan.send:
            work(run)
        code = 0
    except SystemExit as exc:  # fail() said why; inside the run, its finished rows are saved
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if run is None:
            raise
    except RunAborted as exc:
        log(f"error: {exc}")
        code = exc.code
    except KeyboardInterrupt:
        log("interrupted" + (": saving the finished rows" if run else " before any page was sent"))
        code = interrupts.exit_code()
    except Exception as exc:
        code = EXIT_NOT_WRITTEN
        if run is None and isinstance(exc, OSError):  # a full or read-only disk, say
            log(f"error: cannot write to OUTPUT {args.output}: {exc}. Nothing was sent; free "
                f"space (or choose another OUTPUT), then rerun the same command.")
        else:  # a bug or an unforeseen failure: keep what is finished, then say what
            import traceback
            traceback.print_exc()
            log("error: the run failed" + ("; saving the finished rows" if run else ""))
    finally:
        if run is None:  # refused, nothing to do, or a failure: no trace of this run
            interrupts.restore()
            if store is not None:
                store.abandon()
            if code is not None and not args.check_only:  # the keys of every run's stats
                write_stats({**RunStats(0, 0).as_dict(), "exit_code": code}, args)
    if run is None:
        return code
    interrupts.saving = True  # from here a signal waits for the finished rows to be saved
    try:
        check.finish()
    except RunAborted as exc:
        log(f"error: {exc}")
        code = code or exc.code
    if check.tripped:
        store.journal.close(discard=True)
        log("the pages finished so far are all degenerate: nothing is written")
    else:
        writer.flush(final=True)
        store.journal.close()
    if interrupts.signum and not code:  # a signal while the rows were saved
        code = interrupts.exit_code()
    pages = sum(map(len, writer.open_documents.values()))
    if code and not check.tripped and (writer.rows_ok + writer.rows_failed or pages):
        pages = f" (and {pages} pages of unfinished documents)" if pages else ""
        log(f"saved: {writer.rows_ok + writer.rows_failed} finished rows{pages} are in "
            f"{store.location()}; to resume, {rerun_advice()}")
    interrupts.saving = False  # saved: a signal now stops the engine at once, or the last commit
    try:
        stop_engine(False)
    except KeyboardInterrupt:
        stop_engine(True)
        interrupts.saving = False
    while _RENDERER:
        _RENDERER.pop().close()
    stats.rows_ok, stats.rows_failed = writer.rows_ok - writer.rows_text_layer, writer.rows_failed
    stats.rows_text_layer, stats.rows_blank = writer.rows_text_layer, writer.rows_blank
    result = stats.as_dict()
    if result["rows_not_written"] and not code:
        code = EXIT_NOT_WRITTEN
        log(f"error: {result['rows_not_written']} row(s) were not written"
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
        store.finish((lambda: build_card(source, store, args, result, info_entry))
                     if (wrote or card_missing) and not check.tripped else None)
    except (KeyboardInterrupt, OSError) as exc:  # the rows are saved: a rerun ends the output
        stopped = isinstance(exc, KeyboardInterrupt)
        code = code or (interrupts.exit_code() if stopped else
                        EXIT_NOT_UPLOADED if store.api is not None else EXIT_NOT_WRITTEN)
        log(f"{'interrupted' if stopped else f'error: {exc}'} before the card and the last "
            f"commit; the finished rows are in {store.root}: to finish, {rerun_advice()}")
    if not code:
        code = EXIT_USAGE if store.conflict else EXIT_NOT_UPLOADED if store.upload_failures else 0
    result["exit_code"] = code
    write_stats(result, args)
    text_layer = f"{result['rows_text_layer']} from their text layer, " \
        if result["rows_text_layer"] else ""
    blank = f" ({result['rows_blank']} blank, not sent)" if result["rows_blank"] else ""
    log(f"done: {result['rows_ok']} ok{blank}, {result['rows_failed']} failed, {text_layer}"
        f"{result['rows_skipped']} skipped, {result['rows_not_written']} not written in "
        f"{result['elapsed_s']:.1f} s ({result['pages_per_s'] or 0:.2f} pages/s) -> "
        f"{store.location()} (exit {code})")
    interrupts.restore()
    return code
