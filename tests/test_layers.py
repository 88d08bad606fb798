"""The library's layers, read from its imports (AST, nothing imported): a module imports only from its own
layer or below, every course_lib import sits at module top, no private name crosses a module, and there is
no import cycle. The README's map says the same in words.

Layers, bottom to top:
1. formats, hardware facts and timing (``formats``, ``hardware``, ``bench``, ``device``, ``tables``,
   ``results``);
2. quantisers, the scaler, the monitor's mechanisms and the other numeric tools; none of them imports the
   training loop or the course model;
3. models, data, training (and the processes that run it: ``distributed``);
4. studies (the registered experiments), their figures, and the tools built on them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "course_lib"

# top-level name under course_lib (a module or a package) -> layer
LAYERS: dict[str, int] = {
    "formats": 1, "hardware": 1, "bench": 1, "device": 1, "tables": 1, "results": 1, "jsonable": 1,
    "fp8": 2, "mx": 2, "scaling": 2, "monitor": 2, "gradients": 2, "magnitudes": 2, "amp": 2, "bf16": 2,
    "memory": 2, "overflow": 2, "reduction": 2,
    "data": 3, "models": 3, "train": 3, "distributed": 3,
    "studies": 4, "experiments": 4, "plots": 4, "checkup": 4, "selfcheck": 4, "record": 4, "widgets": 4,
    "exercises": 4, "glue": 4, "gpu_session": 4,
    # submodules that sit on another layer than their package
    "monitor.recovery": 3,      # rolls a run back and resumes it: drives the training loop
    "distributed.reduce": 2,    # the ring simulation and the reduction variants: arithmetic only
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "__init__"] = path
    return out


MODULES = _modules()


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(PACKAGE))
    except ValueError:   # a planted module in a test's folder
        return path.name


def _resolve(node: ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The course_lib modules an ``from X import a, b`` names: X itself, or X.a where that is a module."""
    if node.level == 0:
        if not (node.module or "").startswith("course_lib"):
            return []
        base = (node.module or "")[len("course_lib"):].lstrip(".")
    else:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        if module == "__init__":
            package = []
        keep = len(package) - (node.level - 1)
        base = ".".join([*package[:keep], *([node.module] if node.module else [])])
    targets = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        targets.append(sub if sub in MODULES else base)
    return [t for t in targets if t]


def _imports(module: str, path: Path):
    """(target module, imported names, at module top?) for every course_lib import of ``module``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    # an import under `if TYPE_CHECKING:` at top level counts as top-level
    for n in tree.body:
        if isinstance(n, ast.If):
            top.update(id(m) for m in n.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for target in set(_resolve(node, module, path)):
                yield target, [a.name for a in node.names], id(node) in top, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("course_lib."):
                    yield alias.name[len("course_lib."):], [], id(node) in top, node.lineno


def _layer(module: str) -> int | None:
    """The layer of the longest prefix of ``module`` that :data:`LAYERS` names."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return None


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _layer(m) is None and m != "__init__")
    assert not missing, f"modules with no layer in tests/test_layers.py: {missing}"


def test_no_module_imports_a_higher_layer():
    violations = []
    for module, path in MODULES.items():
        mine = _layer(module)
        if mine is None:
            continue
        for target, _, _, line in _imports(module, path):
            theirs = _layer(target)
            if theirs is not None and theirs > mine:
                violations.append(f"{_rel(path)}:{line}: {module} (layer {mine}) imports "
                                  f"{target} (layer {theirs})")
    assert not violations, "\n".join(violations)


def test_course_lib_imports_sit_at_module_top():
    hidden = [f"{_rel(path)}:{line}: imports {target} inside a function"
              for module, path in MODULES.items() for target, _, top, line in _imports(module, path) if not top]
    assert not hidden, "\n".join(hidden)


def test_no_private_name_crosses_a_module():
    crossing = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _resolve(node, module, path):
                crossing += [f"{_rel(path)}:{node.lineno}: imports {a.name}"
                             for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not crossing, "\n".join(crossing)


def test_no_import_cycle():
    graph = {m: {t for t, _, top, _ in _imports(m, p) if top and t != m} for m, p in MODULES.items()}

    def package_of(m: str) -> str:
        return m.rsplit(".", 1)[0] if "." in m else ""

    cycles = []

    def visit(node, stack, seen):
        for nxt in graph.get(node, ()):
            if nxt in stack:
                cycle = stack[stack.index(nxt):] + [nxt]
                # a package's __init__ re-exporting its own submodules is not a cycle between ideas
                if not all(package_of(a) == b or package_of(b) == a for a, b in zip(cycle, cycle[1:])):
                    cycles.append(" -> ".join(cycle))
            elif nxt not in seen:
                seen.add(nxt)
                visit(nxt, stack + [nxt], seen)

    for start in graph:
        visit(start, [start], {start})
    assert not cycles, "\n".join(sorted(set(cycles)))


@pytest.mark.parametrize("planted, check, expected", [
    ("from .train import TrainState\n", "test_no_module_imports_a_higher_layer", "imports train"),
    ("def f():\n    from .formats import get_format\n", "test_course_lib_imports_sit_at_module_top",
     "inside a function"),
    ("from .formats import _round_software\n", "test_no_private_name_crosses_a_module", "imports _round_software"),
    ("from .gradients import x\n", "test_no_import_cycle", "fp8 -> gradients -> fp8"),
])
def test_the_checks_fail_on_a_planted_violation(tmp_path, monkeypatch, planted, check, expected):
    """Each rule catches its violation, planted in a layer-2 module (``fp8``) that stands in for the real one."""
    fake = tmp_path / "fp8.py"
    fake.write_text(planted, encoding="utf-8")
    monkeypatch.setitem(MODULES, "fp8", fake)
    if check == "test_no_import_cycle":   # and gradients imports fp8 back
        back = tmp_path / "gradients.py"
        back.write_text("from .fp8 import y\n", encoding="utf-8")
        monkeypatch.setitem(MODULES, "gradients", back)
    with pytest.raises(AssertionError, match=expected):
        globals()[check]()


def test_module_size():
    """A module of more than about 600 lines holds two ideas: split it along its seams."""
    large = {_rel(p): n for p in MODULES.values()
             if (n := len(p.read_text(encoding="utf-8").splitlines())) > 650}
    assert not large, f"modules over 650 lines: {large}"
