"""The explorers' plumbing (course_lib.widgets.page): bundling, the HTML an output carries, and mounting in
a real page (headless Chromium). Each explorer's arithmetic has its own test file, against Python."""

import json

import pytest

from course_lib.widgets import Explorer, bundle, format_explorer
from course_lib.widgets import page as page_module


def test_bundle_inlines_imports_once_and_drops_exports():
    source = bundle("format_explorer.js")
    assert "import " not in source and "\nexport " not in source
    assert source.count("// ---- codecs.js") == 1 and source.count("// ---- page.js") == 1
    # dependencies first: the entry comes last
    assert source.index("// ---- codecs.js") < source.index("// ---- format_explorer.js")
    assert bundle("codecs.js", expose=("decode", "encode")).endswith("globalThis.courseLib = { decode, encode };")


def test_bundle_refuses_what_it_cannot_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(page_module, "JS_DIR", tmp_path)
    (tmp_path / "a.js").write_text('import { b } from "./b.js";\nexport function a() { return b(); }\n')
    (tmp_path / "b.js").write_text('import { a } from "./a.js";\nexport function b() { return 1; }\n')
    (tmp_path / "c.js").write_text("export default 3;\n")
    (tmp_path / "d.js").write_text('import x from "./a.js";\n')
    (tmp_path / "e.js").write_text("export const x = 1;\n")
    with pytest.raises(ValueError, match="import cycle in the explorer modules: a.js -> b.js -> a.js"):
        bundle("a.js")
    with pytest.raises(ValueError, match="c.js:1: export only declarations"):
        bundle("c.js")
    with pytest.raises(ValueError, match="d.js:1: write imports as one line"):
        bundle("d.js")
    with pytest.raises(ValueError, match="no explorer module 'nope.js'"):
        bundle("nope.js")
    (tmp_path / "f.js").write_text('import { x } from "./e.js";\nconst x2 = 1;\nconst x = 2;\n')
    with pytest.raises(ValueError, match="f.js:3: 'x' is declared at top level in e.js too"):
        bundle("f.js")
    with pytest.raises(TypeError, match="entry must be a file name"):
        bundle(3)
    with pytest.raises(ValueError, match="not a JavaScript identifier"):
        bundle("e.js", expose=("x; alert(1)",))


def test_explorer_html_carries_its_config_safely():
    e = Explorer("format_explorer.js", {"value": "</script><script>alert(1)</script>", "x": 0.1}, "t")
    markup = e._repr_html_()
    config = markup.split('class="course-explorer-config">')[1].split("</script>")[0]
    assert "</" not in config and json.loads(config)["value"].startswith("</script>")
    assert json.loads(config)["x"] == 0.1
    assert markup.count('<script type="module">') == 1 and "needs JavaScript" in markup
    with pytest.raises(ValueError, match="must be finite numbers"):
        Explorer("format_explorer.js", {"x": [float("inf")]}, "t").html()


def test_format_explorer_refuses_bad_arguments():
    with pytest.raises(ValueError, match="not among the explorer's formats"):
        format_explorer(1.0, "FP16", formats=["BF16"])
    with pytest.raises(ValueError, match="unknown format"):
        format_explorer(1.0, "FP17")
    with pytest.raises(TypeError, match="value must be a number"):
        format_explorer([1.0])


def test_two_explorers_on_one_page_mount_independently(page_with):
    page = page_with(format_explorer(1.0).html() + format_explorer(2.0, "BF16").html())
    page.wait_for_function("() => document.querySelectorAll('.course-explorer[data-mounted]').length === 2")
    decoded = page.locator("[data-role=decoded]")
    assert decoded.nth(0).text_content() == "1" and decoded.nth(1).text_content() == "2"


def test_a_failing_start_shows_a_message_in_the_explorer(page_with):
    markup = Explorer("format_explorer.js", {"format": "FP17"}, "t").html()
    page = page_with(markup)
    page.wait_for_selector(".course-explorer-message")
    assert "this explorer failed to start: unknown format" in page.locator(".course-explorer").text_content()
