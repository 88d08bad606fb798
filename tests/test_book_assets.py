"""The book serves what its pages load (book/_ext/*.py): formulas render without a network, and each page
loads each script once."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace


ROOT = Path(__file__).resolve().parents[1]


def _extension(name="local_mathjax", folder="book/_ext"):
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_mathjax_is_copied_into_the_html_build_and_pages_point_at_it(tmp_path):
    ext = _extension()
    app = SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(tmp_path),
                          config=SimpleNamespace(mathjax_path="https://cdn", mathjax3_config={"tex": {"tags": "ams"}}))
    ext._use_local_copy(app)
    # the loader and the components the book uses, not the combined file with its menu; other settings kept
    assert app.config.mathjax_path == "mathjax/startup.js"
    assert app.config.mathjax3_config == {"tex": {"tags": "ams"}, "loader": {"load": ext.COMPONENTS}}
    ext._copy(app, None)
    copied = tmp_path / "_static" / "mathjax"
    assert all((copied / f"{c}.js").stat().st_size > 1000 for c in ["startup", *ext.COMPONENTS])
    assert list((copied / "output" / "chtml" / "fonts" / "woff-v2").glob("MathJax_Main-Regular.woff"))
    latex = SimpleNamespace(builder=SimpleNamespace(format="latex"), config=SimpleNamespace(mathjax_path="x", mathjax3_config=None),
                            outdir=str(tmp_path / "latex"))
    ext._use_local_copy(latex)
    ext._copy(latex, None)
    assert latex.config.mathjax_path == "x" and not (tmp_path / "latex").exists()


def test_the_book_config_loads_the_extension():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"] == {"local_mathjax": "book/_ext", "page_scripts": "book/_ext",
                                                    "exec_table_status": "book/_ext",
                                                    "author_year_bibliography": "book/_ext",
                                                    "figure_alt": "book/_ext"}
    assert "django-static-mathjax" in (ROOT / "requirements.txt").read_text()


def test_each_page_loads_each_script_once():
    # sphinx-thebe registered its inline THEBE_JS_URL script twice: a SyntaxError in every page's console
    from sphinx.builders.html._assets import _JavaScript

    ext = _extension("page_scripts")
    inline = 'const THEBE_JS_URL = "x"'
    scripts = [_JavaScript("a.js"), _JavaScript(None, body=inline), _JavaScript("b.js", **{"async": "async"}),
               _JavaScript("", body=inline, priority=200), _JavaScript("b.js"), _JavaScript("a.js")]
    context = {"script_files": list(scripts)}
    ext._dedupe(None, "page", "page.html", context, None)
    assert context["script_files"] == [scripts[0], scripts[1], scripts[2], scripts[4]]
    ext._dedupe(None, "page", "page.html", {}, None)     # pages without scripts are left alone


def test_scripts_added_after_the_dedupe_reach_the_page():
    # the context's list is the builder's: myst-nb appends a page's own scripts to it from a later
    # html-page-context handler, and a replaced list silently dropped them from every page
    from sphinx.builders.html._assets import _JavaScript

    ext = _extension("page_scripts")
    builder_scripts = [_JavaScript("a.js"), _JavaScript("a.js")]
    context = {"script_files": builder_scripts}
    ext._dedupe(None, "page", "page.html", context, None)
    builder_scripts.append(_JavaScript(None, type="application/vnd.jupyter.widget-state+json", body="{}"))
    assert context["script_files"] is builder_scripts and len(context["script_files"]) == 2


def test_the_theme_gets_a_colour_mode_unless_one_is_set():
    from types import SimpleNamespace

    ext = _extension("page_scripts")
    config = SimpleNamespace(html_context={"github_user": "x"})
    ext._default_mode(None, config)
    assert config.html_context == {"github_user": "x", "default_mode": "auto"}
    config = SimpleNamespace(html_context={"default_mode": "dark"})
    ext._default_mode(None, config)
    assert config.html_context == {"default_mode": "dark"}


def test_the_execution_table_says_its_status_in_words():
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    ext = _extension("exec_table_status")
    document = new_document("status", get_default_settings(Parser))
    table = nodes.table()
    for symbol in ["\u2705", "\u274c", "3.69"]:
        table += nodes.paragraph("", "", nodes.Text(symbol))
    document += table
    document += nodes.paragraph("", "", nodes.Text("\u2705"))    # outside a table: left alone
    ext.StatusInWords(document).run()
    assert [p.astext() for p in table.findall(nodes.paragraph)] == ["ok", "failed", "3.69"]
    assert document.children[-1].astext() == "\u2705"


def test_a_page_drops_what_it_does_not_use():
    from docutils import nodes
    from sphinx.builders.html._assets import _CascadingStyleSheet, _JavaScript

    ext = _extension("page_scripts")
    page, formula = nodes.section(), nodes.section()
    page += nodes.paragraph(text="no formula here")
    formula += nodes.math(text="x^2")
    assert not ext.has_math(page) and ext.has_math(formula) and not ext.has_math(None)
    mathjax = _JavaScript("_static/mathjax/tex-chtml.js")
    config = _JavaScript(None, body="window.MathJax = {}")
    design, thebe = _CascadingStyleSheet("_static/sphinx-design.min.css"), _JavaScript("_static/sphinx-thebe.js")
    plain = _JavaScript("_static/doctools.js")
    assert ext.is_mathjax(mathjax, "mathjax/tex-chtml.js") and ext.is_mathjax(config, None)
    assert ext.is_thebe(thebe) and ext.is_thebe(_JavaScript(None, body='const THEBE_JS_URL = "x"'))
    nothing = dict(math=False, design=False, thebe=False, mathjax_path="mathjax/tex-chtml.js")
    assert [ext.unused_on_page(a, **nothing) for a in (mathjax, config, design, thebe, plain)] == [
        True, True, True, True, False]
    everything = dict(math=True, design=True, thebe=True, mathjax_path="mathjax/tex-chtml.js")
    assert not any(ext.unused_on_page(a, **everything) for a in (mathjax, config, design, thebe, plain))
    assert ext.uses_design('<div class="sd-card">') and not ext.uses_design('<div class="card">')
    launch = SimpleNamespace(html_theme_options={"launch_buttons": {"thebe": True}}, thebe_config={})
    assert ext.uses_thebe(launch, "") and not ext.uses_thebe(SimpleNamespace(), "<p>x</p>")


def test_every_citation_label_names_one_source():
    """The book cites author-year (``_config.yml``) and sphinxcontrib-bibtex adds no 2025a/2025b of its own:
    two sources with the same first author and year would show the same label in the text."""
    import re
    from collections import Counter

    bib = (Path(__file__).resolve().parents[1] / "book" / "references.bib").read_text(encoding="utf-8")
    entries = re.findall(r"@\w+\{([^,]+),(.*?)\n\}", bib, re.S)
    assert len(entries) > 30
    labels = Counter()
    for key, body in entries:
        author = re.search(r"author\s*=\s*\{(.*?)\},?\n", body, re.S)
        year = re.search(r"year\s*=\s*\{?(\w+)\}?", body)
        assert author and year, f"{key} lacks an author or a year"
        labels[(author.group(1).split(" and ")[0].strip(), year.group(1))] += 1
    assert [label for label, n in labels.items() if n > 1] == []


def test_the_bibliography_lists_each_source_under_the_label_the_text_cites(tmp_path):
    """A small Sphinx project cites every source of book/references.bib both ways the lessons do ({cite:p} and
    {cite:t}) and lists them with the book's style: each citation's link text must be its target's label, and
    the list runs in label order (the plain style numbered it and put organisations after people)."""
    import re
    import subprocess
    import sys

    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    keys = re.findall(r"^@\w+\{([^,]+),", bib, re.M)
    src = tmp_path / "src"
    src.mkdir()
    (src / "references.bib").write_text(bib, encoding="utf-8")
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['sphinxcontrib.bibtex', 'author_year_bibliography']\n"
        "bibtex_bibfiles = ['references.bib']\nbibtex_reference_style = 'author_year'\n")
    cites = "\n\n".join(f"Text :cite:p:`{key}` and :cite:t:`{key}`." for key in keys)
    (src / "index.rst").write_text(f"Sources\n=======\n\n{cites}\n\n.. bibliography::\n   :style: course_author_year\n")
    out = tmp_path / "html"
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", str(src), str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    page = (out / "index.html").read_text(encoding="utf-8")

    def text(fragment: str) -> str:
        return " ".join(re.sub(r"<[^>]+>", "", fragment).split())

    labels = {}
    for anchor, label in re.findall(r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label">(.*?)</span>\s*</span>',
                                    page, re.S):
        labels[anchor] = text(label).strip("[]")
    assert len(labels) == len(keys)
    links = re.findall(r'<a class="reference internal" href="#([^"]+)"[^>]*>(.*?)</a>', page, re.S)
    assert len(links) >= 2 * len(keys)
    for target, shown in links:
        assert labels[target] in text(shown) or text(shown) in labels[target], (target, shown)
    cited = [text(shown) for target, shown in links if "," in text(shown)]
    assert {label for label in labels.values()} == set(cited)
    order = list(labels.values())
    # by first author, a source of one author before "et al.", then by year and its letter
    names = [label.rsplit(", ", 1)[0] for label in order]
    assert order == sorted(order, key=lambda label: (label.rsplit(", ", 1)[0].replace(" et al.", "").lower(),
                                                     " et al." in label, label.rsplit(", ", 1)[1]))
    assert names[0].startswith("Brock") and "NVIDIA et al." in names and "Zhao et al." == names[-1]
    assert [label for label in order if label.startswith("NVIDIA, 2025")] == [f"NVIDIA, 2025{c}" for c in "abcde"]


def test_a_figures_image_is_described_by_its_captions_first_sentence():
    from docutils import nodes

    ext = _extension("figure_alt")
    assert ext.first_sentence("Top: amax per step.  Middle:\nthe share. Bottom.") == "Top: amax per step."
    assert ext.first_sentence("FP16 at 2.5e-5 is not a sentence end") == "FP16 at 2.5e-5 is not a sentence end"
    # a cross-reference's "Fig. 22" ends no sentence (alts read "The run of Fig." before)
    assert ext.first_sentence("The run of Fig. 12 again, as in Fig. 3. Right: more.") == (
        "The run of Fig. 12 again, as in Fig. 3.")
    assert ext.first_sentence("Loss (e.g. BF16) per step. Grey: FP32.") == "Loss (e.g. BF16) per step."
    long = ext.first_sentence("word " * 100, limit=30)
    assert len(long) <= 30 and long.endswith("\u2026") and not long[:-1].endswith(" ")

    def figure(alt=None, caption="Loss per step. Grey: FP32."):
        image = nodes.image(uri="../_images/a.png", **({} if alt is None else {"alt": alt}))
        return nodes.figure("", image, *([nodes.caption("", caption)] if caption else [])), image

    for alt in (None, "", "../_images/a.png"):        # none, empty, or its own path: replaced
        fig, image = figure(alt)
        assert ext.set_alt_from_caption(fig) == 1 and image["alt"] == "Loss per step."
    fig, image = figure("A chosen description")        # an alt of its own stays
    assert ext.set_alt_from_caption(fig) == 0 and image["alt"] == "A chosen description"
    fig, image = figure(None, caption="")              # no caption: nothing to say
    assert ext.set_alt_from_caption(fig) == 0 and "alt" not in image
