"""The status page's execution table says "ok" or "failed" in words.

myst-nb's ``{nb-exec-table}`` writes its Status column as the emoji U+2705 and U+274C, which a machine
with no emoji font draws as empty boxes: a plain Linux machine, and Debian's Chromium in the browser check
(tools/browser_check.py found the box on book/status). After myst-nb has built the table, this
post-transform puts words in their place.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

STATUS_WORDS = {"\u2705": "ok", "\u274c": "failed"}


class StatusInWords(SphinxPostTransform):
    # myst-nb's ExecutionStatsPostTransform builds the table at priority 8
    default_priority = 20

    def run(self, **kwargs) -> None:
        for table in self.document.findall(nodes.table):
            for text in list(table.findall(nodes.Text)):
                word = STATUS_WORDS.get(text.astext().strip())
                if word is not None:
                    text.parent.replace(text, nodes.Text(word))


def setup(app):
    app.add_post_transform(StatusInWords)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
