"""fvlib.plots.tables: a table of results renders as HTML and as aligned text."""

import pytest

from fvlib.plots.tables import Table


def test_table_formats_cells_and_escapes_html():
    table = Table(["name", "loss"], [["a<b", 0.123456], ["c", 2]], formats={"loss": "{:.3f}"},
                  caption="2 rows")
    html = table._repr_html_()
    assert "<caption>2 rows</caption>" in html
    assert "a&lt;b" in html and "a<b" not in html
    assert "0.123" in html and "2.000" in html
    assert html.count("<tr>") == 3
    text = str(table).splitlines()
    assert text[0] == "2 rows"
    assert text[1].split() == ["name", "loss"]
    assert text[3].split() == ["a<b", "0.123"] and text[4].endswith("2.000")


def test_numbers_right_text_left_and_default_format():
    table = Table(["k", "v"], [["x", 1.0 / 3.0]])
    assert table.cell_text(0, 1) == "0.3333"
    assert 'text-align:right">0.3333' in table._repr_html_()
    assert 'text-align:left">x' in table._repr_html_()


def test_bad_rows_and_formats_are_named():
    with pytest.raises(ValueError, match="row 1 has 1 cells, expected 2"):
        Table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match=r"unknown columns \['c'\]"):
        Table(["a", "b"], [[1, 2]], formats={"c": "{:.1f}"})
