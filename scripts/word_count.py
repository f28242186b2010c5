"""Words of a chapter: markdown cells and figure captions (mystnb metadata), exercises excluded.

A word is a whitespace-separated token holding at least one letter or digit (math and MyST
roles count as they stand). Exercise blocks (```{exercise} ... ```) and solutions
({solution-start} ... {solution-end}) are dropped, and so is everything after a
"## Exercises" heading in the same cell. How long a chapter reads (issue 44: a chapter a student
reads in 30 minutes).

    python scripts/word_count.py book/08_experiments.ipynb book/11_transformers.ipynb
"""

from __future__ import annotations

import json
import re
import sys

WORD = re.compile(r"[A-Za-z0-9]")


def prose(nb):
    in_solution = False
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if "{solution-start}" in src:
                in_solution = True
            if in_solution:
                if "{solution-end}" in src:
                    in_solution = False
                    src = src.split("{solution-end}", 1)[1].split("```", 1)[-1]
                else:
                    continue
            src = re.sub(r"```\{exercise\}.*?\n```", " ", src, flags=re.S)
            src = src.split("## Exercises")[0]
            yield src
        caption = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("caption")
        if caption:
            yield caption


def words(path):
    with open(path) as f:
        nb = json.load(f)
    return sum(1 for text in prose(nb) for tok in text.split() if WORD.search(tok))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"{words(p):6d}  {p}")
