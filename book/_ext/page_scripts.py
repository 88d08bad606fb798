"""Each page loads each script once.

sphinx-thebe (pulled in by Jupyter Book) registers its inline configuration script,
``const THEBE_JS_URL = ...``, from an ``env-before-read-docs`` handler, which can run more than once per
build; every page then declared the constant twice and the browser logged
``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared``. This extension drops repeated
scripts (same file, or both inline, with the same body and attributes) from each page's script list, keeping the first.

It also gives the theme a default colour mode: pydata-sphinx-theme (under sphinx-book-theme) reads
``default_mode`` from ``html_context``, where Jupyter Book sets nothing, and a first visit (nothing in localStorage) then logged ``Got invalid theme mode: . Resetting to
auto.`` on every page. ``auto`` follows the reader's system setting, which is what the theme fell back to.
"""

from __future__ import annotations


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


def _default_mode(app, config) -> None:
    context = dict(config.html_context or {})
    if not context.get("default_mode"):
        context["default_mode"] = "auto"
        config.html_context = context


def setup(app):
    app.connect("config-inited", _default_mode)
    # early: html-page-context is emitted with emit_firstresult, so a handler that returns a template name
    # stops the ones after it; the repeated scripts are in the context before any handler runs
    app.connect("html-page-context", _dedupe, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
