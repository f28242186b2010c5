"""No number that a chapter glues is also typed in the prose of any page of the book.

A glued number (``quote("k8-ba", value)`` in a code cell, ``{glue:text}`k8-ba:.2f``` in the
markdown; :mod:`fvlib.plots.text`) is the one this build computed. The same number typed
somewhere else goes stale as soon as the computation moves (a trained number differs in its last
bits between CPUs, a stored experiment grows), so a typed copy is an error.

The glued values are those of the last book build: the ``*.glue.json`` files that myst-nb writes
beside the executed notebooks under ``_build/jupyter_execute``. Each value is formatted as the
pages format it (with every format spec its name is used with, in the book's sources and in the
sources of that build, by myst-nb's own ``format_plain_text``), and the markdown of every page
(glue roles and code removed; math kept) is searched for the same digits, with the same sign.

Which numbers are searched is a trade between copies and coincidences (the book glues about two
hundred numbers, and its prose types settings such as ``tau = 0.6`` everywhere): a number of
three or more significant digits (``1.07``, ``0.0150``) alone; one of two digits (``7.5``,
``35%``) only followed by the word that follows its glue role (``7.5 times``); a bare integer (a
count, a budget, ``K = 5``) or a number of one digit (``0.6``) never. :data:`ALLOWED` lists the
few typed numbers that equal a glued one by coincidence and are not results.

Needs ``_build/jupyter_execute`` (``make book``): without it the test is skipped, except when
the environment variable ``CI`` is set, where it fails.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from myst_nb.core.variables import format_plain_text

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
BUILD = ROOT / "_build"
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

GLUE_TEXT = re.compile(r"\{glue:text\}`([^`]+)`")
GLUE_ANY = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")
FENCED_CODE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"``.+?``|`[^`\n]+`")

#: Words after a glued number that say nothing about what it is (a two-digit number followed by
#: one of them is not searched).
FUNCTION_WORDS = {"and", "or", "to", "at", "of", "in", "on", "for", "from", "with", "than", "against",
                  "by", "as", "is", "are", "the", "a", "an", "when", "where", "while", "but"}

#: Typed numbers that equal a glued one by coincidence and are not results, by page:
#: ``(page, digits): why``. Keep it short; a result typed in prose is never allowed here.
ALLOWED: dict[tuple[str, str], str] = {
    ("book/04_dynamic_programming.ipynb", "1.25"):
        "a noise level of the DP's grid (tau = 1.25) and exact arithmetic (1/2 * 1.5 + 1/2 * 1 = 1.25 bits)",
}


def _pages(root: Path) -> list[Path]:
    """The book's pages (markdown files and notebooks under ``book/``), build folders left out."""
    skip = {"_build", ".fvlib_runs", ".ipynb_checkpoints"}
    return sorted(p for p in root.rglob("*") if p.suffix in (".md", ".ipynb") and not skip & set(p.parts))


def _markdown(path: Path) -> str:
    """The markdown of a page: the whole file, or a notebook's markdown cells."""
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def _built_sources(build: Path) -> list[Path]:
    """The sources of the last build as Sphinx copied them (``.ipynb.txt``, ``.md.txt``)."""
    return sorted((build / "html" / "_sources").rglob("*.txt")) if (build / "html" / "_sources").is_dir() else []


def glue_formats(texts: list[str]) -> dict[str, set[tuple[str, str]]]:
    """``{name: {(format spec, next word), ...}}`` of every ``{glue:text}`name:spec``` role in
    ``texts``; the next word is the one that follows the role (``"times"``), or ``""``."""
    formats: dict[str, set[tuple[str, str]]] = {}
    for text in texts:
        for match in GLUE_TEXT.finditer(text):
            role = match.group(1)
            key, _, spec = role.rpartition(":") if ":" in role else (role, "", "")
            after = re.match(r"[ \t]*([A-Za-z][A-Za-z-]*)", text[match.end():])
            formats.setdefault(key.split("::")[-1], set()).add((spec, after.group(1) if after else ""))
    return formats


def glued_values(execute_dir: Path) -> dict[str, str]:
    """``{name: text/plain}`` of every glued value in the ``*.glue.json`` files under ``execute_dir``."""
    values = {}
    for path in sorted(execute_dir.rglob("*.glue.json")):
        for name, output in json.loads(path.read_text(encoding="utf-8")).items():
            plain = next((v for k, v in output.get("data", {}).items() if k.endswith("text/plain")), None)
            if plain is not None:
                values[name] = "".join(plain) if isinstance(plain, list) else plain
    return values


def significant_digits(digits: str) -> int:
    """The significant digits of a number as written: ``"0.0150"`` 3, ``"7.5"`` 2, ``"10%"`` 1."""
    mantissa = digits.rstrip("%").replace(",", "")
    if "." not in mantissa:
        mantissa = mantissa.rstrip("0")
    return len(mantissa.replace(".", "").lstrip("0"))


def searched_numbers(values: dict[str, str], formats: dict[str, set[tuple[str, str]]]) -> dict[str, set[str]]:
    """``{pattern: {name, ...}}``: the regular expressions that find a typed copy of each glued
    number as the pages show it (without its sign). A number of three or more significant
    digits is searched alone; one of two digits only followed by the word that follows its glue
    role (``"7.5 times"``), since alone it is mostly a coincidence (``tau = 0.6``, ``1.5 bits``);
    a number of one digit, or without a decimal point or per cent sign, is not searched."""
    shown: dict[str, set[str]] = {}
    for name, plain in values.items():
        for spec, word in formats.get(name, ()):
            try:
                text = format_plain_text(plain, spec)
            except (TypeError, ValueError):
                continue
            negative, digits = text.strip().startswith(("-", "−")), text.strip().lstrip("+-−")
            if not re.fullmatch(r"\d[\d,]*(\.\d+)?%?", digits) or not ("." in digits or "%" in digits):
                continue
            sign = r"(?<=[-−])" if negative else r"(?<![-−])"     # -1.07 is not a copy of 1.07
            number = rf"{sign}(?<![\d.,]){re.escape(digits)}(?![\d%]|[.,]\d)"
            if significant_digits(digits) >= 3:
                shown.setdefault(number, set()).add(name)
            elif significant_digits(digits) == 2 and word and word.lower() not in FUNCTION_WORDS:
                shown.setdefault(rf"{number}\s+{re.escape(word)}\b", set()).add(name)
    return shown


def prose(markdown: str) -> str:
    """The prose of a page's markdown: glue roles, fenced code and inline code removed."""
    return INLINE_CODE.sub(" ", FENCED_CODE.sub(" ", GLUE_ANY.sub(" ", markdown)))


def typed_copies(pages: dict[str, str], shown: dict[str, set[str]]) -> list[str]:
    """Every place where a page's prose types one of the ``shown`` numbers: ``"page: typed
    (glued as name, ...) in '...context...'"``."""
    found = []
    for page, text in pages.items():
        body = prose(text)
        for pattern, names in shown.items():
            for match in re.finditer(pattern, body):
                typed = match.group(0)
                if (page, typed.split()[0]) in ALLOWED:
                    continue
                context = " ".join(body[max(0, match.start() - 50):match.end() + 30].split())
                found.append(f"{page}: {typed} (glued as {', '.join(sorted(names))}) in '...{context}...'")
    return found


def _book_pages(book: Path = BOOK) -> dict[str, str]:
    return {str(p.relative_to(book.parent)): _markdown(p) for p in _pages(book)}


def test_no_glued_number_is_typed_in_the_prose():
    execute_dir = BUILD / "jupyter_execute"
    if not execute_dir.is_dir():
        if IN_CI:
            pytest.fail(f"{execute_dir} is missing: run `make book` first (CI is set, so this is a failure)")
        pytest.skip(f"{execute_dir} is missing: run `make book` first")
    pages = _book_pages()
    formats = glue_formats(list(pages.values()) + [p.read_text(encoding="utf-8") for p in _built_sources(BUILD)])
    shown = searched_numbers(glued_values(execute_dir), formats)
    assert shown, f"no glued number found under {execute_dir}"
    copies = typed_copies(pages, shown)
    assert not copies, "numbers that a chapter glues, typed in prose:\n" + "\n".join(copies)


def test_a_planted_typed_copy_is_found(tmp_path):
    """The search finds a glued number typed into a copy of a page, in prose and in math, and
    not the glued role itself, a longer number that contains it, or code."""
    book = tmp_path / "book"
    book.mkdir()
    execute = tmp_path / "jupyter_execute" / "book"
    execute.mkdir(parents=True)
    (execute / "08_x.glue.json").write_text(json.dumps({
        "k8-ratio": {"data": {"text/plain": "15.640346142742647"}, "output_type": "display_data"},
        "k8-share": {"data": {"text/plain": "0.3512"}, "output_type": "display_data"},
        "k8-count": {"data": {"text/plain": "5"}, "output_type": "display_data"}}))
    (book / "08_x.md").write_text("B is {glue:text}`k8-ratio:.1f` times A; {glue:text}`k8-share:.0%` "
                                  "off the path; {glue:text}`k8-count:d` seeds.\n")
    (book / "12_y.md").write_text("Clean: K = 5, a ratio of 15.64, 115.6, an exponent $-15.6$, `x = 15.6`, "
                                  "35.1% off, 35% on.\n\n```python\nprint(15.6)\n```\n")
    pages = _book_pages(book)
    formats = glue_formats(list(pages.values()))
    shown = searched_numbers(glued_values(tmp_path / "jupyter_execute"), formats)
    assert sorted(sorted(names) for names in shown.values()) == [["k8-ratio"], ["k8-share"]]
    assert typed_copies(pages, shown) == []
    (book / "12_y.md").write_text("Planted: B is 15.6 times A, $35\\%$ is not but 35% off the path is.\n")
    copies = typed_copies(_book_pages(book), shown)
    assert len(copies) == 2 and all(c.startswith("book/12_y.md") for c in copies), copies
    assert sorted(c.split(" (glued as ")[0] for c in copies) == ["book/12_y.md: 15.6", "book/12_y.md: 35% off"], copies
