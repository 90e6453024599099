"""The one exception type the CLI turns into a clean message instead of a traceback, and the one way to keep a
password out of any message."""

from __future__ import annotations

import re


class GatelabError(Exception):
    """A user-facing error: the message names the file, the key and what would be valid."""


def redact(uri: str) -> str:
    """A URI with any password replaced, for messages, logs and tags."""
    return re.sub(r"(//[^:/@]+:)[^@]+@", r"\1***@", uri)
