"""The thin I/O around :mod:`ibal.transport.rmpp`: a send function, a timer service, results.

The MAD service owns addressing and TID matching; it hands this module an
opaque ``key`` per transaction (peer, class, TID...) and a ``send`` function
for that peer.  :class:`RmppTransfers` keeps one machine per key, turns its
:class:`~ibal.transport.rmpp.ArmTimer` and ``CancelTimer`` actions into
timers (any object with the :class:`Timers` shape, e.g. ``ibal.al.timer.TimerService``), its
:class:`~ibal.transport.rmpp.Transmit` actions into ``send`` calls, and reports
:class:`~ibal.transport.rmpp.Deliver`, :class:`~ibal.transport.rmpp.Complete` and
:class:`~ibal.transport.rmpp.Fail` to the caller's ``on_result``.

Threads: ``feed`` runs on the service's receive thread, timer expiries on the
timer service's callback thread; one lock per transfer serialises them.
``send`` and ``on_result`` are called with that lock held: they must not
block (queue the work).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ibal.clock import Clock
from ibal.transport.rmpp import (
    Action,
    ArmTimer,
    CancelTimer,
    Complete,
    Deliver,
    Fail,
    RmppCounters,
    RmppReceiver,
    RmppSender,
    State,
    Transmit,
)
from ibal.wire.fields import Buffer
from ibal.wire.mad.rmpp import RmppHeader, RmppType, is_rmpp

Result = Deliver | Complete | Fail
SendFn = Callable[[bytes], None]
OnResult = Callable[[Hashable, Result], None]


class TimerHandle(Protocol):
    def cancel(self) -> bool: ...


class Timers(Protocol):
    """What the driver needs of a timer service (``ibal.al.timer.TimerService`` fits)."""

    @property
    def clock(self) -> Clock: ...

    def call_at(
        self, when: float, fn: Callable[..., object], *args: Any, owner: Hashable | None = None
    ) -> TimerHandle: ...


@dataclass
class _Transfer:
    key: Hashable
    machine: RmppSender | RmppReceiver
    send: SendFn
    timer: TimerHandle | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(eq=False)  # hashable: timers are owned by it
class RmppTransfers:
    """Every RMPP transfer of one agent, keyed by the service's transaction key."""

    timers: Timers
    on_result: OnResult
    class_header_size: int = 0
    receiver_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[Hashable, _Transfer] = {}
        self.totals = RmppCounters()
        self.unclaimed = 0  # RMPP MADs that matched no transfer and start none

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def state(self, key: Hashable) -> State | None:
        with self._lock:
            t = self._live.get(key)
        return None if t is None else t.machine.state

    def send(self, key: Hashable, sender: RmppSender, send: SendFn) -> None:
        """Start sending ``sender``'s message; the result comes to ``on_result(key, ...)``."""
        t = _Transfer(key, sender, send)
        with self._lock:
            if key in self._live and not self._live[key].machine.finished:
                raise ValueError(f"an RMPP transfer for {key!r} is under way")
            self._live[key] = t
        with t.lock:
            self._run(t, sender.start(self.timers.clock.now()))

    def feed(self, key: Hashable, mad: Buffer, send: SendFn) -> bool:
        """A received RMPP MAD of transaction ``key``; ``send`` answers its sender.

        A DATA segment with no transfer under ``key`` starts a receiver.  Returns
        False when the MAD is not RMPP or belongs to nothing (counted).
        """
        if not is_rmpp(mad):
            return False
        with self._lock:
            t = self._live.get(key)
            if t is None or (
                isinstance(t.machine, RmppSender) and t.machine.state is State.COMPLETE
            ):
                if RmppHeader.of(mad).type != RmppType.DATA:
                    self.unclaimed += 1
                    return False
                rx = RmppReceiver(class_header_size=self.class_header_size,
                                  **self.receiver_options)  # fmt: skip
                t = self._live[key] = _Transfer(key, rx, send)
                fresh = True
            else:
                fresh = False
        with t.lock:
            now = self.timers.clock.now()
            if fresh:
                self._run(t, t.machine.start(now))
            switch = self._run(t, t.machine.handle(mad, now))
        if switch:  # double-sided: this DATA starts the response's receiver
            return self.feed(key, mad, send)
        return True

    def _fire(self, t: _Transfer) -> None:
        with t.lock:
            t.timer = None
            self._run(t, t.machine.on_timer(self.timers.clock.now()))

    def _run(self, t: _Transfer, actions: list[Action]) -> bool:
        switch = False
        for act in actions:
            if isinstance(act, Transmit):
                t.send(act.mad)
            elif isinstance(act, ArmTimer | CancelTimer):
                if t.timer is not None:
                    t.timer.cancel()
                    t.timer = None
                if isinstance(act, ArmTimer):
                    t.timer = self.timers.call_at(act.at, self._fire, t, owner=self)
            else:
                if isinstance(act, Complete) and act.switch:
                    switch = True
                self.on_result(t.key, act)
        if t.machine.state in (State.COMPLETE, State.FAILED, State.CLOSED):
            self._retire(t)
        return switch

    def _retire(self, t: _Transfer) -> None:
        if t.timer is not None:
            t.timer.cancel()
            t.timer = None
        with self._lock:
            if self._live.get(t.key) is t:
                del self._live[t.key]
            c, m = self.totals, t.machine.counters
            for name in vars(c):
                setattr(c, name, getattr(c, name) + getattr(m, name))
