"""The per-cycle telemetry read of a bus: one group read of every servo's telemetry block,
retries servo by servo within a time budget, decoding into a :class:`TelemetryFrame`, and
the bookkeeping of servos that stop (and start again) answering.

The protocol subclasses supply the group read, the per-servo read and the decoding.
"""

from __future__ import annotations

import abc
import logging
import time

import numpy as np

from nactuator.hardware.control_table import RegisterBlock
from nactuator.hardware.frame import TelemetryFrame
from nactuator.hardware.port import describe_failures
from nactuator.hardware.wire import Wire

log = logging.getLogger(__name__)


class TelemetryReads(Wire):
    """``read()`` / ``wait_ready()`` of a telemetry bus (see the module docstring)."""

    telemetry: RegisterBlock  # the block read each cycle; str() gives e.g. "124..146 (23 bytes)"
    torque: np.ndarray  # 1 where torque is on; refreshed here on a new hardware error
    rx_timeout_ms: float
    read_retries: int
    retry_budget_s: float
    dead_after: int
    reprobe_s: float
    _absent: dict[int, float]  # servo id -> when to probe it again
    _failures: dict[int, int]
    _since_ok: dict[int, dict[str, int]]
    _reported: set[tuple[int, str]]
    _last_request: float

    def read(self) -> TelemetryFrame:
        """Read every servo's telemetry once. Servos that stopped answering are skipped
        (their channels invalid) and re-probed every ``reprobe_interval_s``."""
        t0 = time.perf_counter()
        now = time.monotonic()
        wanted = [i for i in self.ids if self._absent.get(i, 0.0) <= now]
        blocks, errors = self._read_blocks(wanted) if wanted else ({}, {})
        # Retry servo by servo (a read has no side effect, so it is always safe) while the
        # cycle's retry budget lasts: a corrupt reply costs microseconds, a lost one a timeout.
        for attempt in range(self.read_retries):
            missing = [i for i in wanted if i not in blocks]
            if not missing or (attempt > 0 and time.perf_counter() - t0 > self.retry_budget_s):
                break
            self.counters["retries"] += 1
            more, more_err = self._read_each(missing)
            blocks.update(more)
            errors.update(more_err)
        frame = TelemetryFrame.empty(len(self.ids))
        for k, sid in enumerate(self.ids):
            if sid in blocks:
                self._decode(k, blocks[sid], frame)
                frame.valid[k] = True
                self._note_alive(sid)
            elif sid in wanted:
                self._note_failure(sid)
        for sid, err in errors.items():
            if err:
                frame.errors[sid] = err
                if (sid, err) not in self._reported:
                    # A new hardware error: the firmware may have switched torque off.
                    state = self._read_torque(sid)
                    if state is not None:
                        self.torque[self.ids.index(sid)] = float(state)
                self._report_once(sid, err)
        frame.torque = self.torque.copy()
        self.counters["reads"] += 1
        if not frame.valid.all():
            self.counters["incomplete"] += 1
        frame.t = time.monotonic()
        frame.read_s = time.perf_counter() - t0
        if wanted:  # the last request went out at most one reply wait ago
            self._last_request = frame.t - self.rx_timeout_ms / 1000.0
        return frame

    def wait_ready(self, timeout: float = 1.0) -> TelemetryFrame:
        """Read until every servo answers (or ``timeout`` s); returns the last frame."""
        t_end = time.monotonic() + timeout
        frame = self.read()
        while not frame.valid.all() and time.monotonic() < t_end:
            frame = self.read()
        return frame

    def _note_alive(self, sid: int) -> None:
        if sid in self._absent:
            log.warning("servo %d (%s) answers again; its telemetry is valid from now on",
                        sid, self._name(sid))
            self._reported.discard((sid, "absent"))
        self._absent.pop(sid, None)
        self._failures[sid] = 0
        self._since_ok[sid] = dict(self.counters)

    def _note_failure(self, sid: int) -> None:
        self._failures[sid] += 1
        if self._failures[sid] >= self.dead_after:
            self._absent[sid] = time.monotonic() + self.reprobe_s
            delta = {k: v - self._since_ok[sid][k] for k, v in self.counters.items()}
            self._report_once(sid, "absent", (
                f"servo {sid} ({self._name(sid)}) on {self.port} stopped answering "
                f"({self._failures[sid]} reads of its telemetry block {self.telemetry} "
                f"failed in a row; on the bus since its last good read: "
                f"{describe_failures(delta, self.rx_timeout_ms)}). Its channel is recorded "
                f"with telemetry_valid=0; probing again every {self.reprobe_s:g} s"))


    def _report_once(self, sid: int, key: str, message: str | None = None) -> None:
        if (sid, key) in self._reported:
            return
        self._reported.add((sid, key))
        log.warning(message or f"servo {sid} ({self._name(sid)}) on {self.port} reports a "
                    f"hardware error: {key}")

    @abc.abstractmethod
    def _read_blocks(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        """One group read of the telemetry block: ({id: bytes}, {id: error text or ''})."""

    @abc.abstractmethod
    def _read_each(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        """The same block read servo by servo (the fallback when a group read failed)."""

    @abc.abstractmethod
    def _decode(self, k: int, block: bytes, frame: TelemetryFrame) -> None: ...
