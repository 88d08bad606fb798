"""The bibliography lists its sources under the labels the text cites them by.

The lessons cite author-year (``bibtex_reference_style: author_year``: "NVIDIA, 2025a"), while pybtex's
``plain`` style numbered the list [1]-[37] and sorted organisations after every person ("{NVIDIA}" sorts by
its brace), so a reader looking for "NVIDIA, 2025a" had to scan the whole list. The style registered here,
``course_author_year``, keeps ``plain``'s entry text with three changes:

- each entry's label is its in-text citation, built by sphinxcontrib-bibtex's own author-year templates
  (the ``{cite:p}`` template without brackets), so the two cannot drift apart;
- entries sort by that label: first authors' surnames without braces or case, then the year with its
  letter (2025a before 2025b), then the title;
- titles keep the case the .bib file gives them (``plain`` lower-cased "Torchao.float8" and
  "Transformer engine").
"""

from __future__ import annotations

import re

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle
from pybtex.style.template import field, sentence
from sphinxcontrib.bibtex.style.referencing.basic_author_year import BasicAuthorYearParentheticalReferenceStyle
from sphinxcontrib.bibtex.style.template import join, year

STYLE_NAME = "course_author_year"


def citation_label(entry) -> str:
    """The text a parenthetical author-year citation of ``entry`` shows, "Micikevicius et al., 2018": the
    template of sphinxcontrib-bibtex's ``{cite:p}`` without its brackets."""
    cite = BasicAuthorYearParentheticalReferenceStyle()
    template = join(sep=cite.author_year_sep)[cite.person.author_or_editor_or_title(full=False), year]
    return template.format_data({"entry": entry, "style": cite}).render_as("text")


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            yield citation_label(entry)


def _plain(text: str) -> str:
    return re.sub(r"[{}\\]", "", text).strip().lower()


class ByCitationLabel(BaseSortingStyle):
    def sorting_key(self, entry):
        surnames = " ".join(_plain(" ".join(p.last_names)) for p in entry.persons.get("author", []))
        return (surnames, entry.fields.get("year", ""), _plain(entry.fields.get("title", "")))


class AuthorYearStyle(PlainStyle):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.label_style = AuthorYearLabels()
        self.format_labels = self.label_style.format_labels
        self.sorting_style = ByCitationLabel()
        self.sort = self.sorting_style.sort

    def format_title(self, e, which_field, as_sentence=True):
        title = field(which_field)
        return sentence[title] if as_sentence else title


def setup(app):
    register_plugin("pybtex.style.formatting", STYLE_NAME, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
