"""How the run speaks and stops: log lines, exit codes, page and run errors."""

import sys

from blocks.common.secrets import redact_text

EXIT_USAGE, EXIT_DEGENERATE, EXIT_REFUSED, EXIT_NOT_WRITTEN, EXIT_NOT_UPLOADED = 2, 3, 4, 5, 6
EXIT_CODES = """exit codes (the first that applies):
  0    every pending row was written where OUTPUT says (error rows included)
  2    usage error, or a rerun that is refused
  3    degenerate output: the first pages all came back empty or looping (nothing written)
  4    the server or engine refused the run (API key, model gone, engine dead or out of
       memory, every page failing); finished rows kept, a rerun sends the rest
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM; finished rows saved first
  5    some rows were not written (see the log); rerun the same command to finish them
  6    every row is written locally, but some files did not reach the Hub"""


def log(message: str) -> None:
    """Every line this script prints, its secrets masked (redact_text)."""
    print(redact_text(message), file=sys.stderr, flush=True)


def fail(message: str, code: int = EXIT_USAGE) -> "NoReturn":  # noqa: F821
    log(f"error: {message}")
    raise SystemExit(code)


class PageError(Exception):
    """A row that cannot be OCR'd: it becomes an error row, the run goes on."""


class RunAborted(Exception):
    """The run cannot go on (degenerate output, server gone); finished rows are kept."""

    def __init__(self, message: str, code: int = EXIT_NOT_WRITTEN):
        super().__init__(message)
        self.code = code
