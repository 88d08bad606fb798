"""Snapshot what executed lessons produce, and compare two snapshots: the check behind a refactoring that
must not move a number.

    python tools/snapshot_outputs.py save .nbbuild/lessons snapshot.json
    python tools/snapshot_outputs.py compare before.json after.json [--noise noise.json]

``save`` reads every executed notebook in a folder and keeps, per lesson, each glued value (myst-nb's
``glue``: its text/plain and text/markdown forms, by name) and every other Markdown or text output a cell
displayed (tables, sentences), in order. Figures are not compared (only counted): their data is glued
numbers and tables. ``compare`` prints what changed, lesson by lesson; keys listed in a noise file (two
baseline runs compared with ``--write-noise``: timings, which differ run to run) are reported apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _text(data: dict) -> str | None:
    for mime in ("text/markdown", "text/plain"):
        for key, value in data.items():
            if key.endswith(mime):
                return "".join(value) if isinstance(value, list) else str(value)
    return None


def snapshot_notebook(path: Path) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    glued: dict[str, str | None] = {}
    displays: list[str] = []
    figures = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            meta = out.get("metadata", {})
            name = (meta.get("scrapbook") or {}).get("name")
            if name is not None:
                glued[name] = _text(data)
                continue
            if any(k.startswith("image/") for k in data):
                figures += 1
                continue
            if out.get("output_type") == "stream":
                displays.append("".join(out.get("text", "")))
                continue
            text = _text(data)
            if text is not None:
                displays.append(text)
    return {"glue": glued, "displays": displays, "figures": figures}


def save(folder: Path, out: Path) -> None:
    snap = {p.stem: snapshot_notebook(p) for p in sorted(folder.glob("*.ipynb"))}
    if not snap:
        raise SystemExit(f"no executed notebooks in {folder}")
    out.write_text(json.dumps(snap, indent=1, sort_keys=True), encoding="utf-8")
    print(f"{out}: {sum(len(v['glue']) for v in snap.values())} glued values, "
          f"{sum(len(v['displays']) for v in snap.values())} displays from {len(snap)} lessons")


def _same(a: str | None, b: str | None) -> bool:
    """Equal up to trailing whitespace (a table that ends in a newline renders as one that does not)."""
    return (a or "").rstrip() == (b or "").rstrip() and (a is None) == (b is None)


def differences(before: dict, after: dict, *, only_after: bool = False) -> dict[str, list[str]]:
    """Per lesson, the glue names whose value changed or vanished, and the displays that changed;
    ``only_after`` compares just the lessons present in ``after`` (one lesson re-run)."""
    out: dict[str, list[str]] = {}
    lessons = set(after) if only_after else set(before) | set(after)
    for lesson in sorted(lessons):
        b, a = before.get(lesson), after.get(lesson)
        if b is None or a is None:
            out[lesson] = ["<lesson missing on one side>"]
            continue
        diffs = []
        for name in sorted(set(b["glue"]) | set(a["glue"])):
            if not _same(b["glue"].get(name), a["glue"].get(name)):
                diffs.append(f"glue:{name}")
        bd, ad = sorted(t.rstrip() for t in b["displays"]), sorted(t.rstrip() for t in a["displays"])
        diffs += [f"display-before:{text[:60]!r}" for text in bd if text not in ad]
        diffs += [f"display-after:{text[:60]!r}" for text in ad if text not in bd]
        if diffs:
            out[lesson] = diffs
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("folder", type=Path)
    s.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--noise", type=Path, help="keys known to differ between two runs of the same code")
    c.add_argument("--write-noise", type=Path, help="write the differences found as a noise file")
    c.add_argument("--only-after", action="store_true", help="compare only the lessons present in AFTER")
    c.add_argument("--verbose", action="store_true", help="print old and new values of each changed glue key")
    args = p.parse_args(argv)
    if args.cmd == "save":
        save(args.folder, args.out)
        return 0
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    diffs = differences(before, after, only_after=args.only_after)
    if args.write_noise:
        args.write_noise.write_text(json.dumps(diffs, indent=1), encoding="utf-8")
    noise = json.loads(args.noise.read_text()) if args.noise else {}
    changed = 0
    for lesson, keys in diffs.items():
        real = [k for k in keys if k not in noise.get(lesson, [])]
        known = len(keys) - len(real)
        if real:
            changed += len(real)
            print(f"{lesson}: {len(real)} changed" + (f" ({known} more known to vary run to run)" if known else ""))
            for k in real:
                print("   ", k)
                if args.verbose and k.startswith("glue:"):
                    name = k[5:]
                    print("       before:", repr(before[lesson]["glue"].get(name))[:200])
                    print("       after: ", repr(after.get(lesson, {}).get("glue", {}).get(name))[:200])
        elif known:
            print(f"{lesson}: unchanged ({known} known to vary run to run)")
    print("no change" if not changed else f"{changed} changes")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
