"""Ctrl-C and SIGTERM as one exception that every layer can see.

Lightning turns a KeyboardInterrupt inside `fit` into `sys.exit(1)`, so neither the run (which must close its MLflow
run as KILLED) nor a sweep worker (which must put its run back in the queue) would hear of it. `Interrupted` is a
BaseException of our own, which Lightning re-raises after its clean-up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; `exit_code` is the shell's 128 + signal number (130, 143)."""

    def __init__(self, signum: int, said: bool = False) -> None:
        self.signum, self.said = signum, said  # said: what it means for the user was printed already
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)


def ignore_signals() -> None:
    """SIGINT and SIGTERM ignored until `raise_on_signals` puts the old handlers back: a second Ctrl-C (or a
    launcher's forwarded copy of the first) must not cut a clean-up short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _raise(signum: int, _frame) -> None:
    ignore_signals()
    raise Interrupted(signum)


def raise_on_signals() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGINT and SIGTERM raise `Interrupted` in the main thread (`on_signals`)."""
    return on_signals(_raise)


@contextlib.contextmanager
def on_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM call `handler(signum, frame)` in the main thread; the old handlers come
    back after. Elsewhere than the main thread (where Python cannot set handlers) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def leave_slurm_warnings_to_the_task() -> None:
    """A sweep worker and its runs ignore Slurm's warning signals (USR1, USR2), whose default would kill them: the
    Slurm task's own process owns them (gatelab.sweep.slurm) and tells the worker with SIGTERM. Ignored signals stay
    ignored across exec, so a process started from here ignores them from its first instruction."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
