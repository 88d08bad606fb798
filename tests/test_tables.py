"""Markdown tables: shape checked, cells escaped, rendered by Jupyter."""

import pytest

from course_lib.tables import MarkdownTable, markdown_table


def test_markdown_table_renders_rows_and_escapes_cells():
    t = markdown_table(["a", "b"], [(1, "x|y"), ("two\nlines", 2.5)])
    assert isinstance(t, MarkdownTable) and t._repr_markdown_() == str(t)
    assert str(t).splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| two lines | 2.5 |"]
    assert markdown_table(["only"], []).splitlines() == ["| only |", "|---|"]


@pytest.mark.parametrize("header, rows, error, match", [
    ("ab", [], ValueError, "not a string"),
    ([], [], ValueError, "non-empty"),
    (["a", "b"], [(1,)], ValueError, "row 0 has 1 cells, the header has 2"),
    (["a"], ["x"], TypeError, "row 0 is a string"),
])
def test_markdown_table_refuses_malformed_input(header, rows, error, match):
    with pytest.raises(error, match=match):
        markdown_table(header, rows)
