"""Clocks shared by the access layer's timers and the mock fabric.

A :class:`Clock` only tells the time (``now()``, seconds, monotonic).  The
real one is :class:`MonotonicClock`.  :class:`ManualClock` moves only on
:meth:`ManualClock.advance`: everything that keeps timers against it (the
access layer's :class:`~ibal.al.timer.TimerService`, a mock fabric after
``fabric.use_clock(clock)``) is a :class:`ClockListener`, and ``advance``
fires every listener's due timers in one global time order, so a test steps
an RNR retry on the fabric and a MAD timeout in the AL with one call.

This module is neutral ground: the AL and providers both import it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything with a monotonic ``now()`` in seconds."""

    def now(self) -> float: ...


class MonotonicClock:
    """Real time: :func:`time.monotonic`."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "<MonotonicClock>"


class ClockListener(Protocol):
    """Keeps timers against a :class:`ManualClock` (called by ``advance``, any thread)."""

    def clock_deadline(self) -> float | None:
        """When the listener's earliest live timer is due, or ``None``."""
        ...

    def clock_run(self, now: float) -> None:
        """Fire everything due at or before ``now`` (the clock already reads ``now``)."""
        ...


class ManualClock:
    """A clock that moves only on :meth:`advance`, firing listeners' timers in time order.

    ``advance`` is serialised (one caller at a time); calling it from inside a
    listener's ``clock_run`` raises ``RuntimeError``.  Ties between listeners
    go in attach order.
    """

    max_steps = 1_000_000
    """Timer firings one ``advance`` allows before it calls the schedule a livelock."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._advancing = threading.RLock()
        self._in_advance = False
        self._listeners: list[ClockListener] = []

    def __repr__(self) -> str:
        return f"<ManualClock t={self._now:.6f} listeners={len(self._listeners)}>"

    def now(self) -> float:
        return self._now

    def attach(self, listener: ClockListener) -> None:
        """Let ``advance`` fire ``listener``'s timers (idempotent)."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def detach(self, listener: ClockListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def next_deadline(self) -> float | None:
        """The earliest timer due among all listeners (``None``: nothing pending)."""
        with self._lock:
            listeners = list(self._listeners)
        due = [d for d in (lst.clock_deadline() for lst in listeners) if d is not None]
        return min(due) if due else None

    def advance(self, seconds: float, *, settle: Callable[[], object] | None = None) -> None:
        """Move ``seconds`` on, stopping at every due timer on the way, in time order.

        ``settle`` (e.g. the AL manager's ``queues.flush``) runs after every step,
        so callbacks that expired timers handed off run -- and may re-arm
        timers -- before time moves further: fully deterministic tests.
        """
        if seconds < 0:
            raise ValueError("the clock does not go back")
        self._run_to(self._now + seconds, settle)

    def advance_to(self, target: float, *, settle: Callable[[], object] | None = None) -> None:
        """Move to absolute time ``target`` (no-op if it is in the past)."""
        self._run_to(max(target, self._now), settle)

    def settle(
        self, max_seconds: float = 3600.0, *, settle: Callable[[], object] | None = None
    ) -> float:
        """Fire timers one by one until none is left (or ``max_seconds`` passed); returns the
        time that passed."""
        start = self._now
        while True:
            d = self.next_deadline()
            if d is None or d - start > max_seconds:
                return self._now - start
            self._run_to(max(d, self._now), settle)

    def _run_to(self, target: float, settle: Callable[[], object] | None) -> None:
        with self._advancing:
            if self._in_advance:
                raise RuntimeError("ManualClock.advance() from inside a timer it fires")
            self._in_advance = True
            try:
                for _ in range(self.max_steps):
                    d = self.next_deadline()
                    if d is None or d > target:
                        break
                    self._step(max(d, self._now), settle)
                else:
                    raise RuntimeError(f"more than {self.max_steps} timer steps in one advance")
                self._step(target, settle)
            finally:
                self._in_advance = False

    def _step(self, t: float, settle: Callable[[], object] | None) -> None:
        with self._lock:
            if t > self._now:
                self._now = t
            listeners = list(self._listeners)
        for lst in listeners:
            lst.clock_run(t)
        if settle is not None:
            settle()
