"""`gatelab ui`: the MLflow UI over a tracking store, started, watched and stopped with nothing left behind.

`mlflow ui` runs a uvicorn (or gunicorn) master with worker processes. It is started in a session of its own, so a
Ctrl-C in the terminal reaches only gatelab, which then stops the server's whole process group: the master and every
worker.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from gatelab.errors import GatelabError, redact
from gatelab.host import has_proc, live_pids, process_stat

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it); another process may take it before it is used."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover is not "taken"
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise GatelabError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return False


def _local_address(host: str, port: int) -> str:
    """The URL to open: a wildcard listen address is reached on loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _answers(url: str) -> bool:
    for path in ("health", ""):
        try:
            with urllib.request.urlopen(url + path, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return False


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL to whatever is left after STOP_TIMEOUT_S; waits for it."""
    group = process.pid  # start_new_session: the server leads its own group
    for sig, grace in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(group):
                return
            time.sleep(0.1)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(group: int) -> bool:
    """Whether any process of the group still runs (zombies, which a container's init may never reap, do not
    count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not has_proc():
        return True
    for pid in live_pids():
        fields = process_stat(pid)
        if fields is not None and int(fields[5 - 3]) == group and fields[3 - 3] != "Z":  # field 5: pgrp, 3: state
            return True
    return False


def serve_ui(tracking_uri: str, host: str = "127.0.0.1", port: int = 5000, artifacts_dir: Path | None = None,
             workers: int = 2) -> None:
    """Run `mlflow ui` over `tracking_uri` until SIGINT (Ctrl-C) or SIGTERM, then stop it and all its workers.

    Prints the address once the server answers. Raises GatelabError when the port is taken, or when the server exits
    or does not answer within START_TIMEOUT_S. `artifacts_dir` is where artifacts of experiments created from the UI
    go (gatelab's own experiments record their artifact location already)."""
    if _port_taken(host, port):
        raise GatelabError(f"port {port} on {host} is already in use: stop what listens there or pass --port "
                           f"{find_free_port(host)}")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", host,
               "--port", str(port), "--workers", str(workers)]
    if artifacts_dir is not None:
        command += ["--artifacts-destination", Path(artifacts_dir).resolve().as_uri()]
    url = _local_address(host, port)

    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def _on_signal(signum, frame):  # noqa: ARG001
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        try:
            stdout = sys.stderr.fileno()  # the server's log lines go to stderr; stdout says only where it is
        except (AttributeError, OSError, ValueError):
            stdout = None
        # MLflow 3's server also runs a GenAI job runner (huey consumers, a store in /dev/shm that outlives a kill);
        # gatelab's runs need none of it, so it is off unless the environment turns it on.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get(
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, env=env,
                                   start_new_session=True)
        try:
            _wait_until_up(process, url, stop)
            if stop.is_set():
                return
            print(f"MLflow UI for {redact(tracking_uri)}: {url}  (Ctrl-C stops it)", flush=True)
            while not stop.is_set():
                if process.poll() is not None:
                    raise GatelabError(f"the MLflow UI stopped by itself (exit code {process.returncode}); "
                                       "its messages are above")
                stop.wait(0.5)
        finally:
            _stop_group(process)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_until_up(process: subprocess.Popen, url: str, stop: threading.Event) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not stop.is_set():
        if process.poll() is not None:
            raise GatelabError(f"the MLflow UI exited with code {process.returncode} before answering at {url}; "
                               "its messages are above")
        if _answers(url):
            return
        if time.monotonic() > deadline:
            raise GatelabError(f"the MLflow UI did not answer at {url} within {START_TIMEOUT_S:.0f} s")
        stop.wait(0.5)
