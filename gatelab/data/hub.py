"""Whether the Hugging Face Hub can be reached, asked once and fast: the Hub clients themselves retry for about half
a minute before they give up, and a user offline should hear why in seconds, with the fix."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

_OFF = ("1", "true", "yes", "on")


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached (offline mode set, or no connection to its endpoint in 5 s); None if it can."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(variable, "").lower() in _OFF:
            return f"{variable} is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=5).close()
    except OSError as exc:
        return f"{endpoint.hostname}: {exc.strerror or exc}"
    return None
