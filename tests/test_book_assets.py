"""The book serves what its pages load (book/_ext/*.py): formulas and widgets render without a network."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _extension(name="local_mathjax", folder="book/_ext"):
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_mathjax_is_copied_into_the_html_build_and_pages_point_at_it(tmp_path):
    ext = _extension()
    app = SimpleNamespace(builder=SimpleNamespace(format="html"), config=SimpleNamespace(mathjax_path="https://cdn"),
                          outdir=str(tmp_path))
    ext._use_local_copy(app)
    assert app.config.mathjax_path == "mathjax/tex-chtml.js"
    ext._copy(app, None)
    copied = tmp_path / "_static" / "mathjax"
    assert (copied / "tex-chtml.js").stat().st_size > 100_000
    assert list((copied / "output" / "chtml" / "fonts" / "woff-v2").glob("MathJax_Main-Regular.woff"))
    latex = SimpleNamespace(builder=SimpleNamespace(format="latex"), config=SimpleNamespace(mathjax_path="x"),
                            outdir=str(tmp_path / "latex"))
    ext._use_local_copy(latex)
    ext._copy(latex, None)
    assert latex.config.mathjax_path == "x" and not (tmp_path / "latex").exists()


def test_the_book_config_loads_the_extension():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"] == {"local_mathjax": "book/_ext", "local_widgets": "book/_ext",
                                                    "page_scripts": "book/_ext", "exec_table_status": "book/_ext"}
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
    # the context's list is the builder's: myst-nb appends a page's widget state and manager to it from a
    # later html-page-context handler, and a replaced list silently dropped them from every page
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


def _fake_vendor(folder: Path) -> Path:
    (folder / "requirejs").mkdir(parents=True)
    (folder / "requirejs" / "require.js").write_text("var requirejs;")
    (folder / "html-manager" / "dist").mkdir(parents=True)
    for name in ["embed-amd.js", "embed.js", "libembed-amd.js", "embed.js.map", "1551f4f60c37af51121f.woff2"]:
        (folder / "html-manager" / "dist" / name).write_text(name)
    return folder


def test_the_widget_manager_and_require_js_are_served_with_the_book(tmp_path, monkeypatch):
    ext = _extension("local_widgets")
    monkeypatch.setenv("BOOK_JS_DIR", str(_fake_vendor(tmp_path / "vendor")))
    config = SimpleNamespace(nb_ipywidgets_js={"https://cdn/require.min.js": {"crossorigin": "anonymous"}})
    ext._use_local_copies(None, config)
    # local files, in this order (require.js, the set-up, the manager), and no crossorigin: file:// works too
    assert config.nb_ipywidgets_js == {"jupyter-widgets/require.js": {}, "jupyter-widgets/widgets-setup.js": {},
                                       "jupyter-widgets/embed-amd.js": {}}
    app = SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(tmp_path / "html"))
    ext._copy(app, None)
    copied = sorted(p.name for p in (tmp_path / "html" / "_static" / "jupyter-widgets").iterdir())
    assert copied == ["1551f4f60c37af51121f.woff2", "embed-amd.js", "require.js", "widgets-setup.js"]
    setup_js = (tmp_path / "html" / "_static" / "jupyter-widgets" / "widgets-setup.js").read_text()
    assert "@jupyter-widgets/html-manager/dist" in setup_js and "Hub" in setup_js


def test_without_the_set_up_copies_the_pages_keep_the_cdn_and_the_log_says_so(tmp_path, monkeypatch):
    ext = _extension("local_widgets")
    monkeypatch.setenv("BOOK_JS_DIR", str(tmp_path / "nothing"))
    said = []
    monkeypatch.setattr(ext, "_log", lambda app, message: said.append(message))
    cdn = {"https://cdn/require.min.js": {}}
    config = SimpleNamespace(nb_ipywidgets_js=dict(cdn))
    ext._use_local_copies(None, config)
    assert config.nb_ipywidgets_js == cdn
    assert len(said) == 1 and "from a CDN" in said[0] and str(tmp_path / "nothing") in said[0]
    ext._copy(SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(tmp_path / "html")), None)
    assert not (tmp_path / "html").exists()


def test_the_widget_files_default_to_the_building_environment(monkeypatch):
    ext = _extension("local_widgets")
    monkeypatch.delenv("BOOK_JS_DIR", raising=False)
    assert ext.vendor_folder() == Path(sys.prefix) / "share" / "book-js"


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


# -- tools/fetch_book_js.py -------------------------------------------------------------------------------
def _fetcher():
    return _extension("fetch_book_js", folder="tools")


def _tarball(path: Path, files: dict) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_the_pins_are_exact_versions_with_their_integrity():
    import re

    pins = _fetcher().read_pins(ROOT / "book" / "js-packages.txt")
    assert [p.folder for p in pins] == ["html-manager", "requirejs"]
    assert all(re.fullmatch(r"@?[\w/.-]+@\d+\.\d+\.\d+", p.spec) for p in pins)
    assert all(p.integrity.startswith("sha512-") and len(p.integrity) == 95 for p in pins)


def test_a_package_is_unpacked_only_when_its_integrity_matches(tmp_path):
    fetcher = _fetcher()
    tgz = _tarball(tmp_path / "p.tgz", {"package/dist/embed-amd.js": "define()", "package/package.json": "{}",
                                        "package/../../escape.txt": "no", "other/x.txt": "no"})
    pin = fetcher.Pin("html-manager", "@jupyter-widgets/html-manager@1.0.0", fetcher.integrity(tgz))
    target = fetcher.unpack(tgz, pin, tmp_path / "dest")
    assert (target / "dist" / "embed-amd.js").read_text() == "define()"
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["dist", "dist/embed-amd.js", "package.json"]
    assert not (tmp_path / "escape.txt").exists()
    bad = fetcher.Pin("html-manager", "@jupyter-widgets/html-manager@1.0.0", "sha512-AAAA")
    with pytest.raises(fetcher.FetchError, match="integrity"):
        fetcher.unpack(tgz, bad, tmp_path / "dest")


def test_fetch_runs_npm_pack_and_stamps_when_every_package_is_in(tmp_path):
    fetcher = _fetcher()
    tgz = _tarball(tmp_path / "requirejs-2.3.8.tgz", {"package/require.js": "var requirejs;"})
    pins = tmp_path / "pins.txt"
    pins.write_text(f"# comment\nrequirejs requirejs@2.3.8 {fetcher.integrity(tgz)}\n")
    npm = tmp_path / "npm"     # stands in for npm: `npm pack ... --pack-destination DIR spec` puts the tarball there
    npm.write_text(f"#!/bin/sh\ncp {tgz} \"$4\"/ && echo requirejs-2.3.8.tgz\n")
    npm.chmod(0o755)
    fetcher.fetch(pins, tmp_path / "book-js", npm=str(npm))
    assert (tmp_path / "book-js" / "requirejs" / "require.js").is_file()
    assert "requirejs@2.3.8" in (tmp_path / "book-js" / ".stamp").read_text()


def test_without_npm_the_set_up_says_why_and_goes_on(tmp_path, monkeypatch, capsys):
    fetcher = _fetcher()
    monkeypatch.setattr(fetcher.shutil, "which", lambda name: None)
    dest = tmp_path / "book-js"
    assert fetcher.main([str(ROOT / "book" / "js-packages.txt"), str(dest)]) == 0
    out = capsys.readouterr().out
    assert "NOT fetched (npm not found)" in out and "from a CDN" in out and not dest.exists()


def test_a_failed_npm_pack_leaves_nothing_half_done(tmp_path, capsys):
    fetcher = _fetcher()
    npm = tmp_path / "npm"
    npm.write_text("#!/bin/sh\necho 'npm error 404 Not Found' >&2\nexit 1\n")
    npm.chmod(0o755)
    dest = tmp_path / "book-js"
    with pytest.raises(fetcher.FetchError, match="404"):
        fetcher.fetch(ROOT / "book" / "js-packages.txt", dest, npm=str(npm))
    assert not dest.exists()
