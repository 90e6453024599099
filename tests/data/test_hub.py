"""The Hub reachability check answers in seconds, with the reason, before any Hub client starts its retries."""

from __future__ import annotations

import socket
import time

from gatelab.data.hub import hub_unreachable


def test_offline_mode_is_the_reason_without_touching_the_network(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(AssertionError("network")))
    assert hub_unreachable() == "HF_DATASETS_OFFLINE is set"


def test_an_endpoint_that_refuses_is_unreachable_at_once(monkeypatch):
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    reason = hub_unreachable()
    assert reason is not None and reason.startswith("127.0.0.1") and time.monotonic() - started < 5


def test_a_listening_endpoint_is_reachable(monkeypatch):
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_unreachable() is None
