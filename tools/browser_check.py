"""Check the built book in a real browser, offline.

    python tools/browser_check.py _build/html --toc _toc.yml --screenshots _build/screenshots

Serves the built site on 127.0.0.1 (a free port), opens every page of the table of contents in Debian's
headless Chromium through Playwright (``/usr/bin/chromium`` or $CHROMIUM; no browser is downloaded) and
aborts every request that is not to that server, so the site is checked as a reader without a network
sees it. A page passes when

- it loads (HTTP 200), nothing it asks for fails (no 4xx/5xx, no request that had to leave the machine),
  its console has no error and no script throws;
- every ``<img>`` has loaded (natural width > 0);
- its visible text (code aside) holds no raw TeX delimiters (``\\(``, ``\\)``, ``\\[``, ``\\]``, ``$$``)
  and no unresolved glue role or substitution;
- where it has math, MathJax typeset every formula (an ``mjx-container`` in each) with no TeX error;
- every explorer (``course_lib.widgets``: a ``.course-explorer`` output with its own inline script) started,
  and responds: its check in ``course_lib.widgets.CHECKS`` changes one input and compares what the page
  then shows with what Python computes from the same configuration; an explorer without a check, one that
  failed to start, and an ipywidgets output (which cannot compute in a static page) are problems;
- no character of its text is drawn as a box (no installed font has it: an emoji on a plain Linux machine),
  and no cell output reports matplotlib's "Glyph ... missing from font(s)" (a box inside a figure);
- no code cell, cell output or code block a reader sees without a click scrolls sideways at the check's
  1280-px window (what lies beyond the edge, often a comment, is missed), nor a folded code cell once
  opened (a reader opens it to read the code); folded outputs and blocks in closed dropdowns are the
  reader's choice to open;
- it weighs at most ``PAGE_WEIGHT_LIMIT`` bytes: the bodies of everything it loads (the HTML, scripts,
  styles, fonts, images; lazy images made to load, counted once the network is idle, so late fonts and
  MathJax's pieces count), each fetched afresh (routing every request turns Chromium's cache off) and
  uncompressed, as this server sends them (a server that gzips sends fewer). A page above it fails naming
  its heaviest resources.

A full-page screenshot of each page is saved for a person to look at. A table (page, status, weight,
problems) and the lightest and heaviest page's weight are printed; the exit status is 1 if any page has
a problem. Where Playwright or Chromium is missing the check prints that it was SKIPPED and why, and
exits 0, or 1 when $BROWSER_CHECK_REQUIRED is set (CI, which installs Chromium, sets it, so a broken
install cannot pass as a skip).

This is a tool for the book's build, not course material, so it lives in tools/ rather than course_lib;
tests/test_browser_check.py plants broken pages and checks that each failure is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-quic", "--no-first-run", "--disable-sync"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
EXPLORER = ".course-explorer"
# in the page's text, outside code: TeX that MathJax did not typeset, glue or substitutions left unresolved,
# and a Python object's default repr (a Markdown object glued with {glue:text} instead of {glue:md})
RAW_TEXT_PATTERNS = {
    "raw TeX": re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$"),
    "unresolved glue": re.compile(r"\{glue(?::\w+)?\}|\{\{\s*\w+\s*\}\}"),
    "a Python object's repr": re.compile(r"<[\w.]+ object(?: at 0x[0-9a-fA-F]+)?>"),
}
# a glued value that is a Python str shows its repr, quotes and all ('6 recipes'): glue it as Markdown (Prose)
_QUOTED_GLUE_JS = """() => [...document.querySelectorAll('.pasted-text')]
  .map(e => e.textContent.trim()).filter(t => /^'.*'$|^".*"$/.test(t))"""
# [what, widest line] of each preformatted box a reader sees that is wider than its box: a code cell's input
# (a folded one opened, as a reader opens it to read the code), a cell's output (a folded one opened too),
# and a code block of the page's Markdown (one in a closed dropdown left out: the reader has not opened it)
_WIDE_CODE_JS = """() => {
  const widest = e => e.textContent.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '');
  // checkVisibility: false inside a closed <details> (Chromium keeps its content laid out, unrendered)
  const wide = e => e.checkVisibility() && e.scrollWidth > e.clientWidth + 1;
  const pick = (what, selector, keep) => [...document.querySelectorAll(selector)]
    .filter(e => keep(e) && wide(e)).map(e => [what, widest(e)]);
  // a folded code cell's input, opened as a reader opens it to read the code, then folded again
  const folded = [...document.querySelectorAll('div.cell.tag_hide-input details')].filter(d => !d.open);
  folded.forEach(d => { d.open = true; });
  const opened = pick('a folded code cell, opened,', 'div.cell.tag_hide-input div.cell_input pre', e => true);
  folded.forEach(d => { d.open = false; });
  // the same for a folded output (a listing of library source, say), opened to be read
  const foldedOut = [...document.querySelectorAll('div.cell.tag_hide-output details')].filter(d => !d.open);
  foldedOut.forEach(d => { d.open = true; });
  const openedOut = pick('a folded cell output, opened,', 'div.cell.tag_hide-output div.cell_output pre',
                         e => true);
  foldedOut.forEach(d => { d.open = false; });
  return [
    ...pick('a code cell', 'div.cell:not(.tag_hide-input):not(.tag_hide-cell) div.cell_input pre', e => true),
    ...opened,
    ...pick('a cell output', 'div.cell:not(.tag_hide-output):not(.tag_hide-cell) div.cell_output pre',
            e => true),
    ...openedOut,
    ...pick('a code block', 'pre', e => !e.closest('div.cell')),
  ];
}"""
# matplotlib's warning, shown in a cell's stderr output, when a figure's text has a character its font lacks
FIGURE_GLYPH_MISSING = re.compile(r"Glyph \d+ \(.*?\) missing from (?:current )?font")
LOAD_TIMEOUT_MS = 30_000
RENDER_TIMEOUT_MS = 15_000
# bytes a page may load in all (decimal: 3 MB); a reader on a slow or metered line pays for each one
PAGE_WEIGHT_LIMIT = 3_000_000
HEAVIEST_NAMED = 5   # resources named when a page is too heavy


@dataclass
class PageResult:
    page: str
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    images: int = 0       # what was checked, so a pass says something: <img> elements,
    formulas: int = 0     # formulas (elements of class "math"),
    explorers: int = 0    # explorers checked
    seconds: float = 0.0
    resources: dict[str, int] = field(default_factory=dict)   # what it loaded (path on the site) -> bytes

    @property
    def weight(self) -> int:
        """Bytes the page loaded: the bodies of its document and of every resource it fetched."""
        return sum(self.resources.values())

    def heaviest(self, count: int = HEAVIEST_NAMED) -> list[tuple[str, int]]:
        return sorted(self.resources.items(), key=lambda item: (-item[1], item[0]))[:count]

    @property
    def status(self) -> str:
        return "ok" if not self.problems else "FAIL"


# -- what to check --------------------------------------------------------------------------------------
def format_bytes(size: int) -> str:
    """``size`` bytes in decimal units: 1.49 MB, 86 KB, 512 B."""
    if size >= 1_000_000:
        return f"{size / 1_000_000:.2f} MB"
    return f"{size / 1000:.0f} KB" if size >= 1000 else f"{size} B"


def weight_problem(result: PageResult, limit: int = PAGE_WEIGHT_LIMIT) -> str | None:
    """The problem of a page that loads more than ``limit`` bytes, naming its heaviest resources."""
    if result.weight <= limit:
        return None
    heaviest = ", ".join(f"{name} {format_bytes(size)}" for name, size in result.heaviest())
    return f"page weighs {format_bytes(result.weight)}, above the {format_bytes(limit)} limit; heaviest: {heaviest}"


# Pages Sphinx writes beside the toc's: the search box opens search.html on every page.
SPHINX_PAGES = ("search.html",)


def pages_from_toc(toc: Path) -> list[str]:
    """The HTML pages of a Jupyter Book ``_toc.yml``, in its order (``root`` first)."""
    import yaml

    data = yaml.safe_load(toc.read_text())
    files: list[str] = [data["root"]]

    def walk(entries) -> None:
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            for key in ("sections", "chapters"):
                walk(entry.get(key))
            for part in entry.get("parts", []) or []:
                walk(part.get("chapters"))

    for part in data.get("parts", []) or []:
        walk(part.get("chapters"))
    walk(data.get("chapters"))
    walk(data.get("sections"))
    return [re.sub(r"\.(md|ipynb|rst)$", "", f) + ".html" for f in files]


def chromium_path() -> str | None:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return path if Path(path).is_file() and os.access(path, os.X_OK) else None


def unavailable() -> str | None:
    """Why the check cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as error:
        return f"Playwright's Python package is not installed ({error}); `make setup` installs it"
    if chromium_path() is None:
        return ("no Chromium ($CHROMIUM, `chromium` on the PATH or /usr/bin/chromium): install Debian's "
                "package, `apt-get install chromium` (.ci/run does)")
    return None


# -- serving --------------------------------------------------------------------------------------------
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 at a free port, in a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- in the page ----------------------------------------------------------------------------------------
# Text nodes outside code, scripts, styles and typeset math: what a reader reads as prose.
_VISIBLE_TEXT_JS = """() => {
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight, noscript';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const parts = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement || node.parentElement.closest(skip)) continue;
    parts.push(node.nodeValue);
  }
  return parts.join(' ');
}"""

_IMAGES_JS = """async () => {
  const images = [...document.images];
  images.forEach(i => { i.loading = 'eager'; });
  await Promise.all(images.map(i => i.complete ? null : new Promise(r => {
    i.addEventListener('load', r); i.addEventListener('error', r); setTimeout(r, 10000); })));
  // a figure's image needs a text alternative: none, or its own path (what the HTML writer puts there when
  // a figure gives none), says nothing to a screen reader
  const undescribed = [...document.querySelectorAll('figure img')].filter(i => {
    const alt = (i.getAttribute('alt') || '').trim();
    return !alt || /\.(png|svg|jpe?g|gif|webp)$/i.test(alt); }).map(i => i.getAttribute('src'));
  return {count: images.length,
          missing: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src')),
          undescribed};
}"""

_MATH_JS = """async () => {
  const formulas = [...document.querySelectorAll('.math')];
  if (!formulas.length) return {formulas: 0};
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try { await MathJax.startup.promise; } catch (e) { return {formulas: formulas.length, error: String(e)}; }
  }
  return {
    formulas: formulas.length,
    untypeset: formulas.filter(f => !f.querySelector('mjx-container')).map(f => f.textContent.slice(0, 60)),
    errors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
    mathjax: !!window.MathJax,
  };
}"""

# A character no installed font has is drawn as the font's .notdef box; U+0378 is unassigned, so its
# drawing is that box. Every non-ASCII character of the text is drawn in its element's font and compared.
_GLYPH_BOXES_JS = """() => {
  const skip = 'script, style, noscript, mjx-container';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Map();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement || node.parentElement.closest(skip)) continue;
    const family = getComputedStyle(node.parentElement).fontFamily;
    for (const ch of node.nodeValue) {
      if (ch.codePointAt(0) > 0x7e && !/\\s/.test(ch)) seen.set(family + '\\u0000' + ch, [family, ch]);
    }
  }
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 64;
  const g = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (ch, family) => {
    g.clearRect(0, 0, 64, 64); g.font = '40px ' + family; g.fillText(ch, 4, 48);
    return g.getImageData(0, 0, 64, 64).data.join(',');
  };
  const boxes = new Set(), box = new Map();
  for (const [family, ch] of seen.values()) {
    if (!box.has(family)) box.set(family, draw('\\u0378', family));
    if (draw(ch, family) === box.get(family)) boxes.add(ch);
  }
  return [...boxes].map(ch => ch + ' (U+' + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, '0') + ')');
}"""

def explorer_checks() -> dict:
    """Each explorer's in-page check (``course_lib.widgets.CHECKS``); empty where course_lib is not importable."""
    try:
        from course_lib.widgets import CHECKS
    except ImportError:
        return {}
    return dict(CHECKS)


def check_explorers(page, checks: dict | None = None) -> tuple[int, list[str]]:
    """Start-up and response of every explorer on ``page``: (explorers found, problems)."""
    import json

    checks = explorer_checks() if checks is None else checks
    problems = []
    if page.locator(f'script[type="{WIDGET_VIEW}"]').count():
        problems.append("an ipywidgets output: it needs a kernel and cannot compute in the static book; "
                        "use a course_lib.widgets explorer")
    explorers = page.locator(EXPLORER)
    count = explorers.count()
    for i in range(count):
        root = explorers.nth(i)
        name = root.get_attribute("data-explorer") or "?"
        label = f"explorer {i + 1} ({name})"
        try:
            page.wait_for_function("(e) => e.dataset.mounted === '1'", arg=root.element_handle(),
                                   timeout=RENDER_TIMEOUT_MS)
        except Exception:
            problems.append(f"{label} did not start (its script did not run)")
            continue
        message = root.locator(".course-explorer-message").first
        if message.count() and "failed to start" in (message.text_content() or ""):
            problems.append(f"{label}: {message.text_content()[:200]}")
            continue
        if name not in checks:
            problems.append(f"{label} has no check in course_lib.widgets.CHECKS, so nothing tests that it responds")
            continue
        config = json.loads(root.locator("script.course-explorer-config").first.text_content() or "{}")
        try:
            problems += [f"{label}: {p}" for p in checks[name](root, config)]
        except Exception as error:   # a check that times out waiting for a change: the explorer did not respond
            problems.append(f"{label}: its check failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    return count, problems


def _weigh(requests, base_url: str) -> dict[str, int]:
    """Bytes of each response body, by its path on the site (query dropped; a path fetched twice counts twice)."""
    sizes: dict[str, int] = {}
    for request in requests:
        if not request.url.startswith(base_url):   # data: URLs are in their page's bytes; others were blocked
            continue
        try:
            size = max(0, request.sizes()["responseBodySize"])
        except Exception:   # the page crashed or closed before the body came: nothing of it to count
            continue
        name = request.url[len(base_url):].split("#")[0].split("?")[0] or "/"
        sizes[name] = sizes.get(name, 0) + size
    return sizes


def check_page(context, base_url: str, page_path: str, screenshots: Path | None) -> PageResult:
    """Open one page in ``context`` (a Playwright browser context) and collect its problems."""
    result = PageResult(page_path)
    started = time.monotonic()
    problems = result.problems
    page = context.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text[:200]}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"script error: {str(e)[:200]}"))
    page.on("requestfailed", lambda r: problems.append(
        f"request failed ({r.failure}): {r.url[:160]}" if r.url.startswith(base_url) else f"blocked request off the machine: {r.url[:160]}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url[:160]}") if r.status >= 400 else None)
    finished = []   # every request that completed, weighed at the end, once the network is idle
    page.on("requestfinished", lambda r: finished.append(r))
    try:
        response = page.goto(base_url + page_path, wait_until="load", timeout=LOAD_TIMEOUT_MS)
        if response is None or response.status != 200:
            problems.append(f"page did not load (HTTP {response.status if response else 'none'})")
            return result
        images = page.evaluate(_IMAGES_JS)
        result.images = images["count"]
        problems += [f"image not loaded: {src}" for src in images["missing"]]
        problems += [f"figure image without a text alternative (alt): {src}" for src in images["undescribed"]]
        math = page.evaluate(_MATH_JS)
        result.formulas = math["formulas"]
        if math.get("error"):
            problems.append(f"MathJax failed: {math['error'][:200]}")
        elif math["formulas"]:
            if not math["mathjax"]:
                problems.append(f"{math['formulas']} formula(s) and no MathJax on the page")
            elif math["untypeset"]:
                problems.append(f"{len(math['untypeset'])} of {math['formulas']} formulas not typeset, "
                                f"first: {math['untypeset'][0]!r}")
            problems += [f"TeX error: {e[:120]}" for e in math["errors"]]
        result.explorers, found = check_explorers(page)
        problems += found
        problems += [f"drawn as a box (no font has it): {ch}" for ch in page.evaluate(_GLYPH_BOXES_JS)]
        problems += [f"a figure lacks a glyph: {m.group(0)}"
                     for m in FIGURE_GLYPH_MISSING.finditer(page.evaluate("() => document.body.innerText"))][:3]
        text = page.evaluate(_VISIBLE_TEXT_JS)
        for name, pattern in RAW_TEXT_PATTERNS.items():
            matches = list(pattern.finditer(text))
            if matches:
                first = matches[0]
                snippet = " ".join(text[max(0, first.start() - 40):first.end() + 40].split())
                problems.append(f"{name} in the text ({len(matches)}x), first: ...{snippet}...")
        problems += [f"glued text shown as a Python string: {t[:80]}" for t in page.evaluate(_QUOTED_GLUE_JS)][:3]
        problems += [f"{what} scrolls sideways, widest line: {t.strip()[:80]}"
                     for what, t in page.evaluate(_WIDE_CODE_JS)][:3]
        with contextlib.suppress(Exception):
            page.wait_for_load_state("networkidle", timeout=5_000)
        if screenshots is not None:
            result.screenshot = screenshots / (page_path.replace("/", "__").removesuffix(".html") + ".png")
            result.screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(result.screenshot), full_page=True)
    except Exception as error:   # a Playwright timeout or a crashed page is this page's problem
        problems.append(f"check failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    finally:
        result.resources = _weigh(finished, base_url)   # however far the check got
        problems += [p for p in [weight_problem(result)] if p]
        page.close()
        result.seconds = time.monotonic() - started
    return result


def check_site(site: Path, pages: list[str], screenshots: Path | None = None) -> list[PageResult]:
    """Check ``pages`` (paths relative to ``site``) in Chromium with every off-machine request aborted."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError(unavailable() or "no Chromium")
    results = []
    with serve(site) as base_url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base_url)
                          else route.abort("blockedbyclient"))
            for page_path in pages:
                results.append(check_page(context, base_url, page_path, screenshots))
            context.close()
        finally:
            browser.close()
    return results


def format_table(results: list[PageResult]) -> str:
    width = max([len("page")] + [len(r.page) for r in results])
    lines = [f"{'page':<{width}}  status  seconds   weight  images  formulas  explorers  problems",
             f"{'-' * width}  ------  -------  -------  ------  --------  -------  --------"]
    for r in results:
        first = r.problems[0] if r.problems else "-"
        more = f" (+{len(r.problems) - 1} more)" if len(r.problems) > 1 else ""
        lines.append(f"{r.page:<{width}}  {r.status:<6}  {r.seconds:7.1f}  {format_bytes(r.weight):>7}  {r.images:6}  "
                     f"{r.formulas:8}  {r.explorers:9}  {first}{more}")
    failing = [r for r in results if r.problems]
    for r in failing:
        lines.append(f"\n{r.page}:")
        lines += [f"  - {p}" for p in r.problems]
    return "\n".join(lines)


def weight_summary(results: list[PageResult], limit: int = PAGE_WEIGHT_LIMIT) -> str:
    """One line: the lightest and the heaviest page, and the limit."""
    if not results:
        return "page weight: no pages"
    lightest = min(results, key=lambda r: r.weight)
    heaviest = max(results, key=lambda r: r.weight)
    return (f"page weight: min {format_bytes(lightest.weight)} ({lightest.page}), max {format_bytes(heaviest.weight)} "
            f"({heaviest.page}); limit {format_bytes(limit)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built HTML folder, e.g. _build/html")
    parser.add_argument("--toc", type=Path, default=Path("_toc.yml"))
    parser.add_argument("--screenshots", type=Path, default=None, help="folder for one PNG per page")
    args = parser.parse_args(argv)

    reason = unavailable()
    if reason is not None:
        required = bool(os.environ.get("BROWSER_CHECK_REQUIRED"))
        print(f"\n*** browser check SKIPPED: {reason} ***"
              + ("\n*** BROWSER_CHECK_REQUIRED is set: failing ***" if required else "") + "\n", flush=True)
        return 1 if required else 0
    pages = pages_from_toc(args.toc) + list(SPHINX_PAGES)
    missing = [p for p in pages if not (args.site / p).is_file()]
    if missing:
        print(f"browser check: pages of {args.toc} missing from {args.site}: {', '.join(missing)}")
        return 1
    if args.screenshots is not None and args.screenshots.exists():
        shutil.rmtree(args.screenshots)
    started = time.monotonic()
    results = check_site(args.site, pages, args.screenshots)
    print(format_table(results))
    print(f"\n{weight_summary(results)}")
    failed = sum(1 for r in results if r.problems)
    shots = f"; screenshots in {args.screenshots}" if args.screenshots is not None else ""
    print(f"\nbrowser check: {len(results) - failed} of {len(results)} pages ok, offline, in "
          f"{time.monotonic() - started:.0f} s{shots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
