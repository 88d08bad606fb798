"""`make lab`: JupyterLab serves the lessons as notebooks, and a kernel it starts runs them.

The server starts headless on 127.0.0.1 at a free port with a token, as `make lab` starts it (same
installation, same root), with the reader's own Jupyter settings kept out. Through its REST API a lesson
opens as a notebook (jupytext's contents manager), the settings open Markdown with jupytext's notebook view,
the page loads the jupytext extension, and a kernel started for the lesson executes its first
code cells through the server's websocket, as JupyterLab's front end does. The server is always shut down.
`make test` installs requirements-lab.txt before the unit tests, so there this test runs; elsewhere it is
skipped when JupyterLab is not installed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSON = "lessons/01_formats.md"
FIRST_CODE_CELLS = 4      # the banner, the imports, a figure, a table: torch, course_lib and matplotlib
START_TIMEOUT_S = 90      # a cold start on the 2-core CI machine takes a few seconds
CELL_TIMEOUT_S = 120

_MISSING = None
try:
    import jupyterlab  # noqa: F401
    import websocket   # websocket-client, a dependency of jupyter_server
except ImportError as exc:  # pragma: no cover - depends on the installation
    _MISSING = str(exc)

if _MISSING is not None and os.environ.get("CI"):  # pragma: no cover
    raise RuntimeError(f"CI must run the JupyterLab test, but {_MISSING}: `make unit` installs "
                       "requirements-lab.txt first")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"JupyterLab is not installed ({_MISSING}); "
                                "`make lab` or `make unit` installs requirements-lab.txt")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(self, base: str, token: str, log: Path):
        self.base, self.token, self.log = base, token, log

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        status, payload = self.request(method, path, body)
        assert 200 <= status < 300, f"{method} {path}: HTTP {status} {payload[:500]!r}\n{self.log_tail()}"
        return json.loads(payload)

    def log_tail(self, chars: int = 4000) -> str:
        return "server log:\n" + self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ)
    # the reader's own Jupyter config, settings and runtime files stay out; the installation's (the venv's
    # server extensions, lab/overrides.json copied there) are what is tested
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(tmp / sub)
    env.pop("COURSE_SIZE", None)
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.root_dir={ROOT}",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False"]
    if os.geteuid() == 0:  # CI runs as root, and so does `make lab` in a container
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with status {proc.returncode}\n{server.log_tail()}")
            try:
                if server.request("GET", "/api/status", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT_S} s\n{server.log_tail()}")
            time.sleep(0.3)
        yield server
    finally:
        try:  # shuts its kernels down too
            server.request("POST", "/api/shutdown", timeout=10)
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_a_lesson_opens_as_a_notebook(lab):
    model = lab.json("GET", f"/api/contents/{LESSON}?type=notebook&content=1")
    assert model["type"] == "notebook" and model["format"] == "json"
    nb = model["content"]
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["metadata"]["jupytext"]["text_representation"]["format_name"] == "myst"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(code) > FIRST_CODE_CELLS and "describe_hardware" in "".join(code[0]["source"])
    assert "remove-input" in code[0]["metadata"].get("tags", [])   # cell tags survive the conversion


def test_markdown_opens_with_jupytexts_notebook_view_and_the_extensions_load(lab):
    settings = lab.json("GET", "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    # lab/overrides.json changes the schema's default; the reader's own settings may still override it
    viewers = settings["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers.get("markdown") == "Jupytext Notebook" and viewers.get("myst") == "Jupytext Notebook"
    status, page = lab.request("GET", "/lab")
    assert status == 200
    assert '"name": "jupyterlab-jupytext"' in page.decode(), "JupyterLab's page does not load jupytext"


def _execute(ws, session: str, code: str) -> list[dict]:
    """Send one execute_request over the kernel's websocket; return its iopub outputs once the kernel is
    idle again, after checking the reply says ok."""
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session, "username": "test",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    outputs, reply, idle = [], None, False
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while reply is None or not idle:
        ws.settimeout(max(1.0, deadline - time.monotonic()))
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if msg["channel"] == "shell" and kind == "execute_reply":
            reply = msg["content"]
        elif kind == "status":
            idle = msg["content"]["execution_state"] == "idle"
        elif kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append(msg)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no reply within {CELL_TIMEOUT_S} s to:\n{code}")
    errors = [m["content"] for m in outputs if m["header"]["msg_type"] == "error"]
    assert reply["status"] == "ok" and not errors, f"{code}\nfailed: {reply.get('ename')}: {reply.get('evalue')}"
    return outputs


def test_a_kernel_executes_the_lessons_first_cells(lab):
    nb = lab.json("GET", f"/api/contents/{LESSON}?type=notebook&content=1")["content"]
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"][:FIRST_CODE_CELLS]
    sess = lab.json("POST", "/api/sessions", {"path": LESSON, "type": "notebook", "name": "01_formats.md",
                                               "kernel": {"name": nb["metadata"]["kernelspec"]["name"]}})
    try:
        kernel = sess["kernel"]["id"]
        ws = websocket.create_connection(f"ws://{lab.base.split('://', 1)[1]}/api/kernels/{kernel}/channels"
                                         f"?session_id={uuid.uuid4().hex}",
                                         header=[f"Authorization: token {lab.token}"], timeout=30)
        try:
            client = uuid.uuid4().hex
            outputs = [_execute(ws, client, cell) for cell in cells]
            # the banner: a Markdown display of the hardware line
            banner = [m["content"]["data"] for m in outputs[0] if m["header"]["msg_type"] == "display_data"]
            assert any("**Ran on:**" in d.get("text/markdown", "") for d in banner), outputs[0]
            # the properties table (fourth cell), a Markdown table
            table = [m["content"]["data"].get("text/markdown", "") for m in outputs[3]
                     if m["header"]["msg_type"] in ("display_data", "execute_result")]   # shown or returned
            assert any(t.startswith("|") and "FP16" in t for t in table), outputs[3]
            # an explorer: the front end receives HTML that carries its own module script (nothing to install)
            shown = _execute(ws, client, "from course_lib.widgets import format_explorer\nformat_explorer(1.0)")
            html = [m["content"]["data"].get("text/html", "") for m in shown if m["header"]["msg_type"] == "execute_result"]
            assert html and 'data-explorer="format_explorer"' in html[0] and '<script type="module">' in html[0]
            cwd = _execute(ws, client, "import os\nprint(os.getcwd())")
            assert cwd[0]["content"]["text"].strip() == str(ROOT / "lessons")   # the lesson's own folder
        finally:
            ws.close()
    finally:
        lab.request("DELETE", f"/api/sessions/{sess['id']}")


def test_an_explorer_runs_in_jupyterlab(lab, chromium):
    """The explorers' claim to work in Jupyter, in a real browser: JupyterLab runs the module script an output
    carries (outputs made in the session are trusted), and the explorer computes there as in the book."""
    folder, name = "_build", "lab-explorer-check.ipynb"    # ignored by git; `make book` clears it
    notebook = {"nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": "from course_lib.widgets import format_explorer\nformat_explorer(1.0)"}]}
    lab.request("PUT", f"/api/contents/{folder}", {"type": "directory"})
    lab.json("PUT", f"/api/contents/{folder}/{name}", {"type": "notebook", "format": "json", "content": notebook})
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(f"{lab.base}/lab/tree/{folder}/{name}?token={lab.token}", timeout=CELL_TIMEOUT_S * 1000)
        editor = page.locator(".jp-Notebook .jp-CodeCell .cm-content").first
        editor.wait_for(timeout=CELL_TIMEOUT_S * 1000)
        # a cell run before the kernel is connected is dropped: wait for the status bar's "Idle"
        page.get_by_text("| Idle").first.wait_for(timeout=CELL_TIMEOUT_S * 1000)
        editor.click()
        page.keyboard.press("Shift+Enter")
        decoded = page.locator(".jp-OutputArea .course-explorer[data-mounted] [data-role=decoded]").first
        decoded.wait_for(timeout=CELL_TIMEOUT_S * 1000)
        assert decoded.text_content() == "1"
        page.locator(".jp-OutputArea .course-explorer [data-role=number]").first.fill("-2.5")
        page.wait_for_function("() => document.querySelector('.jp-OutputArea [data-role=decoded]').textContent === '-2.5'",
                               timeout=10_000)
    finally:
        page.close()
        session = _session_of(lab, f"{folder}/{name}")
        if session is not None:
            lab.request("DELETE", f"/api/sessions/{session}")
        lab.request("DELETE", f"/api/contents/{folder}/{name}")


def _session_of(lab, path: str) -> str | None:
    sessions = lab.json("GET", "/api/sessions")
    return next((s["id"] for s in sessions if s.get("path") == path), None)
