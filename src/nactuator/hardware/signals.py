"""Ctrl-C and SIGTERM around code that drives servos.

Python turns Ctrl-C into a ``KeyboardInterrupt`` wherever the main thread happens to be —
possibly between a vendor SDK's request and its reply, or halfway through switching torque
off. Two tools keep every exit path safe:

- :func:`sigterm_as_interrupt`: SIGTERM (``kill``, a service manager stopping us) takes
  the same path as Ctrl-C instead of killing the process on the spot, so the current
  episode is saved and torque is switched off either way.
- :func:`interrupts_deferred`: SIGINT/SIGTERM are held while a short critical section runs
  (switching torque off, writing an episode) and delivered when it ends, so a second,
  impatient Ctrl-C cannot abort the shutdown it is waiting for.

Both only act in the main thread (the only one Python delivers signals to); elsewhere they
do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["interrupts_deferred", "sigterm_as_interrupt"]

_HELD = (signal.SIGINT, signal.SIGTERM)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restore(signum: int, handler) -> None:
    # A handler installed outside Python reads back as None; the default is the safe guess.
    signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _raise_sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt("SIGTERM")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises ``KeyboardInterrupt("SIGTERM")``, like Ctrl-C."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_sigterm_as_interrupt)
    try:
        yield
    finally:
        _restore(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver the first one held
    (to whatever handler was there before: Ctrl-C raises ``KeyboardInterrupt`` then)."""
    if not _in_main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        held.append(signum)

    previous = {s: signal.signal(s, hold) for s in _HELD}
    try:
        yield
    finally:
        for s, handler in previous.items():
            _restore(s, handler)
        if held:
            signal.raise_signal(held[0])
