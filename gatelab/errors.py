"""The one exception type the CLI turns into a clean message instead of a traceback."""


class GatelabError(Exception):
    """A user-facing error: the message names the file, the key and what would be valid."""
