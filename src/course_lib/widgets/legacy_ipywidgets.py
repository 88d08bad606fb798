"""ipywidgets explorers for live Jupyter. Teaching content never lives only here: every lesson also shows
a static table or figure computed by the same library functions."""

from __future__ import annotations

import html
import math

from ..formats import FloatFormat, bit_string, decode, explain_value, get_format, list_formats
from ..gradients import summarize_underflow
from ..plots import plot_delayed_spike
from ..studies.fp8 import delayed_spike


def _fmt_number(x: float, digits: int | None = None) -> str:
    """Exact shortest repr by default (stored values), or ``digits`` significant digits (errors)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x)) if digits is None else f"{x:.{digits}g}"


# every cell on one line with room around it: a 32-bit pattern ran into the next column otherwise
_CELL = ' style="white-space: nowrap; padding: 0.1em 0.8em 0.1em 0"'


def explain_value_html(value: float, formats=None) -> str:
    """An HTML table of :func:`~course_lib.formats.explain_value` for one number."""
    rows = explain_value(value, formats)
    body = "".join(
        f"<tr><td{_CELL}>{html.escape(r.format)}</td><td{_CELL}><code>{html.escape(r.bits)}</code></td>"
        f"<td{_CELL}>{_fmt_number(r.stored)}</td><td{_CELL}>{_fmt_number(r.abs_error, 3)}</td>"
        f"<td{_CELL}>{_fmt_number(r.rel_error, 3)}</td></tr>"
        for r in rows
    )
    head = "".join(f"<th{_CELL}>{h}</th>" for h in ("format", "bits (sign exponent mantissa)", "stored value",
                                                     "absolute error", "relative error"))
    return ('<table style="border-collapse: collapse"><thead><tr>' + head + "</tr></thead><tbody>" + body
            + "</tbody></table>")


class FormatExplorer:
    """Type a number and see its bits in every format; pick a format and click bits to flip them.

    ``.widget`` is the ipywidgets container to display. The state (``value``, ``format``, ``code``) and
    the HTML shown are plain attributes so tests can drive the explorer without a browser.
    """

    def __init__(self, value: float = 0.1, format: str | FloatFormat = "FP16", formats=None):
        import ipywidgets as w

        self.formats = list_formats() if formats is None else [get_format(f) for f in formats]
        self.format = get_format(format)
        self.number = w.Text(value=str(value), description="number:", continuous_update=False)
        self.table = w.HTML()
        self.picker = w.Dropdown(options=[f.name for f in self.formats], value=self.format.name,
                                 description="flip bits of:")
        self.bits_box = w.HBox()
        self.decoded = w.HTML()
        self.number.observe(self._on_number, names="value")
        self.picker.observe(self._on_format, names="value")
        self.widget = w.VBox([self.number, self.table, self.picker, self.bits_box, self.decoded])
        self._buttons: list = []
        self.code = 0
        self._set_number(str(value))

    # -- state changes -------------------------------------------------------------------------------
    def _set_number(self, text: str) -> None:
        try:
            value = float(text)
        except ValueError:
            self.table.value = f"<b>{html.escape(text)!s} is not a number</b>"
            return
        self.value = value
        self.table.value = explain_value_html(value, self.formats)
        row = [r for r in explain_value(value, [self.format])][0]
        self.set_code(row.code if row.code is not None else 0)

    def set_code(self, code: int) -> None:
        """Show bit pattern ``code`` of the selected format as toggle buttons and its decoded value."""
        import ipywidgets as w

        f = self.format
        if not 0 <= code < 2**f.bits:
            raise ValueError(f"{f.name} codes lie in 0..{2**f.bits - 1}, got {code}")
        self.code = int(code)
        bits = format(self.code, f"0{f.bits}b")
        kinds = ["sign"] * f.sign_bits + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        styles = {"sign": "danger", "exponent": "info", "mantissa": "success"}
        self._buttons = []
        for i, (b, kind) in enumerate(zip(bits, kinds)):
            btn = w.ToggleButton(value=b == "1", description=b, button_style=styles[kind], tooltip=kind,
                                 layout=w.Layout(width="2.2em", padding="0"))
            btn.observe(lambda change, i=i: self.flip(i), names="value")
            self._buttons.append(btn)
        self.bits_box.children = tuple(self._buttons)
        value = float(decode(self.code, f))
        self.decoded.value = (f"{html.escape(f.name)} code <code>{bit_string(self.code, f)}</code> "
                              f"= <b>{_fmt_number(value)}</b>")

    def flip(self, position: int) -> None:
        """Flip bit ``position`` (0 = the most significant, leftmost bit) of the shown pattern."""
        f = self.format
        if not 0 <= position < f.bits:
            raise ValueError(f"{f.name} has bits 0..{f.bits - 1}, got {position}")
        self.set_code(self.code ^ (1 << (f.bits - 1 - position)))

    def _on_number(self, change) -> None:
        self._set_number(change["new"])

    def _on_format(self, change) -> None:
        self.format = get_format(change["new"])
        self._set_number(str(self.value))


def format_explorer(value: float = 0.1, format: str = "FP16", formats=None):
    """The explorer's widget, ready to display in Jupyter (see :class:`FormatExplorer`)."""
    return FormatExplorer(value, format, formats).widget


def loss_scale_explorer(values, fmt: str = "FP16"):
    """A slider over log2(loss scale): how much of ``values`` (gradients) survives, flushes or overflows
    in ``fmt``. The static page shows the same as :func:`course_lib.plots.plot_scale_sweep`."""
    import ipywidgets as w


    nonzero = values[values != 0]
    out = w.HTML()

    def show(change=None):
        s = summarize_underflow(nonzero, fmt, 2.0 ** slider.value)
        out.value = (f"loss scale 2<sup>{slider.value}</sup>: survive <b>{1 - s.lost:.2%}</b>, flushed to "
                     f"zero {s.flushed:.2%}, subnormal {s.subnormal:.2%}, overflow {s.overflow:.2%}")

    slider = w.IntSlider(value=0, min=-4, max=40, description="log2 scale:")
    slider.observe(show, names="value")
    show()
    return w.VBox([slider, out])


class DelayedScalingExplorer:
    """Sliders for delayed scaling's amax history length, margin and the spike's size, redrawing the
    spike figure (:func:`course_lib.plots.plot_delayed_spike`) and a one-line summary. The static page
    shows the same figure at Transformer Engine's defaults. ``summary`` and ``run`` are plain attributes so
    tests can drive the explorer without a browser."""

    def __init__(self, tensor, *, steps: int = 40, spike_at: int = 15):
        import ipywidgets as w

        self.tensor, self.steps, self.spike_at = tensor, steps, spike_at
        self.history = w.IntSlider(value=16, min=1, max=64, description="history:")
        self.margin = w.IntSlider(value=0, min=0, max=8, description="margin:")
        self.factor = w.FloatLogSlider(value=50.0, base=10, min=0, max=3, description="spike x:")
        self.summary = w.HTML()
        self.image = w.Image(format="png")
        for control in (self.history, self.margin, self.factor):
            control.observe(self._redraw, names="value")
        self.widget = w.VBox([w.HBox([self.history, self.margin, self.factor]), self.summary, self.image])
        self._redraw()

    def _redraw(self, change=None) -> None:
        import io


        self.run = delayed_spike(self.tensor, steps=self.steps, spike_at=self.spike_at, factor=self.factor.value,
                                 amax_history_len=self.history.value, margin=self.margin.value)
        parts = []
        for name, sat in self.run.saturated.items():
            err_after = self.run.relative_error[name][self.spike_at + 1:]
            parts.append(f"{html.escape(name)}: <b>{sat[self.spike_at]:.0%}</b> saturated at the spike, "
                         f"error after it up to {max(err_after, default=0.0):.3f}")
        self.summary.value = "<br>".join(parts)
        buffer = io.BytesIO()
        plot_delayed_spike(self.run).savefig(buffer, format="png", dpi=80)
        self.image.value = buffer.getvalue()


def delayed_scaling_explorer(tensor, **kwargs):
    """The explorer's widget, ready to display in Jupyter (see :class:`DelayedScalingExplorer`)."""
    return DelayedScalingExplorer(tensor, **kwargs).widget
