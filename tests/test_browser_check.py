"""The browser check of the built book (tools/browser_check.py) fails on each planted fault and passes a clean page.

The planted pages run in the real headless Chromium; those tests skip, saying why, where Chromium or
Playwright is missing. The table of contents, the table and the SKIPPED path need no browser.
"""

import base64
import importlib.util
import sys
from pathlib import Path

import pytest

from course_lib.widgets import format_explorer

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("browser_check", ROOT / "tools" / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bc = _tool()
needs_browser = pytest.mark.skipif(bc.unavailable() is not None, reason=f"browser check unavailable: {bc.unavailable()}")

# a 1x1 PNG
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
PLANTED = {
    "clean.html": '<p>A figure: <img src="pixel.png" alt="a pixel"> and a sign that fonts have: &plusmn;2.</p>'
                  "<pre>code may say \\( and $$ and {glue:text}`x`</pre>",
    "broken_image.html": '<p><img src="missing.png" alt="gone"></p>',
    # a figure's image with no alt, and one whose alt is its path (what Sphinx writes when a figure gives none);
    # an image outside a figure may be decorative (alt="")
    "undescribed.html": '<figure><img src="pixel.png"></figure><figure><img src="pixel.png" '
                        'alt="../_images/pixel.png"><figcaption>x</figcaption></figure><p><img src="pixel.png" alt=""></p>',
    "console_error.html": '<script>console.error("planted console error")</script><p>text</p>',
    "thrown.html": '<script>throw new Error("planted exception")</script><p>text</p>',
    "raw_tex.html": '<p>Spacing \\(2^{-m-1}\\) and</p><div class="math notranslate">\\[x^2\\]</div>',
    "glue.html": "<p>The loss fell by {glue:text}`loss_drop` percent.</p>",
    "repr.html": "<p>The head is <strong>&lt;IPython.core.display.Markdown object&gt;</strong> here.</p>"
                 "<pre>&lt;object object at 0x7f&gt; in code is fine</pre>",
    "quoted_glue.html": "<p>It trains <span class=\"pasted-text\">'6 recipes x 3 seeds'</span>, and "
                        "<span class=\"pasted-text\">0.25</span> of them.</p>",
    "offline.html": '<p><img src="http://planted.invalid/figure.png" alt="remote"></p>',
    "missing_script.html": '<script src="_static/missing.js"></script><p>text</p>',
    "widget.html": '<div class="cell_output"><script type="application/vnd.jupyter.widget-view+json">'
                   '{"model_id": "x", "version_major": 2, "version_minor": 0}</script></div>',
    # explorers: one that works, one whose script never runs, one nobody checks, one that stopped responding
    "explorer.html": format_explorer(1.0).html(),
    "explorer_dead.html": format_explorer(1.0).html().split("<script type=\"module\">")[0],
    "explorer_unchecked.html": '<div class="course-explorer" data-explorer="nope" data-mounted="1">'
                               '<script type="application/json" class="course-explorer-config">{}</script></div>',
    "explorer_deaf.html": format_explorer(1.0).html() + (
        "<script type=\"module\">const i = document.querySelector('[data-role=number]');"
        "i.replaceWith(i.cloneNode(true));</script>"),
    "box.html": "<p>A character no font has: \u0379.</p>",
    "figure_glyph.html": '<div class="output stderr"><pre>UserWarning: Glyph 9989 (\\N{WHITE HEAVY CHECK MARK}) '
                         "missing from font(s) DejaVu Sans.</pre></div>",
    "heavy.html": '<script src="heavy.js"></script><p>A page that loads more than the limit.</p>',
    # a visible code cell wider than the page scrolls, and so does a folded one once a reader opens it; a
    # folded one that fits passes
    "wide_code.html": '<div style="width: 600px"><div class="cell"><div class="cell_input"><pre>x = 1\n'
                      + "y = compute(" + "argument, " * 12 + ")</pre></div></div>"
                      '<div class="cell tag_hide-input"><details class="hide above-input"><summary>Show code</summary>'
                      '<div class="cell_input"><pre>' + "z = " + "hidden + " * 20 + "</pre></div></details></div>"
                      '<div class="cell tag_hide-input"><details class="hide above-input"><summary>Show code</summary>'
                      '<div class="cell_input"><pre>w = short</pre></div></details></div></div>',
    # the same for a cell's output (a folded one once opened) and a Markdown code block (one in a closed
    # dropdown passes: the reader has not opened it)
    "wide_output.html": '<div style="width: 600px"><div class="cell"><div class="cell_output"><pre>'
                        + "printed " * 20 + "</pre></div></div>"
                        '<div class="cell tag_hide-output"><details><summary>out</summary>'
                        '<div class="cell_output"><pre>' + "folded " * 20 + "</pre></div></details></div>"
                        '<div class="highlight"><pre>python -m course_lib.record ' + "experiment " * 12
                        + "</pre></div><details><summary>solution</summary><pre>" + "closed " * 20
                        + "</pre></details></div>",
}
PLANTED_HEAVY_BYTES = bc.PAGE_WEIGHT_LIMIT + 200_000   # one script alone over the limit


def _page_html(name: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{name}</title></head>"
            f"<body>{PLANTED[name]}</body></html>")


def _plant(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pixel.png").write_bytes(PIXEL)
    (folder / "heavy.js").write_text("//" + "x" * (PLANTED_HEAVY_BYTES - 3) + "\n")
    for name, body in PLANTED.items():
        (folder / name).write_text(_page_html(name), encoding="utf-8")
    return list(PLANTED)


@pytest.fixture(scope="module")
def planted_results(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    pages = _plant(site)
    bc.RENDER_TIMEOUT_MS = 1500   # the planted dead explorer never starts: do not wait the real book's 15 s
    results = bc.check_site(site, pages, screenshots=site.parent / "shots")
    return {r.page: r for r in results}


def _problems(results, page) -> str:
    return "\n".join(results[page].problems)


@needs_browser
def test_a_clean_page_passes_and_is_photographed(planted_results):
    clean = planted_results["clean.html"]
    assert clean.problems == [] and clean.images == 1
    assert clean.screenshot.is_file() and clean.screenshot.stat().st_size > 1000


@needs_browser
def test_a_light_page_passes_with_every_byte_it_loaded_weighed(planted_results, tmp_path):
    clean = planted_results["clean.html"]
    page_bytes = len(_page_html("clean.html").encode())
    assert clean.resources == {"clean.html": page_bytes, "pixel.png": len(PIXEL)}
    assert clean.weight == page_bytes + len(PIXEL) and clean.problems == []
    assert f"{clean.weight} B" in bc.format_table([clean])


@needs_browser
def test_a_page_above_the_weight_limit_fails_naming_its_heaviest_resources(planted_results):
    heavy = planted_results["heavy.html"]
    assert heavy.resources["heavy.js"] == PLANTED_HEAVY_BYTES and heavy.weight > bc.PAGE_WEIGHT_LIMIT
    assert heavy.problems == [f"page weighs {bc.format_bytes(heavy.weight)}, above the 3.00 MB limit; "
                              f"heaviest: heavy.js 3.20 MB, heavy.html {bc.format_bytes(heavy.resources['heavy.html'])}"]


@needs_browser
def test_a_broken_image_fails(planted_results):
    problems = _problems(planted_results, "broken_image.html")
    assert "image not loaded: missing.png" in problems and "HTTP 404" in problems


@needs_browser
def test_a_figure_image_without_a_text_alternative_fails(planted_results):
    problems = planted_results["undescribed.html"].problems
    assert problems == ["figure image without a text alternative (alt): pixel.png"] * 2


@needs_browser
def test_console_errors_and_exceptions_fail(planted_results):
    assert "console error: planted console error" in _problems(planted_results, "console_error.html")
    assert "script error: planted exception" in _problems(planted_results, "thrown.html")
    assert "HTTP 404" in _problems(planted_results, "missing_script.html")


@needs_browser
def test_raw_tex_and_untypeset_math_fail(planted_results):
    problems = _problems(planted_results, "raw_tex.html")
    assert "raw TeX in the text (4x)" in problems and "2^{-m-1}" in problems
    assert "1 formula(s) and no MathJax on the page" in problems


@needs_browser
def test_unresolved_glue_fails(planted_results):
    assert "unresolved glue in the text" in _problems(planted_results, "glue.html")


@needs_browser
def test_a_python_objects_repr_in_the_text_fails(planted_results):
    problems = planted_results["repr.html"].problems
    assert problems == ["a Python object's repr in the text (1x), first: ...The head is "
                        "<IPython.core.display.Markdown object> here...."], problems


@needs_browser
def test_a_glued_python_string_shown_with_its_quotes_fails(planted_results):
    problems = _problems(planted_results, "quoted_glue.html")
    assert problems == "glued text shown as a Python string: '6 recipes x 3 seeds'"


@needs_browser
def test_requests_off_the_machine_are_blocked_and_fail(planted_results):
    problems = _problems(planted_results, "offline.html")
    assert "blocked request off the machine: http://planted.invalid/figure.png" in problems
    assert "image not loaded" in problems


@needs_browser
def test_a_visible_code_cell_that_scrolls_sideways_fails(planted_results):
    problems = planted_results["wide_code.html"].problems
    widest = ("y = compute(" + "argument, " * 12 + ")")[:80]
    hidden = ("z = " + "hidden + " * 20).strip()[:80]
    assert problems == [f"a code cell scrolls sideways, widest line: {widest}",
                        f"a folded code cell, opened, scrolls sideways, widest line: {hidden}"], problems


@needs_browser
def test_a_visible_output_or_code_block_that_scrolls_sideways_fails(planted_results):
    problems = planted_results["wide_output.html"].problems
    assert problems == ["a cell output scrolls sideways, widest line: " + ("printed " * 20).strip()[:80],
                        "a folded cell output, opened, scrolls sideways, widest line: "
                        + ("folded " * 20).strip()[:80],
                        "a code block scrolls sideways, widest line: "
                        + ("python -m course_lib.record " + "experiment " * 12).strip()[:80]], problems


@needs_browser
def test_an_ipywidgets_output_fails(planted_results):
    assert "an ipywidgets output: it needs a kernel" in _problems(planted_results, "widget.html")


@needs_browser
def test_a_working_explorer_passes_its_check(planted_results):
    result = planted_results["explorer.html"]
    assert result.explorers == 1 and result.problems == []


@needs_browser
def test_an_explorer_that_does_not_start_or_respond_or_is_unchecked_fails(planted_results):
    assert "explorer 1 (format_explorer) did not start" in _problems(planted_results, "explorer_dead.html")
    assert "explorer 1 (nope) has no check" in _problems(planted_results, "explorer_unchecked.html")
    deaf = _problems(planted_results, "explorer_deaf.html")
    assert deaf.startswith("explorer 1 (format_explorer): ") and planted_results["explorer_deaf.html"].explorers == 1


@needs_browser
def test_a_character_drawn_as_a_box_fails(planted_results):
    assert "drawn as a box (no font has it): \u0379 (U+0379)" in _problems(planted_results, "box.html")
    assert "a figure lacks a glyph: Glyph 9989" in _problems(planted_results, "figure_glyph.html")


@needs_browser
def test_main_prints_the_table_and_exits_non_zero_on_a_problem(tmp_path, capsys):
    site = tmp_path / "html"
    _plant(site)
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: clean\nchapters:\n  - file: broken_image\n")
    # Sphinx's search page is checked beside the toc's pages, so a site without it fails at once
    assert bc.main([str(site), "--toc", str(tmp_path / "_toc.yml")]) == 1
    assert capsys.readouterr().out.strip().endswith(f"missing from {site}: search.html")
    (site / "search.html").write_text(_page_html("clean.html"), encoding="utf-8")
    assert bc.main([str(site), "--toc", str(tmp_path / "_toc.yml")]) == 1
    out = capsys.readouterr().out
    assert "clean.html" in out and "broken_image.html" in out and "FAIL" in out and "2 of 3 pages ok" in out
    assert "page weight: min " in out and "(broken_image.html), max " in out and "(clean.html); limit 3.00 MB" in out


def test_pages_come_from_the_toc_in_order():
    pages = bc.pages_from_toc(ROOT / "_toc.yml")
    assert pages[0] == "book/intro.html" and "lessons/01_formats.html" in pages
    assert all(p.endswith(".html") for p in pages) and len(pages) == len(set(pages))
    assert all((ROOT / p.replace(".html", ".md")).is_file() for p in pages)


def test_without_a_browser_the_check_says_skipped(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bc, "unavailable", lambda: "no Chromium here")
    monkeypatch.delenv("BROWSER_CHECK_REQUIRED", raising=False)
    assert bc.main([str(tmp_path)]) == 0
    assert "browser check SKIPPED: no Chromium here" in capsys.readouterr().out
    monkeypatch.setenv("BROWSER_CHECK_REQUIRED", "1")
    assert bc.main([str(tmp_path)]) == 1
    assert "SKIPPED" in capsys.readouterr().out


def test_the_table_lists_every_page_and_its_problems():
    ok, bad = bc.PageResult("a.html", images=2), bc.PageResult("lessons/b.html", problems=["x", "y"])
    table = bc.format_table([ok, bad])
    assert "a.html" in table and " ok " in table and "FAIL" in table and "x (+1 more)" in table
    assert table.rstrip().endswith("  - y")


def test_sizes_read_in_decimal_units():
    assert [bc.format_bytes(n) for n in (512, 86_000, 1_489_308, 3_000_000)] == ["512 B", "86 KB", "1.49 MB", "3.00 MB"]


def test_the_weight_problem_names_the_total_and_the_heaviest_resources_first():
    page = bc.PageResult("a.html", resources={"a.html": 20_000, "big.js": 2_500_000, "font.woff2": 600_000,
                                               **{f"s{i}.css": 1000 + i for i in range(10)}})
    problem = bc.weight_problem(page)
    assert problem.startswith("page weighs 3.13 MB, above the 3.00 MB limit; heaviest: big.js 2.50 MB, "
                              "font.woff2 600 KB, a.html 20 KB, s9.css 1 KB")
    assert problem.count(" KB") + problem.count(" MB") == 2 + bc.HEAVIEST_NAMED   # total, limit, the named few
    assert bc.weight_problem(bc.PageResult("b.html", resources={"b.html": bc.PAGE_WEIGHT_LIMIT})) is None


def test_the_summary_names_the_lightest_and_heaviest_page():
    pages = [bc.PageResult("a.html", resources={"a.html": 800_000}), bc.PageResult("b.html", resources={"b.html": 2_030_000})]
    assert bc.weight_summary(pages) == "page weight: min 800 KB (a.html), max 2.03 MB (b.html); limit 3.00 MB"
