"""The OFFLINE MAIN block: main() of the offline scripts, the run step by step.

Edit here, then run `python tools/sync_helpers.py`: it copies the block (from its BEGIN
line on) into the scripts that carry it, right after their model section.
"""

import json

from blocks.common.arguments import _RUN_ARGV, parse_arguments
from blocks.common.inputs import resolved_revision
from blocks.common.manifest import check_context_budget, inference_info_entry
from blocks.common.run import (
    any_stop_said, claim_run_output, finish_run, open_output_and_input, plan_run, report_check,
    Run, save_rows, write_card,
)
from blocks.common.secrets import redact_value
from blocks.model import LLM_KWARGS, MAX_MODEL_LEN
from blocks.offline import (
    add_offline_arguments, effective_llm_kwargs, ensure_vllm, offline_argument_problems,
    run_offline,
)

# ==== BEGIN OFFLINE MAIN (edit blocks/main_offline.py, then run tools/sync_helpers.py) ====
def main(argv: list[str] | None = None, hub_api=None) -> int:
    """One run, step by step in the failure policy's order: every check before a side effect."""
    args = parse_arguments(__doc__, argv, add_offline_arguments, offline_argument_problems)
    run = Run(args, engine={}, info_entry={})  # both filled once vllm is here
    with any_stop_said(run):  # what stops a step is said, and is the exit code
        asked = {**LLM_KWARGS, **json.loads(args.llm_kwargs or "{}")}.get("max_model_len")
        check_context_budget(asked or MAX_MODEL_LEN, args, "max_model_len in --llm-kwargs")
        if not args.check_only:  # vllm importable here, else this script where it is
            ensure_vllm(_RUN_ARGV)
        run.engine = effective_llm_kwargs(args)  # the weights' revision asks the Hub
        run.info_entry = inference_info_entry(args, resolved_revision(args),
                                              llm_kwargs=redact_value(run.engine))
        open_output_and_input(run, hub_api)
        claim_run_output(run)
        if args.check_only:
            return report_check(run)
        plan_run(run)
        if run.plan.send:
            run_offline(run, args, run.engine)  # vllm.LLM started, then the pages in batches
    if run.writer is None:  # stopped before the plan: no trace of this run is left
        return run.exit_code
    save_rows(run)  # whatever stopped the run
    write_card(run)
    return finish_run(run)
# ==== END OFFLINE MAIN ====
