"""Serve MathJax from the book itself, so formulas render without a network connection.

MathJax 3 (its ``es5`` build and fonts) comes from the ``django-static-mathjax`` wheel (pinned in
requirements.txt; it has no dependencies and is imported as ``mathjax``). At the end of an HTML build the
``es5`` folder is copied to ``_static/mathjax``, and a page with math loads it from there instead of a CDN.

A page loads MathJax's loader (``startup.js``) and only the components the book uses (:data:`COMPONENTS`:
TeX input with its default packages, AMS included; HTML-CSS output; the hidden MathML copy screen readers
read), about 0.66 MB, where the combined ``tex-chtml.js`` (1.2 MB) also carries the right-click menu
(0.4 MB) that a reader of this book does not need: the page-weight limit of the browser check counts it.
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


COMPONENTS = ["core", "input/tex", "output/chtml", "a11y/assistive-mml"]


def _use_local_copy(app) -> None:
    if app.builder.format == "html":
        folder = _es5_folder()   # fail early, before any page is written, if the files are not there
        missing = [c for c in COMPONENTS if not (folder / f"{c}.js").is_file()]
        if missing:
            raise RuntimeError(f"MathJax components {missing} are missing from {folder}")
        app.config.mathjax_path = "mathjax/startup.js"
        config = dict(getattr(app.config, "mathjax3_config", None) or {})
        config["loader"] = {**dict(config.get("loader") or {}), "load": list(COMPONENTS)}
        app.config.mathjax3_config = config


def _copy(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(_es5_folder(), Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app):
    app.connect("builder-inited", _use_local_copy)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
