"""`make book` leaves a working JupyterLab: ``.venv/bin/jupyter lab --no-browser`` starts, serves
its page, opens a chapter through the contents API, runs code in a kernel for it and saves
notebooks without live-widget views (scripts/jupyter_server_config.py); and the
README's list of explorers is the list of the explorer modules of :mod:`fvlib.explorers`."""

import importlib
import importlib.util
import json
import os
import pkgutil
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import fvlib
import fvlib.explorers
from fvlib.explorers.prior import prior_explorer

ROOT = Path(__file__).resolve().parents[2]
JUPYTER = Path(sys.executable).parent / "jupyter"
CHAPTER = "book/02_priors.ipynb"
JUPYTER_CONFIG = ROOT / "scripts" / "jupyter_server_config.py"
#: Starting JupyterLab takes a few seconds on an idle machine; a loaded one can take a minute.
START_TIMEOUT = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A JupyterLab server on 127.0.0.1 with a token, its settings kept in ``home``."""

    def __init__(self, home: Path):
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.log = home / "jupyter.log"
        root = home / "root"  # a copy of the chapter: what the server saves stays out of the repository
        (root / "book").mkdir(parents=True)
        shutil.copy(ROOT / CHAPTER, root / CHAPTER)
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
               "JUPYTER_RUNTIME_DIR": str(home / "run"),
               "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "ws")}
        command = [str(JUPYTER), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
                   "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                   f"--ServerApp.root_dir={root}"] + (["--allow-root"] if os.geteuid() == 0 else [])
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def request(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 60):
        """``(status, body)`` of one request (JSON decoded when it is JSON)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as response:
            text = response.read().decode()
            kind = response.headers.get("Content-Type", "")
            return response.status, json.loads(text) if "json" in kind and text else text

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"jupyter lab exited:\n{self.log.read_text()[-3000:]}"
            try:
                if self.request("/api/status", timeout=5)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT} s:\n{self.log.read_text()[-3000:]}")

    def execute(self, kernel: str, code: str) -> str:
        """Run ``code`` in a kernel through its websocket, as JupyterLab does; its printed output."""
        import websocket  # websocket-client: a dependency of jupyter_server

        session, msg_id = secrets.token_hex(8), secrets.token_hex(8)
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel}/channels?session_id={session}"
        ws = websocket.create_connection(url, header=[f"Authorization: token {self.token}"], timeout=START_TIMEOUT)
        try:
            header = {"msg_id": msg_id, "session": session, "username": "test", "msg_type": "execute_request",
                      "version": "5.3", "date": ""}
            ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                "buffers": [], "content": {"code": code, "silent": False, "store_history": False,
                                                           "user_expressions": {}, "allow_stdin": False}}))
            printed = []
            while True:
                message = json.loads(ws.recv())
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    printed.append(message["content"]["text"])
                elif message["msg_type"] == "error":
                    pytest.fail("\n".join(message["content"]["traceback"]))
                elif message["msg_type"] == "execute_reply":
                    return "".join(printed)
        finally:
            ws.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)


def _explorer_notebook() -> dict:
    """A notebook holding an explorer's output as Jupyter stores it, with saved widget state."""
    bundle = prior_explorer(depth=2)._repr_mimebundle_()
    cell = {"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {}, "source": "prior_explorer()",
            "outputs": [{"output_type": "display_data", "data": bundle, "metadata": {}}]}
    return {"cells": [cell], "metadata": {"widgets": {"state": {}}}, "nbformat": 4, "nbformat_minor": 5}


def test_saved_notebooks_keep_the_explorers_static_view_only():
    """A reopened notebook has no kernel behind its widgets: saving drops their views (which
    JupyterLab would show as "model not found") and keeps the explorer's figure and settings."""
    spec = importlib.util.spec_from_file_location("jupyter_server_config", JUPYTER_CONFIG)
    config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config)
    notebook = _explorer_notebook()
    assert config.WIDGET_VIEW in notebook["cells"][0]["outputs"][0]["data"]
    config.drop_widget_views({"type": "notebook", "content": notebook})
    data = notebook["cells"][0]["outputs"][0]["data"]
    assert config.WIDGET_VIEW not in data and "<img" in data["text/html"] and "widgets" not in notebook["metadata"]


@pytest.mark.slow
def test_jupyter_lab_starts_and_opens_a_chapter(tmp_path):
    assert JUPYTER.is_file(), f"{JUPYTER} is missing: jupyterlab is pinned in requirements.txt, run make venv"
    installed = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.py"
    assert installed.is_file() and installed.read_text() == JUPYTER_CONFIG.read_text(), "run make venv"
    server = Server(tmp_path)
    try:
        server.wait_until_up()
        status, page = server.request("/lab")
        assert status == 200 and "JupyterLab" in page  # the application page, with its assets built
        status, notebook = server.request(f"/api/contents/{CHAPTER}?content=1&type=notebook")
        assert status == 200 and notebook["type"] == "notebook"
        cells = notebook["content"]["cells"]
        assert any("prior_explorer" in cell["source"] for cell in cells)
        # a kernel for the chapter: the session starts it, and it runs code of this environment
        status, session = server.request("/api/sessions", "POST", {"path": CHAPTER, "type": "notebook",
                                                                   "kernel": {"name": "python3"}})
        assert status == 201
        output = server.execute(session["kernel"]["id"], "import fvlib; print(fvlib.__version__)")
        assert output.strip() == fvlib.__version__
        assert server.request(f"/api/sessions/{session['id']}", "DELETE")[0] == 204
        # saving through the server: the explorer's widget view is dropped, its static view kept
        status, _ = server.request("/api/contents/saved.ipynb", "PUT",
                                   {"type": "notebook", "format": "json", "content": _explorer_notebook()})
        assert status in (200, 201)
        data = json.loads((tmp_path / "root" / "saved.ipynb").read_text())["cells"][0]["outputs"][0]["data"]
        assert set(data) == {"text/plain", "text/html"}
    finally:
        server.stop()


def test_readme_lists_every_explorer_with_its_chapter():
    """The README's "Explorers" line names each explorer of fvlib.explorers and the chapter that
    shows it, and that chapter does call it."""
    readme = (ROOT / "README.md").read_text()
    line = " ".join(re.search(r"- \*\*Explorers:\*\*(.*?)\n- ", readme, flags=re.S).group(1).split())
    listed = dict(re.findall(r"`(\w+_explorer)` \(chapter (\d+)\)", line))
    modules = [importlib.import_module(f"fvlib.explorers.{module.name}")
               for module in pkgutil.iter_modules(fvlib.explorers.__path__)]
    explorers = {name for module in modules for name in getattr(module, "__all__", ()) if name.endswith("_explorer")}
    assert set(listed) == explorers
    count = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}[len(explorers)]
    assert f"has {count} ipywidgets explorers" in line
    for name, chapter in listed.items():
        (notebook,) = ROOT.glob(f"book/{int(chapter):02d}_*.ipynb")
        assert f"{name}(" in notebook.read_text(), f"chapter {chapter} does not show {name}"
