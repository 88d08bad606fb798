import pytest

from course_lib.widgets import FormatExplorer, explain_value_html, format_explorer


# ipywidgets is an optional extra (the lessons' set-up installs it; a bare GPU image may not have it).
needs_ipywidgets = pytest.mark.skipif(__import__("importlib").util.find_spec("ipywidgets") is None,
                                      reason="ipywidgets is not installed")


@needs_ipywidgets
def test_explorer_shows_bits_and_flips_them():
    e = FormatExplorer(1.0, "FP16")
    assert e.code == 0x3C00 and "0 01111 0000000000" in e.decoded.value
    assert len(e.bits_box.children) == 16
    e.flip(0)
    assert e.code == 0xBC00 and "<b>-1.0</b>" in e.decoded.value
    e._buttons[1].value = not e._buttons[1].value  # a click on the first exponent bit
    assert e.code == 0xFC00 and "-inf" in e.decoded.value
    with pytest.raises(ValueError, match="has bits 0..15"):
        e.flip(16)


@needs_ipywidgets
def test_explorer_follows_number_and_format():
    e = FormatExplorer(0.1)
    e.number.value = "65520"
    assert "inf" in e.decoded.value and "FP8 E4M3" in e.table.value
    e.picker.value = "FP8 E4M3"
    assert e.code == 0x7E and "448" in e.decoded.value
    e.number.value = "abc"
    assert "is not a number" in e.table.value
    assert format_explorer().children


def test_static_html_table():
    html = explain_value_html(0.1, ["FP16"])
    assert "0 01011 1001100110" in html and "0.0999755859375" in html
    # every cell keeps its content on one line, so a long bit pattern cannot spill into the next column
    assert html.count("<td") == 5 and html.count("white-space: nowrap") == 10


@needs_ipywidgets
def test_delayed_scaling_explorer_follows_its_sliders():
    import torch

    from course_lib.widgets import DelayedScalingExplorer
    e = DelayedScalingExplorer(torch.linspace(-1, 1, 64).reshape(8, 8), steps=20, spike_at=5)
    assert e.image.value[:4] == b"\x89PNG"
    assert e.run.saturated["current"][5] == 0.0
    assert e.run.saturated["delayed, max of 16"][5] > 0.5
    e.margin.value = 8       # 2**8 of headroom absorbs a 50x spike
    assert e.run.saturated["delayed, max of 16"][5] == 0.0 and "0%" in e.summary.value
    e.history.value = 2
    assert "delayed, max of 2" in e.run.saturated
