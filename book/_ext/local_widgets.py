"""Serve the Jupyter widget manager and require.js from the book, so widget outputs render offline.

Pages with ipywidgets outputs (their state saved in the notebook) load require.js and
``@jupyter-widgets/html-manager``'s ``embed-amd.js``, which finds the widget state and view script tags
and renders them; myst-nb takes both from CDNs by default (``nb_ipywidgets_js``). The set-up
(``make setup``: tools/fetch_book_js.py, pins in book/js-packages.txt) unpacks the two npm packages into
``<venv>/share/book-js``; this extension copies what the pages need into ``_static/jupyter-widgets`` and
points ``nb_ipywidgets_js`` at the copies, without ``crossorigin``, so the book also works from ``file://``.

Where the set-up could not fetch them (no npm, no registry), the pages keep myst-nb's CDN addresses and
the build log says so in an info line, not a warning: the strict build (-W) must still pass on such a
machine, and the browser check (tools/browser_check.py), which blocks the network, is what fails there.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

STATIC_FOLDER = "jupyter-widgets"
REQUIRE_JS = f"{STATIC_FOLDER}/require.js"
# before the manager: where its font files are, and MathJax 2's Hub.Queue, which it calls, on MathJax 3
SETUP_JS = f"{STATIC_FOLDER}/widgets-setup.js"
EMBED_JS = f"{STATIC_FOLDER}/embed-amd.js"
# the bundle's own copies of the manager (non-AMD embed.js, libembed-amd.js) and source maps are not loaded
_UNUSED = {"embed.js", "embed.js.map", "libembed-amd.js"}


def vendor_folder() -> Path:
    """Where the set-up unpacked the packages: $BOOK_JS_DIR, or share/book-js in the building environment."""
    return Path(os.environ.get("BOOK_JS_DIR") or Path(sys.prefix) / "share" / "book-js")


def _sources(folder: Path) -> tuple[Path, Path] | None:
    require, dist = folder / "requirejs" / "require.js", folder / "html-manager" / "dist"
    return (require, dist) if require.is_file() and (dist / "embed-amd.js").is_file() else None


def _use_local_copies(app, config) -> None:
    folder = vendor_folder()
    if _sources(folder) is None:
        _log(app, f"local_widgets: no require.js and widget manager in {folder} (`make setup` fetches them "
                  "with npm): pages with widgets load them from a CDN and need a network")
        return
    config.nb_ipywidgets_js = {REQUIRE_JS: {}, SETUP_JS: {}, EMBED_JS: {}}
    _log(app, f"local_widgets: require.js and the widget manager served with the book, from {folder}")


def _copy(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    sources = _sources(vendor_folder())
    if sources is None:
        return
    require, dist = sources
    target = Path(app.outdir) / "_static" / STATIC_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(require, target / "require.js")
    shutil.copy2(Path(__file__).with_name("widgets-setup.js"), target / "widgets-setup.js")
    # embed-amd.js and the Font Awesome files it loads from its own folder (icons on buttons)
    for path in dist.iterdir():
        if path.is_file() and path.name not in _UNUSED:
            shutil.copy2(path, target / path.name)


def _log(app, message: str) -> None:
    from sphinx.util import logging

    logging.getLogger(__name__).info(message)


def setup(app):
    app.connect("config-inited", _use_local_copies)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
