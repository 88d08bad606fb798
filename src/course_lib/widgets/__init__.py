"""Explorers for the lessons that run in the page, in Jupyter and in the static book alike (see ``page``).

Teaching content never lives only here: every lesson also shows a static table or figure computed by the
same library functions the JavaScript ports. ``CHECKS`` maps each explorer (its ``data-explorer`` name) to
the function the browser check (tools/browser_check.py) runs on it in the built book: change an input, and
compare what the page then shows with what Python computes.
"""

from __future__ import annotations

from . import blocks, formats
from .blocks import block_explorer
from .formats import format_explorer
from .legacy_ipywidgets import delayed_scaling_explorer, loss_scale_explorer
from .page import Explorer, bundle

# the name each explorer mounts under (its JS module, without .js) -> its in-page check
CHECKS = {
    "format_explorer": formats.check_in_page,
    "block_explorer": blocks.check_in_page,
}

__all__ = ["CHECKS", "Explorer", "bundle", "block_explorer", "format_explorer", "loss_scale_explorer", "delayed_scaling_explorer"]
