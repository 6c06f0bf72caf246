"""Progress bars that suit where the output goes: a terminal or a log file.

On a terminal a tqdm bar redraws itself in place. Written to a log file or a pipe, the
same bar is a stream of carriage-return redraws that ``cat`` and ``less`` show as one
endless line, so there :func:`progress_bar` returns :class:`LogLines` instead: the part of
tqdm's interface our commands use, printing one whole line when it starts, at most every
``LOG_INTERVAL_S`` seconds while it runs, and when it closes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LOG_INTERVAL_S", "LogLines", "is_terminal", "progress_bar"]

LOG_INTERVAL_S = 30.0


def is_terminal(stream: TextIO | None) -> bool:
    """True if ``stream`` is an interactive terminal (a redrawn bar shows as a bar)."""
    return bool(getattr(stream, "isatty", lambda: False)())


def progress_bar(*, total: float | None = None, desc: str = "", unit: str = "it",
                 file: TextIO | None = None, disable: bool | None = False,
                 **tqdm_options: Any) -> Any:
    """A tqdm bar on a terminal (``file``, default stderr), else :class:`LogLines`.

    ``tqdm_options`` (``bar_format``, ``leave``, ...) only shape the terminal bar."""
    stream = file if file is not None else sys.stderr
    if is_terminal(stream):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=disable,
                    **tqdm_options)
    return LogLines(total=total, desc=desc, unit=unit, file=stream, disable=bool(disable))


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


class LogLines:
    """tqdm's ``update``, ``n`` + ``refresh``, ``set_postfix[_str]``, ``close`` and ``with``,
    as whole lines for a log: one at the start, then at most one per ``interval_s`` of
    ``clock``, and a last one on ``close`` if anything changed since the previous line."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it",
                 file: TextIO | None = None, disable: bool = False,
                 interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n: float = 0
        self.postfix = ""
        self.disable = disable
        self._file = file if file is not None else sys.stderr
        self._interval_s, self._clock = interval_s, clock
        self._start = clock()
        self._printed_at: float | None = None
        self._printed_state: tuple | None = None
        self._closed = False
        self._emit()

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        self._emit()

    def refresh(self) -> None:
        self._emit()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)
        if refresh:
            self._emit()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in items.items()), refresh)

    def close(self) -> None:
        if not self._closed:
            self._emit(final=True)
            self._closed = True

    def line(self) -> str:
        done = _count(self.n) + (f"/{_count(self.total)}" if self.total else "")
        percent = f" ({100 * self.n / self.total:.0f} %)" if self.total else ""
        elapsed = self._clock() - self._start
        text = f"{self.desc}: {done} {self.unit}{percent}, {elapsed:.0f} s"
        return text + (f" | {self.postfix}" if self.postfix else "")

    def _emit(self, final: bool = False) -> None:
        if self.disable or self._closed:
            return
        state = (self.n, self.postfix)
        now = self._clock()
        if final:
            if state == self._printed_state:
                return
        elif self._printed_at is not None and now - self._printed_at < self._interval_s:
            return
        self._printed_at, self._printed_state = now, state
        self._file.write(self.line() + "\n")
        self._file.flush()
