"""Explorers that run in the page: small JavaScript modules (``js/``) embedded in a cell's HTML output.

The same output works in Jupyter (a trusted output runs its scripts) and in the static book (myst-nb keeps
the HTML, scripts included), with no kernel, no widget manager and nothing fetched: each explorer's output
carries its configuration as JSON and its code as one inline ``<script type="module">``, bundled here from
``js/``. The JavaScript is a port of the library's own arithmetic, and tests/test_widgets.py runs it in
Chromium against the Python functions it ports, bit for bit.

Bundling is deliberately tiny: a module imports only from sibling files (``import { a, b } from "./x.js";``
on one line) and exports only declarations (``export function`` / ``export const``); :func:`bundle` inlines
the imports, each file once, dependencies first, and drops the ``export`` keywords. A module script has its
own scope, so two explorers on one page do not collide.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JS_DIR = Path(__file__).with_name("js")
_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([\w-]+\.js)";\s*$')
_EXPORT_DECLARATION = re.compile(r"^export (?=(async )?function |const |let |class )")
_OTHER_EXPORT = re.compile(r"^export\b")
# a top-level declaration (the bundle puts every module in one scope: two with one name break the script)
_TOP_LEVEL = re.compile(r"^(?:export )?(?:async )?(?:function\*?|const|let|class)\s+([A-Za-z_$][\w$]*)")


def _module_source(name: str) -> str:
    path = JS_DIR / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in JS_DIR.glob("*.js")))
        raise ValueError(f"no explorer module {name!r} in {JS_DIR}; known: {known}")
    return path.read_text(encoding="utf-8")


def bundle(entry: str, *, expose: tuple[str, ...] = ()) -> str:
    """The module ``entry`` (a file in ``js/``) and everything it imports, as one script's source.

    ``expose`` names top-level functions or constants to publish as ``globalThis.courseLib`` (the tests call
    the arithmetic through it; the book's explorers expose nothing)."""
    if not isinstance(entry, str):
        raise TypeError(f"entry must be a file name such as 'format_explorer.js', not {type(entry).__name__}")
    done: list[str] = []
    parts: list[str] = []
    declared: dict[str, str] = {}   # top-level name -> the module that declares it

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in chain:
            raise ValueError(f"import cycle in the explorer modules: {' -> '.join((*chain, name))}")
        if name in done:
            return
        body = []
        for number, line in enumerate(_module_source(name).splitlines(), start=1):
            imported = _IMPORT.match(line)
            if imported:
                add(imported.group(2), (*chain, name))
                continue
            if line.startswith("import "):
                raise ValueError(f"{name}:{number}: write imports as one line, "
                                 f'import {{ a, b }} from "./file.js"; got {line!r}')
            top = _TOP_LEVEL.match(line)
            if top:
                if top.group(1) in declared and declared[top.group(1)] != name:
                    raise ValueError(f"{name}:{number}: {top.group(1)!r} is declared at top level in "
                                     f"{declared[top.group(1)]} too; the bundle shares one scope, rename one")
                declared[top.group(1)] = name
            if _EXPORT_DECLARATION.match(line):
                line = line[len("export "):]
            elif _OTHER_EXPORT.match(line):
                raise ValueError(f"{name}:{number}: export only declarations (export function/const), got {line!r}")
            body.append(line)
        done.append(name)
        parts.append(f"// ---- {name}\n" + "\n".join(body))

    add(entry, ())
    if expose:
        for name in expose:
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise ValueError(f"cannot expose {name!r}: not a JavaScript identifier")
        parts.append(f"globalThis.courseLib = {{ {', '.join(expose)} }};")
    return "\n".join(parts)


def _json_for_html(config: Any) -> str:
    """JSON that is safe inside a <script> element (no "</" to close it early) and exact for floats:
    Python's repr of a float reads back to the same double in JavaScript; inf and NaN are refused."""
    def check(x: Any) -> None:
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"an explorer's configuration must be finite numbers, got {x}")
        if isinstance(x, dict):
            for v in x.values():
                check(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                check(v)

    check(config)
    return json.dumps(config, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


@dataclass(frozen=True)
class Explorer:
    """An explorer ready to display: Jupyter and the book show :meth:`html` (``_repr_html_``).

    ``module``: the entry file in ``js/``, which exports ``mount(element, config)``; ``config``: JSON-able
    data it starts from; ``title``: what it explores, also shown where scripts do not run."""

    module: str
    config: dict
    title: str

    def html(self) -> str:
        name = self.module.removesuffix(".js")
        config = _json_for_html(self.config)
        key = hashlib.sha256((name + config).encode()).hexdigest()[:12]
        source = bundle(self.module)
        return (
            f'<div class="course-explorer" data-explorer="{html.escape(name)}" data-key="{key}">'
            f'<script type="application/json" class="course-explorer-config">{config}</script>'
            f"<noscript>{html.escape(self.title)}: this explorer runs in the browser and needs JavaScript; "
            "the table or figure beside it shows the same.</noscript></div>\n"
            f'<script type="module">\n{source}\nmountAll({json.dumps(name)}, mount);\n</script>'
        )

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"<{self.title}: an explorer that runs in the browser (shown as HTML in Jupyter and the book)>"
