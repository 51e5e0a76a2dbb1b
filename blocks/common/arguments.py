"""The command line: the options every script shares, their checks, the argv."""

import argparse
import os
import sys

from blocks.common.errors import EXIT_CODES, fail
from blocks.common.inputs import check_output_outside_input, resolve_output
from blocks.common.model_options import PDF_DPI, REPETITION_DETECTION_ON
from blocks.common.pdf import parse_pages, PDF_MAX_DPI, PDF_MIN_DPI
from blocks.model import add_model_arguments, DEFAULT_MAX_TOKENS, model_argument_problems, MODEL_ID

_RUN_ARGV: list = []  # this run's arguments, one word each (parse_arguments): a rerun's, a Job's


def argument_parser(doc: str, add_shape_arguments) -> argparse.ArgumentParser:
    """Every option of a script: input and output, its shape's (server or engine), the model's.
    No abbreviations: `--hf-tok` must not pass for --hf-token and escape redaction."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1] + "\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="Hub dataset id, or a local folder of images and/or PDFs, "
                        "a .pdf, .parquet or save_to_disk folder")
    parser.add_argument("output", help="Hub dataset id, or a local folder (./name or /path)")
    group = parser.add_argument_group("input")
    group.add_argument("--config", help="dataset config (subset) of a Hub INPUT")
    group.add_argument("--split", default="train", help="split to read (default: train)")
    group.add_argument("--revision", help="Hub INPUT revision (branch, tag or commit)")
    group.add_argument("--image-column", default="image", help="column holding the page image")
    group.add_argument("--max-samples", type=int, help="the first N rows (PDFs: N documents)")
    group.add_argument("--shuffle", action="store_true", help="shuffle rows before --max-samples")
    group.add_argument("--seed", type=int, default=42, help="shuffle seed (default: 42)")
    group.add_argument("--num-shards", type=int, default=1, help="N contiguous ranges, one a Job")
    group.add_argument("--shard-index", type=int, default=0, help="which range this run does")
    group = parser.add_argument_group("PDF input", "each page of a PDF is one row")
    group.add_argument("--pdf-column", help="the column holding PDFs, when not detected")
    group.add_argument("--pages", help="pages of each PDF, 1-based, e.g. 1-5,8,10- (default: all)")
    group.add_argument("--pdf-dpi", type=float, default=PDF_DPI,
                       help=f"render DPI, {PDF_MIN_DPI} to {PDF_MAX_DPI} (default: {PDF_DPI})")
    group.add_argument("--per-document", action="store_true",
                       help="one row per PDF: its pages' texts, each after <!-- page N -->")
    group.add_argument("--text-layer", action="store_true",
                       help="add <column>_text_layer: the text embedded in each PDF page")
    group.add_argument("--skip-text-pages", type=int, metavar="N",
                       help="keep the text layer of a page with N non-space characters, unsent")
    group.add_argument("--pdf-workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                       help="processes rendering PDF pages (default: up to 4)")
    group.add_argument("--pdf-page-timeout", type=float, default=120.0,
                       help="seconds a page may render before it is an error row (default: 120)")
    group = parser.add_argument_group("output")
    group.add_argument("--output-column", default="markdown",
                       help="column for the text, and its diagnostics' prefix (default: markdown)")
    group.add_argument("--overwrite", action="store_true",
                       help="replace result columns that the input already has")
    group.add_argument("--restart", action="store_true",
                       help="delete this shard's rows in OUTPUT and start over")
    group.add_argument("--retry-errors", action="store_true", help="redo every error row")
    group.add_argument("--send-blank", action="store_true",
                       help="send blank pages too (no ink found: by default written with an empty "
                       "text and <column>_skipped saying so, never sent); a rerun with it sends "
                       "the pages an earlier run skipped as blank")
    group.add_argument("--private", action="store_true", help="create the Hub repo private")
    group.add_argument("--hf-token", help="Hub token (default: HF_TOKEN or your login)")
    group.add_argument("--work-dir", help="staging folder for Hub output")
    group.add_argument("--part-rows", type=int, default=250,
                       help="rows per parquet part (default: 250)")
    group.add_argument("--part-seconds", type=float, default=300.0,
                       help="write (and commit) finished rows at least this often (default: 300)")
    group.add_argument("--stats-json", help="write the run's stats as JSON to this path")
    group.add_argument("--check-only", action="store_true",
                       help="check the arguments, INPUT and OUTPUT; write nothing")
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=MODEL_ID, help=f"model id or path (default: {MODEL_ID})")
    group.add_argument("--model-revision", help="sha, tag or branch of the weights")
    group.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                       help=f"generation budget per page (default: {DEFAULT_MAX_TOKENS})")
    group.add_argument("--no-sanity-check", action="store_true",
                       help="do not stop when the first pages all come back degenerate")
    group.add_argument("--sanity-pages", type=int, default=8,
                       help="pages the degenerate-output check looks at (default: 8)")
    group.add_argument("--loop-retries", type=int, default=1,
                       help="send a looping page again, up to N times (default: 1)")
    group.add_argument("--repetition-detection", action=argparse.BooleanOptionalAction,
                       default=REPETITION_DETECTION_ON,
                       help="let vLLM end a loop (it costs engine time)")
    add_shape_arguments(parser)
    add_model_arguments(parser)
    return parser


AT_LEAST = {"num_shards": 1, "part_rows": 1, "max_tokens": 1, "sanity_pages": 1, "max_samples": 1,
            "shard_index": 0, "concurrency": 1, "max_retries": 0, "max_restarts": 0,
            "min_window": 1, "max_window": 1, "api_server_count": 1, "batch_size": 1,
            "skip_text_pages": 1, "pdf_workers": 1, "loop_retries": 0}
ABOVE_0 = ("part_seconds", "server_timeout", "server_down_timeout", "request_timeout",
           "adapt_interval", "max_inflight_memory", "pdf_page_timeout")


def argument_word(action: argparse.Action, value) -> str:
    """A parsed argument as one word: a value, a flag (--x, or --no-x), --option=value."""
    if not action.option_strings:  # a path given after `--` as it starts like an option: ./-x
        return f"./{value}" if str(value).startswith("-") else str(value)
    if action.nargs == 0:
        return action.option_strings[-1 if value is False else 0]
    return f"{action.option_strings[0]}={value}"


def parse_arguments(doc: str, argv: list[str] | None, add_shape_arguments, shape_problems):
    """The run's argv (default: the command line's) parsed, then every argument checked before
    anything is read, started or created; the shape's own options by shape_problems(args)."""
    parser = argument_parser(doc, add_shape_arguments)
    words, argv = list(sys.argv[1:] if argv is None else argv), []
    while words:  # --serve-args "--enforce-eager": one flag as the value (argparse wants =)
        argv.append(words.pop(0))
        if argv[-1] in parser._option_string_actions.keys() & {"--serve-args"} and words and \
                words[0].startswith("-"):
            argv[-1] += "=" + words.pop(0)

    def error(message: str) -> "NoReturn":  # noqa: F821  (through log: argparse echoes values)
        parser.print_usage(sys.stderr)
        fail(message)

    parser.error = error
    args = parser.parse_args(argv)
    for action in parser._actions:  # parsed again without defaults: only the arguments given,
        action.default = argparse.SUPPRESS  # INPUT and OUTPUT, then the options in their order
    actions = {action.dest: action for action in parser._actions}
    parsed = vars(parser.parse_args(argv))
    _RUN_ARGV[:] = [argument_word(actions[dest], parsed[dest]) for dest in
                    sorted(parsed, key=lambda dest: bool(actions[dest].option_strings))]
    given = {name: value for name, value in vars(args).items() if value is not None}
    problems = [f"--{name.replace('_', '-')} must be at least {low}, got {given[name]}"
                for name, low in AT_LEAST.items() if name in given and given[name] < low]
    problems += [f"--{name.replace('_', '-')} must be above 0, got {given[name]}"
                 for name in ABOVE_0 if name in given and not given[name] > 0]
    if args.shuffle and args.seed < 0:
        problems.append(f"--seed must be at least 0 to --shuffle, got {args.seed}")
    if not args.output_column.strip():
        problems.append("--output-column must name a column, got an empty name")
    if args.loop_retries > 5:
        problems.append(f"--loop-retries must be at most 5, got {args.loop_retries}")
    if not PDF_MIN_DPI <= args.pdf_dpi <= PDF_MAX_DPI:
        problems.append(f"--pdf-dpi must be {PDF_MIN_DPI} to {PDF_MAX_DPI}, got {args.pdf_dpi:g}")
    try:
        parse_pages(args.pages)
    except ValueError as exc:
        problems.append(str(exc))
    if args.num_shards >= 1 and not 0 <= args.shard_index < args.num_shards:
        problems.append(f"--shard-index must be in [0, {args.num_shards}) for --num-shards "
                        f"{args.num_shards}, got {args.shard_index}")
    problems += shape_problems(args) + model_argument_problems(args)
    if problems:
        fail("; ".join(problems) + ".")
    resolve_output(args.output)  # exits 2 saying how to write a local path
    check_output_outside_input(args)
    return args
