"""The one exception type the CLI turns into a clean message instead of a traceback, the one way to keep a password
out of any text, and the one-line message for any other failure."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import threading
import traceback
import urllib.parse
import warnings
from collections.abc import Iterator

DEBUG_VARIABLE = "GATELAB_DEBUG"
_HIDDEN = "***"

# userinfo up to the LAST "@" of the whitespace-free run: a raw "@", ":" or "/" in a password (invalid in a URI, yet
# common in pasted ones: `postgresql://postgres:hunter@2secret@host`) must not leave its tail behind.
_URI_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)(?!\d+(?:[/?#\s]|$))(\S*)@")
# MLflow UI parameters whose names contain "key" but whose values are column and view names, not secrets.
_UI_PARAMETERS = r"(?!(?:viewStateShareKey|orderByKey)=)"
_QUERY_SECRET = re.compile(
    rf"(?i)([?&;]{_UI_PARAMETERS}[\w.-]*(?:pass|pwd|secret|token|key|sig|credential|auth)[\w.-]*=)[^&#\s]+")
# libpq keyword strings and log lines: `host=db password=hunter2`
_KEYWORD_SECRET = re.compile(r"(?i)((?<![\w.-])(?:password|passwd|pwd|secret|token)\s*=\s*)[^\s&#,;]+")
_SECRET_VARIABLE = re.compile(r"PASSW(OR)?D|SECRET|TOKEN|CREDENTIAL|API_?KEY|ACCESS_KEY|PRIVATE_KEY|_(PWD|PASS|KEY)$")
# Strings that also occur as plain text everywhere (HF_HUB_DISABLE_IMPLICIT_TOKEN=1, MAX_TOKENS=4096): replacing them
# would garble output without hiding anything.
_NOT_A_SECRET = re.compile(r"(?i).{0,3}|\d{1,7}|true|false|yes|no|on|off|none|null")

_seen_passwords: set[str] = set()
_seen_passwords_lock = threading.Lock()


class GatelabError(Exception):
    """A user-facing error: the message names the file, the key and what would be valid."""


def redact(text: str) -> str:
    """`text` (a URI, a message, a traceback, a log line) with every password, token and secret replaced by ***.

    Besides the forms it recognises, it hides the values of secret environment variables and every password it has
    seen in a URI before (see `remember_passwords`), wherever they occur.
    """
    remember_passwords(text)
    text = _URI_PASSWORD.sub(rf"\1{_HIDDEN}@", text)
    text = _QUERY_SECRET.sub(rf"\1{_HIDDEN}", text)
    text = _KEYWORD_SECRET.sub(rf"\1{_HIDDEN}", text)
    for secret in _known_secrets():
        text = text.replace(secret, _HIDDEN)
    return text


def first_line(error: BaseException) -> str:
    """The error's first non-blank line, redacted and cut to 300 characters: what a one-line message quotes of it."""
    return redact(next((line for line in str(error).splitlines() if line.strip()), type(error).__name__))[:300]


def remember_passwords(text: str) -> None:
    """Keep the passwords of the URIs in `text`, and their pieces between raw '@' and ':', to hide them later even
    outside a URI: a driver that splits `postgres:hunter@2secret@host` at the first '@' reports host `2secret@host`."""
    found = set()
    for match in _URI_PASSWORD.finditer(text):
        password = match.group(2)
        for form in {password, urllib.parse.unquote(password)}:
            found |= {form, *re.split(r"[@:]", form)}
    with _seen_passwords_lock:
        _seen_passwords.update(secret for secret in found if not _NOT_A_SECRET.fullmatch(secret))


def _known_secrets() -> list[str]:
    """The passwords seen so far and the values of secret environment variables, as typed and URL-quoted, longest
    first (a secret that contains another is hidden whole)."""
    with _seen_passwords_lock:
        secrets = set(_seen_passwords)
    secrets |= {value for name, value in _environment().items()
                if _SECRET_VARIABLE.search(name.upper()) and not _NOT_A_SECRET.fullmatch(value)}
    secrets |= {urllib.parse.quote(secret, safe="") for secret in secrets}
    return sorted(secrets, key=len, reverse=True)


def _environment() -> dict[str, str]:
    """A copy of os.environ. Copying it while another thread sets or unsets a variable (MLflow's telemetry thread
    unsets _MLFLOW_TELEMETRY_SESSION_ID) raises KeyError or RuntimeError mid-way: the copy is taken again."""
    for _ in range(100):
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):
            continue
    return dict(os.environ)


# --- the CLI boundary -----------------------------------------------------------------------------------------------


_DEBUG_HINT = f" (set {DEBUG_VARIABLE}=1 for the traceback)"
_NOT_WRITABLE = ("is read-only or not writable by this user (permission denied): change its permissions or choose "
                 "another folder")
_FULL = {errno.ENOSPC: "is full", errno.EDQUOT: "is over this user's disk quota"}
_DISK_FIXES = {
    errno.ENOSPC: "free space and run the same command again; what was recorded is kept",
    errno.EDQUOT: "free space and run the same command again; what was recorded is kept",
    errno.EROFS: "is on a read-only file system: choose a writable folder (--runs-dir, --out) or remount it",
    errno.EACCES: _NOT_WRITABLE,
    errno.EPERM: _NOT_WRITABLE,
}


def failure_message(error: BaseException) -> str:
    """One line for an exception that escaped a command: what failed, on which file, and the fix where one is known."""
    if isinstance(error, GatelabError):
        return redact(str(error))
    if isinstance(error, OSError) and (error.filename is not None or error.errno in _DISK_FIXES):
        return redact(_os_error_message(error))
    first_line = next((line for line in str(error).splitlines() if line.strip()), "")
    return redact(f"{type(error).__name__}: {first_line}".rstrip(": ") + _DEBUG_HINT)


def exit_code(error: BaseException) -> int:
    """2 for a user error: a GatelabError, or a file or disk of the user's refusing (missing, read-only, full); 1 for
    anything else."""
    user_error = isinstance(error, GatelabError) or (
        isinstance(error, OSError) and (error.filename is not None or error.errno in _DISK_FIXES))
    return 2 if user_error else 1


def _os_error_message(error: OSError) -> str:
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    if error.errno in _FULL:
        # A copy names its source then its destination (shutil's sendfile): the disk that filled is the destination's.
        written = error.filename2 if error.filename2 is not None else error.filename
        disk = f"the disk holding {where}{file_system_of(written)}" if where else "the disk"
        return f"{disk} {_FULL[error.errno]}: {_DISK_FIXES[error.errno]}"
    if error.errno in _DISK_FIXES:
        return f"{where or 'a file'} {_DISK_FIXES[error.errno]}"
    return f"{where}: {error.strerror or error}{_DEBUG_HINT}"


@contextlib.contextmanager
def naming_full_disk(path) -> Iterator[None]:
    """A full disk or quota met inside (a write whose OSError names no file: a library's copy, a plot's save) as the
    same OSError naming `path`, the file being written, so the message says which disk and how much room it has."""
    try:
        yield
    except OSError as error:
        if error.errno in _FULL and error.filename is None:
            raise OSError(error.errno, error.strerror or os.strerror(error.errno), os.fspath(path)) from error
        raise


def file_system_of(path) -> str:
    """' (the file system mounted at /data: 12 KB of 20 GB free)' for `path`, or its nearest folder that exists; ''
    where it cannot be read."""
    try:
        folder = os.path.abspath(os.fspath(path))
        while not os.path.exists(folder) and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)
        mount = folder
        while not os.path.ismount(mount):
            mount = os.path.dirname(mount)
        usage = shutil.disk_usage(folder)
    except (OSError, TypeError, ValueError):
        return ""
    return f" (the file system mounted at {mount}: {_size(usage.free)} of {_size(usage.total)} free)"


def _size(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return ""


def print_failure(error: BaseException) -> None:
    """`failure_message` on stderr, after the redacted traceback when GATELAB_DEBUG=1."""
    if os.environ.get(DEBUG_VARIABLE) == "1":
        sys.stderr.write(redact("".join(traceback.format_exception(error))))
    sys.stderr.write(f"error: {failure_message(error)}\n")
    sys.stderr.flush()


# --- every other way text leaves the process ------------------------------------------------------------------------


class _RedactingStream:
    """A text stream that redacts every write: what libraries print straight to sys.stdout or sys.stderr (MLflow's
    run URL, a traceback, a progress line) passes through it."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _redacting_record_factory(make_record):
    def make_redacted_record(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: left for the handler, which reports it as logging always has
            return record
        # Formatted here, once: a handler that writes to a file or to a stream taken before the wrap sees no secret.
        record.msg, record.args = redact(message), ()
        return record

    return make_redacted_record


def _redacting_showwarning(show):
    def show_redacted(message, category, filename, lineno, file=None, line=None) -> None:
        show(redact(str(message)), category, filename, lineno, file, line)

    return show_redacted


def install_redaction() -> None:
    """Redact stdout, stderr, every logging record and every warning of this process, hiding also the passwords of
    the command line's URIs wherever a library may print them; a second call does nothing."""
    if isinstance(sys.stderr, _RedactingStream):
        return
    remember_passwords(" ".join(sys.argv))
    sys.stdout, sys.stderr = _RedactingStream(sys.stdout), _RedactingStream(sys.stderr)
    logging.setLogRecordFactory(_redacting_record_factory(logging.getLogRecordFactory()))
    warnings.showwarning = _redacting_showwarning(warnings.showwarning)
