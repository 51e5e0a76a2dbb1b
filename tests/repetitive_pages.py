"""Pages that legitimately repeat, which repetition detection must never cut (issue #29, item 2).

Written for this project from the shapes real documents hold (no page copied): blank forms and
tables in Markdown and in HTML (OvisOCR2 and DeepSeek-OCR write HTML tables) up to 60
identical rows, separator rows, LaTeX arrays and matrices, dot leaders, numbered blank lines,
ruled lines, columns of numbers, repeated running headers. The longest run of one repeated unit
here is 60 (rows, or characters in a run).

A tokenizer-independent check: each page is turned into token ids three ways, the two extremes
and one between (one token per character: the worst case for character runs; one per tag,
word or punctuation mark; one per line: the worst case for rows), and every prefix of each
(the engine checks after every generated token) goes through vLLM's own
`check_sequence_repetition`. Run as a script in the engine's environment:
`python repetitive_pages.py P C [P C ...]` prints, as JSON, the pages each (P, C) cuts and the
smallest C that cuts none.
"""

from __future__ import annotations

import json
import re
import sys

ROWS = 60  # the most identical rows a page here holds


def _table(columns: int, rows: int, header: list[str]) -> str:
    head = "| " + " | ".join(header) + " |\n| " + " | ".join(["---"] * columns) + " |\n"
    return head + ("|" + "  |" * columns + "\n") * rows


PAGES = {
    "markdown blank form, 60 empty rows": "# Register of visitors\n\n" + _table(
        4, ROWS, ["Date", "Name", "Company", "Signature"]),
    "markdown one-column blank table": _table(1, ROWS, ["Notes"]),
    "html blank form, 60 empty rows (one line)": "<table><tr><td>Item</td><td>Qty</td>"
        "<td>Price</td></tr>" + "<tr><td></td><td></td><td></td></tr>" * ROWS + "</table>",
    "html blank form, 60 empty rows (a row a line)": "<table>\n<tr><th>No.</th><th>Entry</th>"
        "</tr>\n" + "<tr><td></td><td></td></tr>\n" * ROWS + "</table>",
    "html row of 24 empty cells": "<table><tr>" + "<td></td>" * 24 + "</tr></table>",
    "separator row, 16 columns": "| " + " | ".join(f"c{i}" for i in range(16)) + " |\n|"
        + "---|" * 16 + "\n|" + "|".join(str(i) for i in range(16)) + "|",
    "separator row, aligned wide cells": "| Name | Value |\n|:" + "-" * 58 + ":|:" + "-" * 58
        + ":|\n| a | 1 |",
    "latex array": "$$\\left[\\begin{array}{" + "c" * 24 + "}\n" + " & ".join(
        f"a_{{{i}}}" for i in range(24)) + "\\end{array}\\right]$$",
    "latex zero matrix 12x12": "$$\\begin{pmatrix}\n" + (" & ".join(["0"] * 12) + " \\\\\n")
        * 12 + "\\end{pmatrix}$$",
    "latex identity matrix 10x10": "$$\\begin{bmatrix}\n" + "".join(
        " & ".join("1" if i == j else "0" for j in range(10)) + " \\\\\n" for i in range(10))
        + "\\end{bmatrix}$$",
    "dot leaders, 60 dots": "# Contents\n\n" + "".join(
        f"{title} {'.' * (60 - len(title))} {page}\n"
        for title, page in [("Introduction", 1), ("Methods", 7), ("Results", 19),
                            ("Discussion", 31), ("References", 44)]),
    "spaced dot leaders": "".join(f"Chapter {i} " + ". " * 30 + f"{i * 9}\n" for i in range(1, 9)),
    "numbered blank lines": "".join(f"{i}. {'_' * 40}\n" for i in range(1, 41)),
    "ruled lines, 60 characters": "Comments:\n\n" + ("_" * ROWS + "\n") * 20,
    "ruled dashes and equals": "=" * ROWS + "\nTOTAL\n" + "-" * ROWS + "\n",
    "column of zeros": "| Account | Balance |\n| --- | --- |\n" + "| 0 | 0.00 |\n" * ROWS,
    "column of numbers": "\n".join(f"{i:>6}" for i in range(1000, 1000 + ROWS)),
    "repeated running headers": "".join(
        f"JOURNAL OF APPLIED STUDIES — VOL. 12\n\nParagraph {i} of the article, with its own "
        f"words about item {i}.\n\n" for i in range(6)),
    "blank lines between fields": "Name:\n\n\n\nAddress:\n\n\n\nPhone:\n\n\n\n",
}

TOKENIZERS = {
    "a token per character": lambda text: [ord(c) for c in text],
    "a token per tag, word or mark": lambda text: re.findall(r"<[^>]+>|\w+|\s+|[^\w\s]", text),
    "a token per line": lambda text: text.splitlines(keepends=True),
}


def token_ids(tokens: list) -> list[int]:
    ids: dict = {}
    return [ids.setdefault(t, len(ids)) for t in tokens]


def cut_at(ids: list[int], params, check) -> int | None:
    """The number of tokens after which the engine would end this page, or None."""
    for n in range(1, len(ids) + 1):
        if check(ids[:n], params):
            return n
    return None


def main(argv: list[str]) -> dict:
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition

    numbers = [int(a) for a in argv]
    report = {}
    for p, c in zip(numbers[::2], numbers[1::2]):
        cut = {}
        least = 2  # the smallest C that cuts no page at this P
        for page, text in PAGES.items():
            for name, tokenize in TOKENIZERS.items():
                ids = token_ids(tokenize(text))
                at = cut_at(ids, RepetitionDetectionParams(max_pattern_size=p, min_count=c),
                            check_sequence_repetition)
                if at is not None:
                    cut[f"{page} / {name}"] = at
                while cut_at(ids, RepetitionDetectionParams(max_pattern_size=p, min_count=least),
                             check_sequence_repetition) is not None:
                    least += 1
        report[f"{p}:{c}"] = {"cut": cut, "least_safe_min_count": least}
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
