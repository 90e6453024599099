"""`serve_ui` starts the MLflow UI, answers over HTTP, and on Ctrl-C stops with no process left behind."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from gatelab.errors import GatelabError, redact
from gatelab.report import ui
from gatelab.report.ui import find_free_port, serve_ui
from gatelab.tracking import RunStore
from tests.helpers import REPO, MlflowServer, gatelab_cli


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) for every process, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        found[int(entry.name)] = (int(stat[1]), stat[0], args)
    return found


def _descendants(root: int) -> dict[int, str]:
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][2]
        todo += children.get(pid, [])
    return found


def _alive(pid: int, args: str) -> bool:
    """Still running as the same program (a zombie, or a reused pid, is not)."""
    now = _processes().get(pid)
    return now is not None and now[1] != "Z" and now[2] == args


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list processes")
@pytest.mark.timeout(180)
def test_gatelab_ui_answers_then_stops_on_ctrl_c_leaving_nothing(tmp_path):
    port = find_free_port()
    db = tmp_path / "mlflow.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(tmp_path)}  # where the server's own log goes while it runs
    log = (tmp_path / "server.log").open("w")
    # The command a user types: `gatelab ui` over a tracking store (here an empty one: made first, the UI only reads).
    RunStore(f"sqlite:///{db}").client.search_experiments()
    process = subprocess.Popen([sys.executable, "-m", "gatelab", "ui", "--tracking-uri", f"sqlite:///{db}",
                                "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=log,
                               text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        address, deadline = None, time.monotonic() + 60
        while address is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                continue
            if f"http://127.0.0.1:{port}/" in line:
                address = f"http://127.0.0.1:{port}/"
        assert address, "no address printed within 60 s:\n" + (tmp_path / "server.log").read_text()[-3000:]
        with urllib.request.urlopen(address, timeout=30) as response:
            assert response.status == 200
            assert b"<html" in response.read().lower()

        server = _descendants(process.pid)
        assert any(f"--port {port}" in args for args in server.values()), server  # the tree we expect to vanish

        assert list(tmp_path.glob("gatelab-mlflow-ui-*.log"))  # uvicorn's lines go there, not to the terminal
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, (tmp_path / "server.log").read_text()[-3000:]
        assert "Uvicorn running" not in (tmp_path / "server.log").read_text()
        assert not list(tmp_path.glob("gatelab-mlflow-ui-*.log"))  # removed after a clean stop
    finally:
        if process.poll() is None:
            process.kill()
        log.close()

    left = {pid: args for pid, args in server.items() if _alive(pid, args)}
    assert not left, f"left behind: {left}"
    mentions = [args for _, _, args in _processes().values() if str(port) in args or str(db) in args]
    assert not [a for a in mentions if "mlflow" in a or "uvicorn" in a or "gunicorn" in a], mentions
    with socket.socket() as sock:  # the port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_a_clean_error_before_anything_starts(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(GatelabError, match=f"port {port} on 127.0.0.1 is already in use"):
            serve_ui(f"sqlite:///{tmp_path / 'mlflow.db'}", port=port)
    assert not (tmp_path / "mlflow.db").exists()


def test_find_free_port_gives_a_bindable_port():
    port = find_free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_the_servers_own_lines_are_redacted_in_its_log(tmp_path, monkeypatch):
    """A server that fails prints its store's URI (MLflow names it in its errors): the log gatelab keeps has no
    password, whatever else the line says."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    uri = "postgresql://dave:Hunter2Secret@db.example:5432/mlflow"
    redact(uri)  # as gatelab does when it names the store: the password is known from then on
    server = subprocess.Popen(["sh", "-c", f"echo 'cannot connect to {uri}'; echo 'password Hunter2Secret'"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log, copier = ui._server_output(server, verbose=False)
    server.wait()
    copier.join(timeout=10)
    text = log.read_text()
    assert log.parent == tmp_path and "Hunter2Secret" not in text
    assert "postgresql://dave:***@db.example:5432/mlflow" in text and text.count("***") == 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_http_store_is_shown_where_its_server_serves_it_without_credentials(tmp_path):
    """`gatelab ui --tracking-uri http://dave:PW@host:port`: the server serves the UI already; gatelab checks that it
    answers and prints its page, starts no server of its own, and no password shows anywhere."""
    server = MlflowServer(tmp_path)
    server.start()
    try:
        store = RunStore(server.url)
        experiment = store.experiment_id("quick")
        store.client.create_run(experiment)
        uri = f"http://dave:Pa55word9@127.0.0.1:{server.port}"
        done = gatelab_cli("ui", "--tracking-uri", uri, "--port", str(find_free_port()), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        page = f"http://127.0.0.1:{server.port}/#/experiments/{experiment}/runs?workflowType=machine_learning"
        assert page in done.stdout and "dave" not in done.stdout.replace("dave:***", "")
        assert "Pa55word9" not in done.stdout + done.stderr and not list(tmp_path.glob("gatelab-mlflow-ui-*"))
    finally:
        server.kill()
    done = gatelab_cli("ui", "--tracking-uri", uri, cwd=tmp_path)
    assert done.returncode == 2 and "cannot be reached" in done.stderr and "Pa55word9" not in done.stderr
