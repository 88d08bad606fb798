"""Serve MathJax from the book itself, so formulas render without a network connection.

MathJax 3 (its ``es5`` build and fonts) comes from the ``django-static-mathjax`` wheel (pinned in
requirements.txt; it has no dependencies and is imported as ``mathjax``). At the end of an HTML build the
``es5`` folder is copied to ``_static/mathjax``, and every page loads ``_static/mathjax/tex-chtml.js``
instead of a CDN copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def _es5_folder() -> Path:
    import mathjax

    folder = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (folder / "tex-chtml.js").is_file():
        raise RuntimeError(f"MathJax's es5 build is missing from {folder}: reinstall django-static-mathjax")
    return folder


def _use_local_copy(app) -> None:
    if app.builder.format == "html":
        _es5_folder()   # fail early, before any page is written, if the files are not there
        app.config.mathjax_path = "mathjax/tex-chtml.js"


def _copy(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(_es5_folder(), Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app):
    app.connect("builder-inited", _use_local_copy)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
