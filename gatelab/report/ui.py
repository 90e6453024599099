"""`gatelab ui`: the MLflow UI over a tracking store, started, watched and stopped with nothing left behind.

`mlflow ui` runs a uvicorn (or gunicorn) master with worker processes. It is started in a session of its own, so a
Ctrl-C in the terminal reaches only gatelab, which then stops the server's whole process group: the master and every
worker.

The address it prints opens the runs table, not MLflow 3's GenAI overview: the URL carries `workflowType=
machine_learning` (MLflow 3.17's UI reads that switch, not the experiment's tag) and `viewStateShareKey`, gatelab's
saved view of the table (gatelab.tracking.key_metrics_view), as a URL can name the sort and filter but not the columns.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from gatelab.errors import GatelabError, redact
from gatelab.host import has_proc, live_pids, process_stat
from gatelab.interrupts import on_signals
from gatelab.store_checks import check_store
from gatelab.store_uris import missing_local_store
from gatelab.tracking import KEY_METRICS_VIEW, RunStore

SERVER_SCHEMES = ("http", "https")  # a tracking URI of these is an `mlflow server`, which serves its own UI

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
TRAINING_WORKFLOW = {"workflowType": "machine_learning"}  # the UI's "Model training" switch, not "GenAI"
SAVED_VIEW_PARAMETER = "viewStateShareKey"  # the UI opens the saved view of this name (gatelab.errors lets it through)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOT_WINDOW = (1920, 1080)  # MLflow's assistant panel takes the right quarter
# Virtual time: Chromium runs the page's timers and requests until this much page time has passed with nothing left
# to load, then takes the picture. The runs table of a few hundred runs is drawn within a few seconds of it.
SCREENSHOT_PAGE_TIME_MS = 20000
SCREENSHOT_TIMEOUT_S = 180.0


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


def runs_page(address: str, experiment_id: str, saved_view: bool = True) -> str:
    """The runs table of one experiment, in gatelab's saved view where the experiment has it (its tag is set by
    RunStore.experiment_id when gatelab makes the experiment)."""
    query = urllib.parse.urlencode(TRAINING_WORKFLOW)
    if saved_view:
        query += f"&{SAVED_VIEW_PARAMETER}={urllib.parse.quote(KEY_METRICS_VIEW)}"
    return f"{address}#/experiments/{urllib.parse.quote(experiment_id)}/runs?{query}"


def experiments_page(address: str) -> str:
    return f"{address}#/experiments?{urllib.parse.urlencode(TRAINING_WORKFLOW)}"


def landing_pages(tracking_uri: str, address: str, sweep_name: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """(the page to open, [(experiment, its runs page)] for every experiment with runs). The page is the sweep's runs
    table where `sweep_name` is given and has runs, else the only experiment's, else the experiments list. The store
    is only read: a SQLite store that does not exist is not created, no experiment is tagged."""
    if missing_local_store(tracking_uri):
        return experiments_page(address), []
    pages = [(name, runs_page(address, experiment_id, has_view)) for name, experiment_id, has_view
             in RunStore(tracking_uri, read_only=True).browsable_experiment_views()]
    if sweep_name is not None:
        return next((page for name, page in pages if name == sweep_name), experiments_page(address)), pages
    return (pages[0][1] if len(pages) == 1 else experiments_page(address)), pages


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise GatelabError(f"--screenshot needs Chromium, and none of {', '.join(CHROMIUM_NAMES)} is on PATH: install "
                       "it (Debian/Ubuntu: apt-get install chromium) or add its folder to PATH")


def headless_chromium(chromium: str, profile: str, *page_args: str) -> list[str]:
    """The command that loads a page in headless Chromium at SCREENSHOT_WINDOW, in the fresh profile `profile`, and
    lets it run for SCREENSHOT_PAGE_TIME_MS of page time; `page_args` say what to do with it and which URL."""
    width, height = SCREENSHOT_WINDOW
    # --no-sandbox: Chromium's sandbox will not start as root or in most containers; the page is the local MLflow UI.
    return [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--window-size={width},{height}",
            f"--virtual-time-budget={SCREENSHOT_PAGE_TIME_MS}", *page_args]


def take_screenshot(url: str, path: Path, chromium: str | None = None) -> None:
    """A PNG of `url` as headless Chromium draws it once the page has loaded, in a fresh profile (the UI's defaults,
    not a browser's remembered columns)."""
    chromium = chromium or find_chromium()
    path = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="gatelab-chromium-") as profile:
        command = headless_chromium(chromium, profile, f"--screenshot={path}", url)
        path.unlink(missing_ok=True)  # an older picture must not pass for this one
        browser = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, said = browser.communicate(timeout=SCREENSHOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(browser.pid, signal.SIGKILL)  # Chromium's renderer and helper processes too
            browser.communicate()
            raise GatelabError(f"Chromium ({chromium}) did not draw {url} within {SCREENSHOT_TIMEOUT_S:.0f} s; "
                               "no screenshot written") from None
    if browser.returncode != 0 or not path.is_file() or path.stat().st_size == 0:
        last = [line for line in (said or "").splitlines() if line.strip()][-1:]
        raise GatelabError(f"Chromium ({chromium}) wrote no screenshot to {path} (exit code {browser.returncode}"
                           f"{': ' + last[0][:300] if last else ''}); check that the folder is writable")


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
             workers: int = 2, sweep_name: str | None = None, screenshot: Path | None = None,
             verbose: bool = False) -> None:
    """Run `mlflow ui` over `tracking_uri` until SIGINT (Ctrl-C) or SIGTERM, then stop it and all its workers.

    Prints the page to open once the server answers (`landing_pages`); with `screenshot`, writes a PNG of that page
    and stops. An http(s) store is an `mlflow server`, which serves the UI itself: its pages are printed, nothing is
    started. A store that does not exist is refused, never created. The server's own lines go, redacted, to a log file
    named in any error and removed after a clean stop; `verbose` shows them instead."""
    chromium = _screenshot_tool(screenshot)
    if urllib.parse.urlparse(tracking_uri).scheme in SERVER_SCHEMES:
        show_server_ui(tracking_uri, sweep_name, screenshot, chromium)
        return
    if _port_taken(host, port):
        raise GatelabError(f"port {port} on {host} is already in use: stop what listens there or pass --port "
                           f"{find_free_port(host)}")
    missing = missing_local_store(tracking_uri)
    if missing:
        raise GatelabError(missing)
    address = _local_address(host, port)
    page, pages = landing_pages(tracking_uri, address, sweep_name)
    command = [sys.executable, "-m", "mlflow", "ui", "--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts_dir is not None:
        command += ["--artifacts-destination", Path(artifacts_dir).resolve().as_uri()]
    # The store's URI goes in the environment, not the command line, which `ps` shows to every user. MLflow 3's
    # server also runs a GenAI job runner (huey consumers, a store in /dev/shm that outlives a kill); gatelab's runs
    # need none of it, so it is off unless the environment turns it on.
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": tracking_uri, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION":
           os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}
    stop = threading.Event()
    with on_signals(lambda signum, frame: stop.set()):  # Ctrl-C or SIGTERM: stop the server
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
        server_log, copier = _server_output(process, verbose)
        where = f"its log: {server_log}" if server_log else "its messages are above"
        clean = False
        try:
            _wait_until_up(process, address, stop, where)
            if stop.is_set():
                return
            print(f"MLflow UI for {redact(tracking_uri)}: {page}" + ("" if screenshot else "  (Ctrl-C stops it)"),
                  flush=True)
            _show_the_runs(page, pages, sweep_name, tracking_uri, screenshot, chromium)
            if screenshot is None:
                _serve_until_stopped(process, stop, where)
            clean = True
        finally:
            _stop_group(process)
            copier.join(timeout=5)
            if server_log is not None and clean:
                server_log.unlink(missing_ok=True)


def _screenshot_tool(screenshot: Path | None) -> str | None:
    """Chromium's path where a screenshot is asked for (None where not), its folder checked: before anything starts."""
    if screenshot is None:
        return None
    chromium = find_chromium()
    if not Path(screenshot).resolve().parent.is_dir():
        raise GatelabError(f"--screenshot {screenshot}: its folder {Path(screenshot).resolve().parent} does not "
                           "exist; create it or name a file in an existing folder")
    return chromium


def server_address(tracking_uri: str) -> str:
    """An `mlflow server`'s own address, the one a browser opens: the URI without its user and password."""
    parts = urllib.parse.urlsplit(tracking_uri)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/", "", ""))


def show_server_ui(tracking_uri: str, sweep_name: str | None = None, screenshot: Path | None = None,
                   chromium: str | None = None) -> None:
    """An http(s) tracking store is an `mlflow server`, which already serves the UI: check that it answers, then print
    its pages as `serve_ui` does for a local store (without the URI's credentials: the browser asks for them), and
    take the screenshot if asked. Starts nothing and writes nothing to the server."""
    check_store(tracking_uri)
    address = server_address(tracking_uri)
    page, pages = landing_pages(tracking_uri, address, sweep_name)
    print(f"MLflow UI of the tracking server {redact(tracking_uri)}: {page}  (served by that server; gatelab starts "
          "none)", flush=True)
    _show_the_runs(page, pages, sweep_name, tracking_uri, screenshot, chromium)


def _server_output(process: subprocess.Popen, verbose: bool) -> tuple[Path | None, threading.Thread]:
    """Copy the server's lines, each redacted (a database URI's password shows up in its errors), to stderr with
    `verbose` (stdout says only where the UI is), else to a log file of their own. Returns (that file or None, the
    copying thread, which ends when the server's output does)."""
    if verbose:
        sink, server_log = sys.stderr, None
    else:
        sink = tempfile.NamedTemporaryFile("w", prefix="gatelab-mlflow-ui-", suffix=".log", delete=False)
        server_log = Path(sink.name)

    def copy() -> None:
        try:
            for line in io.TextIOWrapper(process.stdout, errors="replace"):
                sink.write(redact(line))
                sink.flush()
        except (OSError, ValueError):  # the terminal or the log went away: the server's lines are not needed
            pass
        finally:
            if sink is not sys.stderr:
                sink.close()

    copier = threading.Thread(target=copy, name="mlflow-ui-log", daemon=True)
    copier.start()
    return server_log, copier


def _serve_until_stopped(process: subprocess.Popen, stop: threading.Event, where: str) -> None:
    while not stop.is_set():
        if process.poll() is not None:
            raise GatelabError(f"the MLflow UI stopped by itself (exit code {process.returncode}); {where}")
        stop.wait(0.5)


def _show_the_runs(page: str, pages: list[tuple[str, str]], sweep_name: str | None, tracking_uri: str,
                   screenshot: Path | None, chromium: str | None) -> None:
    """Says where the runs are: `page`, or each experiment's `pages`; with `screenshot`, writes a PNG of `page`."""
    if sweep_name is not None and all(name != sweep_name for name, _ in pages):
        print(f"no runs of sweep '{sweep_name}' in {redact(tracking_uri)} yet: its experiment shows up once a run "
              "has started (gatelab sweep run)", file=sys.stderr, flush=True)
    if len(pages) > 1 or page not in (runs for _, runs in pages):
        # The list's links drop the URL's workflowType: without the sidebar's "Model training" switch (which the
        # browser then remembers) they open MLflow's GenAI overview.
        print("  the runs of each experiment (from the list, switch the sidebar to \"Model training\" first):",
              flush=True)
        for name, runs in pages:
            print(f"  {name}: {runs}", flush=True)
    if screenshot is not None:
        take_screenshot(page, screenshot, chromium)
        print(f"wrote {screenshot}", flush=True)


def _wait_until_up(process: subprocess.Popen, url: str, stop: threading.Event, where: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not stop.is_set():
        if process.poll() is not None:
            raise GatelabError(f"the MLflow UI exited with code {process.returncode} before answering at {url}; "
                               f"{where}")
        if _answers(url):
            return
        if time.monotonic() > deadline:
            raise GatelabError(f"the MLflow UI did not answer at {url} within {START_TIMEOUT_S:.0f} s; {where}")
        stop.wait(0.5)
