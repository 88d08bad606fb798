"""Each page loads what it uses, once.

Repeats. sphinx-thebe (pulled in by Jupyter Book) registers its inline configuration script,
``const THEBE_JS_URL = ...``, from an ``env-before-read-docs`` handler, which can run more than once per
build; every page then declared the constant twice and the browser logged
``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared``. This extension drops repeated
scripts (same file, or both inline, with the same body and attributes) from each page's script list, keeping the first.

Weight (tools/browser_check.py fails a page above 3 MB). Left to themselves, the themes and extensions
load everything on every page:

- pydata-sphinx-theme's ``scripts/fontawesome.js`` (1.5 MB), which swaps icons for SVGs. The theme's CSS
  draws the same icons from the Font Awesome webfonts it already loads, so the pages drop the script
  (templates/static/webpack-macros.html wraps the theme's macros and leaves it out, and gives the icons'
  ``<i>`` the few rules the theme wrote for the ``<svg>``: without them the narrow-screen search button
  lost its icon and the search dialog's icon sat over its text).
- Sphinx's search scripts and index (``searchtools.js``, ``language_data.js``, ``searchindex.js``, which
  grows with the book), loaded everywhere for search-as-you-type; with that option off (the default) the
  search field opens search.html, which loads them itself (templates/layout.html leaves them out).
- MathJax (1.2 MB and its fonts): Sphinx loads it on a page with a formula *or whose toctree includes
  one*, so the root page, which lists the lessons, loaded it with no formula of its own. A page keeps it
  when its own content has math, or when any page's title has (titles are drawn in every page's sidebar).
- sphinx-design's stylesheet and tab script, kept on a page whose content uses a component (``sd-`` classes).
- sphinx-thebe's script and stylesheet, kept where thebe can start: a thebe launch button, a
  ``thebe-button`` on the page, or ``thebe_config.always_load``.

It also gives the theme a default colour mode: pydata-sphinx-theme (under sphinx-book-theme) reads
``default_mode`` from ``html_context``, where Jupyter Book sets nothing, and a first visit (nothing in localStorage) then logged ``Got invalid theme mode: . Resetting to
auto.`` on every page. ``auto`` follows the reader's system setting, which is what the theme fell back to.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes

TEMPLATES = Path(__file__).parent / "templates"
# sphinx-design marks every component it draws with classes that start "sd-"; its stylesheet styles only those
_DESIGN_CLASS = re.compile(r"""class=["'][^"']*\bsd-""")
_DESIGN_ASSETS = re.compile(r"(^|/)(sphinx-design[.\w-]*\.css|design-tabs\.js)$")
_THEBE_ASSETS = re.compile(r"(^|/)sphinx-thebe\.(js|css)$")


def _key(script) -> tuple:
    # an inline script may come with filename None or "" (the same thing); the priority only orders them
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {}) or {}
    return str(filename), tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def unique_scripts(scripts) -> list:
    """``scripts`` without repeats, in their order (the first of each kept)."""
    seen, kept = set(), []
    for script in scripts:
        key = _key(script)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    return kept


def _dedupe(app, pagename, templatename, context, doctree) -> None:
    # in place: the context's list is the builder's own, to which later handlers add this page's scripts
    # (myst-nb adds the ipywidgets state and manager after this handler); a new list would lose them
    if "script_files" in context:
        context["script_files"][:] = unique_scripts(context["script_files"])


# -- what a page uses -----------------------------------------------------------------------------------
def has_math(tree) -> bool:
    """Whether a doctree (a page's, or a title's) holds a formula: inline, display, or a text/latex output."""
    return tree is not None and next(tree.findall(lambda node: isinstance(node, (nodes.math, nodes.math_block))),
                                     None) is not None


def uses_design(body: str) -> bool:
    """Whether a page's rendered content holds a sphinx-design component (grid, card, tab, dropdown, ...)."""
    return bool(_DESIGN_CLASS.search(body or ""))


def uses_thebe(config, body: str) -> bool:
    """Whether thebe can start on a page: launch button, ``thebe-button`` directive, or always loaded."""
    options = getattr(config, "html_theme_options", None) or {}
    thebe_config = getattr(config, "thebe_config", None) or {}
    return bool((options.get("launch_buttons") or {}).get("thebe") or "thebe-launch-button" in (body or "")
                or (isinstance(thebe_config, dict) and str(thebe_config.get("always_load")).lower() == "true"))


def _filename(asset) -> str:
    return str(getattr(asset, "filename", asset) or "")


def _body(asset) -> str:
    return str((getattr(asset, "attributes", {}) or {}).get("body", ""))


def is_mathjax(asset, mathjax_path: str | None) -> bool:
    """MathJax itself, or the inline configuration sphinx.ext.mathjax puts before it."""
    attributes = getattr(asset, "attributes", {}) or {}
    # the builder files a relative mathjax_path under _static/ (an address with :// stays as it is)
    return bool(mathjax_path and _filename(asset) in {mathjax_path, f"_static/{mathjax_path}"}) or (
        not _filename(asset) and (_body(asset).startswith("window.MathJax =")
                                  or attributes.get("type") == "text/x-mathjax-config"))


def is_thebe(asset) -> bool:
    """sphinx-thebe's script, stylesheet or inline configuration."""
    return bool(_THEBE_ASSETS.search(_filename(asset))) or (
        not _filename(asset) and _body(asset).startswith("const THEBE_JS_URL"))


def unused_on_page(asset, *, math: bool, design: bool, thebe: bool, mathjax_path: str | None) -> bool:
    """Whether a page that uses (or not) math, sphinx-design and thebe can go without ``asset``."""
    return ((not math and is_mathjax(asset, mathjax_path))
            or (not design and bool(_DESIGN_ASSETS.search(_filename(asset))))
            or (not thebe and is_thebe(asset)))


def _any_title_has_math(env) -> bool:
    # every page's sidebar draws the titles of the book's pages (env.tocs: each page's sections)
    return any(has_math(toc) for toc in getattr(env, "tocs", {}).values())


def _drop_unused(app, pagename, templatename, context, doctree) -> None:
    # after sphinx.ext.mathjax's handler (priority 500), which adds MathJax to this page's lists;
    # in place, like _dedupe: the lists are the builder's, restored before the next page
    if app.builder.format != "html":
        return
    body = context.get("body", "")
    page = {"math": has_math(doctree) or _any_title_has_math(app.env), "design": uses_design(body),
            "thebe": uses_thebe(app.config, body), "mathjax_path": getattr(app.config, "mathjax_path", None)}
    for key in ("script_files", "css_files"):
        if key in context:
            context[key][:] = [asset for asset in context[key] if not unused_on_page(asset, **page)]


def _templates(app, config) -> None:
    # before the builder makes its template loader; templates_path is searched before the theme
    if str(TEMPLATES) not in config.templates_path:
        config.templates_path = [*config.templates_path, str(TEMPLATES)]


def _default_mode(app, config) -> None:
    context = dict(config.html_context or {})
    if not context.get("default_mode"):
        context["default_mode"] = "auto"
        config.html_context = context


def setup(app):
    app.connect("config-inited", _default_mode)
    app.connect("config-inited", _templates)
    # early: html-page-context is emitted with emit_firstresult, so a handler that returns a template name
    # stops the ones after it; the repeated scripts are in the context before any handler runs
    app.connect("html-page-context", _dedupe, priority=100)
    # late: after the handlers that add this page's assets (sphinx.ext.mathjax at 500); should one before it
    # return a template name, it would not run, and the page would only be heavier (the browser check weighs it)
    app.connect("html-page-context", _drop_unused, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
