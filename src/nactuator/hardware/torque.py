"""Torque on and off for a telemetry bus, and the safety net of switching it off: from any
state the port was left in (an interrupted request, a late reply), confirmed servo by
servo, never raising, with Ctrl-C and SIGTERM held off meanwhile.

``TelemetryBus.close`` runs :meth:`TorqueSafety.torque_off` whatever ended the bus's use.
The protocol subclasses supply the one-servo torque write and the explanation of a failure.
"""

from __future__ import annotations

import abc
import logging
import time

import numpy as np

from nactuator.hardware.port import BusError, HardwareAlert
from nactuator.hardware.signals import interrupts_deferred
from nactuator.hardware.wire import Wire

log = logging.getLogger(__name__)


class TorqueSafety(Wire):
    """``torque_off()`` / ``set_torque()`` and the torque register of each servo."""

    torque: np.ndarray  # 1 where torque is on (as last set or read back)
    rx_timeout_ms: float
    reply_timeout_ms: float
    _reply_floor_ms: float

    TORQUE_OFF_TRIES = 6
    TORQUE_OFF_BACKOFF_S = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)  # before each round
    TORQUE_OFF_REPLY_MS = 250.0  # wait this long for each reply: a slow answer is no failure

    def torque_off(self) -> list[int]:
        """Switch torque off on every servo and make sure it took; returns the IDs that
        never confirmed (after logging one line that names them).

        Works from any state the port was left in: a Ctrl-C between an SDK request and its
        reply leaves the SDK's ``is_using`` flag set (every later request would fail with
        COMM_PORT_BUSY) and the reply in the buffers. So: wait out replies in flight, clear
        the flag, flush both buffers; then, in rounds with growing pauses, one broadcast
        Torque_Enable = 0 and, per servo not yet confirmed, a read-back (and if it answers
        with 1, a write of its own and another read-back), each reply awaited at least
        ``TORQUE_OFF_REPLY_MS``. A servo counts as off only once it has read back 0. Never
        raises: it is what runs when everything else went wrong.
        """
        self._reply_floor_ms = max(self.reply_timeout_ms, self.TORQUE_OFF_REPLY_MS)
        try:
            return self._torque_off()
        finally:
            self._reply_floor_ms = self.reply_timeout_ms

    def _torque_off(self) -> list[int]:
        with interrupts_deferred():
            pending = list(self.ids)
            if self._port.is_using or self._late_possible:
                # An interrupted or timed-out request: let its reply land before flushing.
                time.sleep(min(max(self.rx_timeout_ms, 35.0), 100.0) / 1000.0)
            for pause in self.TORQUE_OFF_BACKOFF_S[: self.TORQUE_OFF_TRIES]:
                time.sleep(pause)
                try:
                    self._reset_port()
                    self._broadcast_torque_off()
                except Exception as e:  # a broken port: the per-servo tries will say so
                    log.debug("torque off on %s: broadcast failed: %r", self.port, e)
                still = []
                for sid in pending:
                    try:  # the broadcast may have done it; if not, ask this servo alone
                        state = self._read_torque(sid)
                        ok = state == 0
                        if state is not None and not ok:  # it answers: tell it directly
                            self._write_torque(sid, False)
                            ok = self._read_torque(sid) == 0
                    except Exception as e:
                        log.debug("torque off on %s: servo %d: %r", self.port, sid, e)
                        self._reset_port(quiet=True)
                        ok = False
                    if ok:
                        self.torque[self.ids.index(sid)] = 0.0
                    else:
                        still.append(sid)
                pending = still
                if not pending:
                    return []
            names = ", ".join(f"{sid} ({self._name(sid)})" for sid in pending)
            log.error("torque may still be ON on %s: servo(s) %s did not confirm "
                      "Torque_Enable = 0 after %d tries; switch the arm's power off before "
                      "touching it, then check its cable and power", self.port, names,
                      self.TORQUE_OFF_TRIES)
            return pending


    def set_torque(self, enabled: bool) -> None:
        """Torque on/off on every servo, one acknowledged write each (3 tries).

        Switching on fails loudly (which servo, why); switching off is best effort — a
        servo that is gone or latched an error is reported and skipped.
        """
        problems = []
        for name, sid in zip(self.names, self.ids, strict=True):
            problem = None
            for _ in range(3):
                problem = self._write_torque(sid, enabled)
                if problem is None:
                    break
            if problem is None and enabled and self._read_torque(sid) == 0:
                problem = "refused to switch torque on"
            if problem is not None:
                problems.append((sid, name, problem))
            self.torque[self.ids.index(sid)] = float(enabled and problem is None)
        if not problems:
            return
        action = f"switching torque {'on' if enabled else 'off'} on {self.port}"
        detail = " | ".join(f"servo {sid} ({name}): {self._explain(sid, p)}"
                            for sid, name, p in problems)
        if not enabled:
            log.warning("%s: %s", action, detail)
            return
        silent = all(p == "no status packet" for _, _, p in problems)
        raise (BusError if silent else HardwareAlert)(f"{action} failed: {detail}")

    def _broadcast_torque_off(self) -> None:
        """One unacknowledged Torque_Enable = 0 to every servo on the bus (broadcast ID)."""
        self._write_register(self.BROADCAST_ID, "Torque_Enable", 0, acknowledged=False)

    @abc.abstractmethod
    def _write_torque(self, sid: int, enabled: bool) -> str | None:
        """Write the torque register of one servo: None if acknowledged, else what failed."""

    @abc.abstractmethod
    def _explain(self, sid: int, problem: str) -> str:
        """Turn a failed torque write into a message a user can act on."""
