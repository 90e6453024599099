"""The local PostgreSQL server used by the multi-worker tests (127.0.0.1:5432, trust auth, database `test`)."""

from __future__ import annotations

import os

POSTGRES_URL = os.environ.get("GATELAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_reason() -> str | None:
    """None when the server answers, else why the PostgreSQL tests are skipped."""
    try:
        import psycopg

        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except Exception as error:  # no driver, no server, refused: all mean "skip, and say why"
        return f"no PostgreSQL at {POSTGRES_URL} ({type(error).__name__}: {str(error).strip()[:120]})"
    return None
