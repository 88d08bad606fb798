"""Each figure's image gets a short text alternative: the first sentence of its caption.

A figure pasted by myst-nb's ``glue:figure`` has no alt text (the directive takes no ``:alt:`` option), and
the HTML writer then writes the image's path there (``alt="../_images/3f2c....png"``), which a screen reader
reads out. The caption says what the figure shows; its first sentence, up to :data:`MAX_CHARS`, becomes the
alt text of every image in the figure that has none of its own. The caption itself stays as it is.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

MAX_CHARS = 200


# abbreviations a caption uses before a number or a name ("as in Fig. 22"): no sentence ends there
ABBREVIATIONS = ("Fig.", "Figs.", "Eq.", "e.g.", "i.e.", "vs.", "cf.", "approx.")


def first_sentence(text: str, limit: int = MAX_CHARS) -> str:
    """The first sentence of ``text`` (up to a full stop, ! or ? followed by a space and a capital letter, or
    the end; not after one of :data:`ABBREVIATIONS`), on one line, cut at a word boundary to at most ``limit``
    characters with an ellipsis where it was longer."""
    text = " ".join(text.split())
    sentence = text
    for match in re.finditer(r"[.!?](?= [A-Z(])", text):
        if not text[:match.end()].endswith(ABBREVIATIONS):
            sentence = text[:match.end()]
            break
    if len(sentence) <= limit:
        return sentence
    cut = sentence[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "\u2026"


def set_alt_from_caption(figure: nodes.figure) -> int:
    """Give each image in ``figure`` without alt text (or with its own path as alt) the caption's first
    sentence; returns how many images it changed."""
    captions = list(figure.findall(nodes.caption))
    if not captions or not captions[0].astext().strip():
        return 0
    alt = first_sentence(captions[0].astext())
    changed = 0
    for image in figure.findall(nodes.image):
        current = image.get("alt", "")
        if not current or current == image.get("uri") or current.endswith((".png", ".svg", ".jpg")):
            image["alt"] = alt
            changed += 1
    return changed


class FigureAltFromCaption(SphinxPostTransform):
    # late: after myst-nb has pasted glued outputs into their figures
    default_priority = 900

    def run(self, **kwargs) -> None:
        for figure in self.document.findall(nodes.figure):
            set_alt_from_caption(figure)


def setup(app):
    app.add_post_transform(FigureAltFromCaption)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
