"""The SATURATE MAIN block: main() of the -saturate.py scripts, the run step by step. It is
blocks/main_server.py with the adaptive window (AdaptiveWindow, which also sets a spawned
server's API servers) in place of the fixed one; tests/test_scripts.py holds them so.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it, right after their model section.
"""

from pathlib import Path

from blocks.common.arguments import parse_arguments
from blocks.common.manifest import check_context_budget, inference_info_entry
from blocks.common.run import (
    any_stop_said, claim_run_output, finish_run, open_output_and_input, plan_run, report_check,
    Run, save_rows, write_card,
)
from blocks.common.secrets import redact_argv
from blocks.server.arguments import add_server_arguments, serve_settings
from blocks.saturate import AdaptiveWindow
from blocks.server.pipeline import run_async, run_server_pipeline
from blocks.server.process import ServerManager
from blocks.server.serve_args import (
    effective_serve_args, serve_max_model_len, server_argument_problems,
)

# ==== BEGIN SATURATE MAIN (edit blocks/main_saturate.py, then run tools/sync_helpers.py) ====
def main(argv: list[str] | None = None, hub_api=None) -> int:
    """One run, step by step in the failure policy's order: every check before a side effect."""
    window_type = AdaptiveWindow  # pages in flight: a window that keeps the engine busy
    args = parse_arguments(__doc__, argv, lambda parser: add_server_arguments(parser, window_type),
                           server_argument_problems)
    serve_args = effective_serve_args(args)
    server = ServerManager(args, Path("."), window_type)
    run = Run(args, serve_settings(serve_args),
              inference_info_entry(args, None, serve_args=redact_argv(serve_args)))
    with any_stop_said(run):  # what stops a step is said, and is the exit code
        if args.check_only:  # a Job's own server: its context checked, nothing asked
            check_context_budget(serve_max_model_len(args), args)
        else:  # a server to use or wait for, else `vllm` here to start one
            run_async(server.plan(), run.interrupts)
        open_output_and_input(run, hub_api)
        claim_run_output(run)
        if args.check_only:
            return report_check(run)
        plan_run(run)
        if run.plan.send:  # the server started if planned, then the window kept full
            run_async(run_server_pipeline(run, args, server, window_type(args, run)),
                      run.interrupts)
    if run.writer is None:  # stopped before the plan: no trace of this run is left
        return run.exit_code
    save_rows(run, stop_engine=server.stop)  # whatever stopped the run
    write_card(run)
    return finish_run(run)
# ==== END SATURATE MAIN ====
