"""Tables of results: shown as HTML tables in the book and in Jupyter, as aligned text elsewhere.

A chapter's printed table of numbers is cut off when it is wider than the page's content
column; an HTML table wraps and scrolls instead. :class:`Table` holds the rows as given and
renders them in both forms, so a chapter writes ``Table(columns, rows)`` as the last line of a
cell (or ``display(Table(...))``) instead of a block of formatted ``print`` calls::

    Table(["budget", "model A", "greedy"], [[1, 0.41, 0.38], [2, 0.12, 0.10]],
          formats={"model A": "{:.4f}", "greedy": "{:.4f}"},
          caption="excess loss, 2000 contexts per entry")

Cells are formatted with ``formats[column]`` (a ``str.format`` pattern) when given, else with
``str`` (floats with four significant digits). Numbers are right-aligned, text left-aligned.
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Mapping, Sequence

__all__ = ["Table"]


def _default_format(value) -> str:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(value)
    return f"{float(value):.4g}"


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Table:
    """A table of results with a header row, an optional caption and per-column formats.

    Args:
        columns: the column titles, ``C`` strings.
        rows: ``R`` rows of ``C`` cells each (numbers or text).
        formats: column title -> ``str.format`` pattern for that column's cells, e.g.
            ``"{:.4f}"`` or ``"{:.2f}x"``; other columns use ``str`` (floats: 4 significant digits).
        caption: a line above the table (sample counts, seeds, units).

    Raises:
        ValueError: when a row does not have ``C`` cells, or ``formats`` names an unknown column.
    """

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence], *,
                 formats: Mapping[str, str] | None = None, caption: str | None = None):
        self.columns = [str(c) for c in columns]
        self.rows = [list(r) for r in rows]
        self.formats = dict(formats or {})
        self.caption = caption
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"row {i} has {len(row)} cells, expected {len(self.columns)} "
                                 f"(columns {self.columns})")
        unknown = sorted(set(self.formats) - set(self.columns))
        if unknown:
            raise ValueError(f"formats name unknown columns {unknown}; columns are {self.columns}")

    def cell_text(self, row: int, column: int) -> str:
        """Cell ``(row, column)`` as the table shows it (a column's format applies to its numbers;
        a text cell is shown as it is)."""
        value = self.rows[row][column]
        pattern = self.formats.get(self.columns[column])
        if pattern is None or isinstance(value, str):
            return _default_format(value)
        return pattern.format(value)

    def _texts(self) -> list[list[str]]:
        return [[self.cell_text(i, j) for j in range(len(self.columns))] for i in range(len(self.rows))]

    def __str__(self) -> str:
        texts = self._texts()
        widths = [max([len(c)] + [len(r[j]) for r in texts]) for j, c in enumerate(self.columns)]
        numeric = [all(_is_number(r[j]) for r in self.rows) and bool(self.rows)
                   for j in range(len(self.columns))]

        def line(cells):
            return "  ".join(c.rjust(w) if num else c.ljust(w)
                             for c, w, num in zip(cells, widths, numeric)).rstrip()

        out = [self.caption] if self.caption else []
        out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in texts]
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        texts = self._texts()
        parts = ['<div class="fvlib-table" style="overflow-x:auto">',
                 '<table class="table fvlib-results">']
        if self.caption:
            parts.append(f"<caption>{html.escape(self.caption)}</caption>")
        parts.append("<thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
                     + "</tr></thead><tbody>")
        for values, cells in zip(self.rows, texts):
            tds = "".join(
                f'<td style="text-align:{"right" if _is_number(v) else "left"}">{html.escape(c)}</td>'
                for v, c in zip(values, cells))
            parts.append(f"<tr>{tds}</tr>")
        parts.append("</tbody></table></div>")
        return "".join(parts)
