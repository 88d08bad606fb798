"""Explorers for the lessons that run in the page, in Jupyter and in the static book alike (see ``page``).

Teaching content never lives only here: every lesson also shows a static table or figure computed by the
same library functions the JavaScript ports. ``CHECKS`` maps each explorer (its ``data-explorer`` name) to
the function the browser check (tools/browser_check.py) runs on it in the built book: change an input, and
compare what the page then shows with what Python computes.
"""

from __future__ import annotations

from . import blocks, delayed_scaling, formats, loss_scale
from .blocks import block_explorer
from .formats import format_explorer
from .loss_scale import loss_scale_explorer
from .delayed_scaling import delayed_scaling_explorer
from .page import Explorer, bundle

# the name each explorer mounts under (its JS module, without .js) -> its in-page check
CHECKS = {
    "format_explorer": formats.check_in_page,
    "block_explorer": blocks.check_in_page,
    "loss_scale_explorer": loss_scale.check_in_page,
    "delayed_scaling_explorer": delayed_scaling.check_in_page,
}

__all__ = ["CHECKS", "Explorer", "bundle", "block_explorer", "delayed_scaling_explorer", "format_explorer",
           "loss_scale_explorer"]
