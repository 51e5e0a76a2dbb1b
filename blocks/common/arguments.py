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
_IDENTITY: dict = {}  # each option's dest: whether option() declared it part of the run's identity
_THIS_MACHINE: set = set()  # the flags option() declared this machine's: not in a Job's command
_GIVEN: set = set()  # the dests of the options the command line gave (not defaults)


def option(group, *flags, identity: bool, this_machine: bool = False, at_least=None, above=None,
           **kwargs) -> argparse.Action:
    """add_argument, saying if the option is part of the run's identity, if it is about this
    machine only (a Job's command leaves it out); at_least, above: bounds."""
    action = group.add_argument(*flags, **kwargs)
    action.identity, action.this_machine = identity, this_machine
    action.at_least, action.above = at_least, above
    return action


def argument_parser(doc: str, add_shape_arguments) -> argparse.ArgumentParser:
    """Every option of a script; no abbreviations: `--hf-tok` would escape redaction."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1] + "\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    option(parser, "input", identity=False, help="Hub dataset id, or a local folder of images "
           "and/or PDFs, a .pdf, .parquet or save_to_disk folder")  # input_identity says it
    option(parser, "output", identity=False, help="Hub dataset id or local folder (./name, /path)")
    group = parser.add_argument_group("input")
    option(group, "--config", identity=True, help="dataset config (subset) of a Hub INPUT")
    option(group, "--split", identity=True, default="train", help="split to read (default: train)")
    option(group, "--revision", identity=False, help="Hub INPUT revision (branch, tag or commit)")
    option(group, "--image-column", identity=True, default="image", help="the page image's column")
    option(group, "--max-samples", type=int, at_least=1, identity=False,
           help="the first N rows (PDFs: N documents)")
    option(group, "--shuffle", identity=True, action="store_true",
           help="shuffle rows before --max-samples")
    option(group, "--seed", identity=True, type=int, default=42, help="shuffle seed (default: 42)")
    option(group, "--num-shards", identity=True, type=int, at_least=1, default=1,
           help="N contiguous ranges, one a Job")
    option(group, "--shard-index", type=int, at_least=0, default=0, identity=False,
           help="which range this run does")
    group = parser.add_argument_group("PDF input", "each page of a PDF is one row")
    option(group, "--pdf-column", identity=True, help="the column holding PDFs, when not detected")
    option(group, "--pages", identity=True,
           help="pages of each PDF, 1-based, e.g. 1-5,8,10- (default: all)")
    option(group, "--pdf-dpi", type=float, default=PDF_DPI, identity=True,
           help=f"render DPI, {PDF_MIN_DPI} to {PDF_MAX_DPI} (default: {PDF_DPI})")
    option(group, "--per-document", action="store_true", identity=True,
           help="one row per PDF: its pages' texts, each after <!-- page N -->")
    option(group, "--text-layer", action="store_true", identity=True,
           help="add <column>_text_layer: the text embedded in each PDF page")
    option(group, "--skip-text-pages", type=int, at_least=1, metavar="N", identity=True,
           help="keep the text layer of a page with N non-space characters, unsent")
    option(group, "--pdf-workers", type=int, at_least=1, default=min(4, os.cpu_count() or 1),
           identity=False, help="processes rendering PDF pages (default: up to 4)")
    option(group, "--pdf-page-timeout", type=float, above=0, default=120.0, identity=False,
           help="seconds a page may render before it is an error row (default: 120)")
    group = parser.add_argument_group("output")
    option(group, "--output-column", default="markdown", identity=True,
           help="column for the text, and its diagnostics' prefix (default: markdown)")
    option(group, "--overwrite", action="store_true", identity=False,
           help="replace result columns that the input already has")
    option(group, "--restart", action="store_true", identity=False, this_machine=True,
           help="delete this shard's rows in OUTPUT and start over")
    option(group, "--retry-errors", action="store_true", identity=False, help="redo the error rows")
    option(group, "--send-blank", action="store_true", identity=False,
           help="send blank pages too (by default written unsent: an empty text, <column>_skipped "
           "says so); a rerun with it sends the pages an earlier run skipped as blank")
    option(group, "--private", action="store_true", identity=False, help="create the repo private")
    option(group, "--hf-token", identity=False, help="Hub token (default: HF_TOKEN or your login)")
    option(group, "--work-dir", identity=False, this_machine=True,
           help="staging folder for Hub output")
    option(group, "--part-rows", type=int, at_least=1, default=250, identity=False,
           help="rows per parquet part (default: 250)")
    option(group, "--part-seconds", type=float, above=0, default=300.0, identity=False,
           help="write (and commit) finished rows at least this often (default: 300)")
    option(group, "--stats-json", identity=False, this_machine=True,
           help="write the run's stats as JSON to this path")
    option(group, "--check-only", action="store_true", identity=False,
           help="check the arguments, INPUT and OUTPUT; write nothing")
    group = parser.add_argument_group("model")
    option(group, "--model", default=MODEL_ID, identity=True,
           help=f"model id or path (default: {MODEL_ID})")
    option(group, "--model-revision", identity=True, help="sha, tag or branch of the weights")
    option(group, "--max-tokens", type=int, at_least=1, default=DEFAULT_MAX_TOKENS, identity=True,
           help=f"generation budget per page (default: {DEFAULT_MAX_TOKENS})")
    option(group, "--no-sanity-check", action="store_true", identity=False,
           help="do not stop when the first pages all come back degenerate")
    option(group, "--sanity-pages", type=int, at_least=1, default=8, identity=False,
           help="pages the degenerate-output check looks at (default: 8)")
    option(group, "--loop-retries", type=int, at_least=0, default=1, identity=False,  # settings
           help="send a looping page again, up to N times (default: 1)")
    option(group, "--repetition-detection", action=argparse.BooleanOptionalAction, identity=True,
           default=REPETITION_DETECTION_ON, help="let vLLM end a loop (it costs engine time)")
    add_shape_arguments(parser)
    add_model_arguments(parser)
    return parser


def was_given(dest: str) -> bool:
    """Whether the command line gave this option, rather than its default taking its place."""
    return dest in _GIVEN


def argument_word(action: argparse.Action, value) -> str:
    """A parsed argument as one word: a value, a flag (--x, or --no-x), --option=value."""
    if not action.option_strings:  # a path given after `--` as it starts like an option: ./-x
        return f"./{value}" if str(value).startswith("-") else str(value)
    if action.nargs == 0:
        return action.option_strings[-1 if value is False else 0]
    return f"{action.option_strings[0]}={value}"


def parse_arguments(doc: str, argv: list[str] | None, add_shape_arguments, shape_problems):
    """argv parsed and every argument checked before anything is read, started or created."""
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
    _IDENTITY.update({dest: actions[dest].identity for dest in vars(args)})  # each declared
    _THIS_MACHINE.update(flag for action in parser._actions if getattr(action, "this_machine", 0)
                         for flag in action.option_strings)
    parsed = vars(parser.parse_args(argv))
    _GIVEN.update(parsed)
    _RUN_ARGV[:] = [argument_word(actions[dest], parsed[dest]) for dest in
                    sorted(parsed, key=lambda dest: bool(actions[dest].option_strings))]
    given = [(actions[dest], value) for dest, value in vars(args).items() if value is not None]
    problems = [f"{a.option_strings[0]} must be at least {a.at_least}, got {value}"
                for a, value in given if a.at_least is not None and value < a.at_least]
    problems += [f"{a.option_strings[0]} must be above {a.above}, got {value}"
                 for a, value in given if a.above is not None and not value > a.above]
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
