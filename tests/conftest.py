import os

# Under pytest-xdist (make unit runs one worker per core) each worker keeps torch to one thread: two workers
# each spinning two OpenMP threads on two cores ran the suite slower than one process did. Set before
# anything imports torch; an explicit OMP_NUM_THREADS wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import matplotlib  # noqa: E402
import pytest  # noqa: E402

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _no_size_override(monkeypatch):
    """Tests choose the size profile explicitly; an outer COURSE_SIZE must not leak in."""
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    yield


@pytest.fixture
def small_profile():
    from course_lib.device import SizeProfile

    return SizeProfile("small")


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (Debian's, driven by Playwright), for the explorers' JavaScript; skipped where it is
    missing, and failing instead where $BROWSER_CHECK_REQUIRED is set (CI), so a broken install cannot pass."""
    import os
    import shutil

    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or CHROMIUM
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        reason = f"Playwright is not installed ({error})"
        path = None
    else:
        reason = f"no Chromium at {path}"
    if path is None or not os.access(path, os.X_OK):
        if os.environ.get("BROWSER_CHECK_REQUIRED"):
            pytest.fail(f"{reason}, and BROWSER_CHECK_REQUIRED is set")
        pytest.skip(reason)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def page_with(chromium):
    """``page_with(html)``: a fresh page showing ``html``; it fails the test on any script error or console
    error the page reports (an explorer that throws must not pass)."""
    pages, errors = [], []

    def open_page(markup: str, *, width: int = 1000):
        page = chromium.new_page(viewport={"width": width, "height": 800})
        page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
        page.on("console", lambda m: errors.append(f"console error: {m.text}") if m.type == "error" else None)
        page.set_content(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{markup}</body></html>")
        page.wait_for_function("() => document.readyState === 'complete'")
        pages.append(page)
        return page

    yield open_page
    for page in pages:
        page.close()
    assert not errors, errors
