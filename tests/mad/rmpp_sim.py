"""Two RMPP machines back to back through a lossy, duplicating, reordering channel.

A small discrete-event loop on a :class:`~ibal.clock.ManualClock`: packets in
flight and the machines' deadlines are events; the clock steps to the next.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ibal.clock import ManualClock
from ibal.transport.rmpp import (
    Action,
    ArmTimer,
    CancelTimer,
    Complete,
    Deliver,
    Fail,
    RmppReceiver,
    RmppSender,
    Transmit,
)
from ibal.wire.mad.rmpp import RmppHeader, RmppType

LATENCY = 0.001
SA_LIKE_HEADER = bytes([1, 0x03, 2, 0x12]) + bytes(4) + (0x1234).to_bytes(8, "big") + bytes(8)


@dataclass
class Side:
    name: str
    machine: RmppSender | RmppReceiver | None = None
    deadline: float | None = None
    delivered: list[Deliver] = field(default_factory=list)
    completed: list[Complete] = field(default_factory=list)
    failed: list[Fail] = field(default_factory=list)


@dataclass
class Sim:
    """``fates`` is consumed one per transmitted packet: ok, drop, dup or late."""

    sender: RmppSender
    fates: Iterable[str] = ()
    receiver_args: dict[str, object] = field(default_factory=dict)
    clock: ManualClock = field(default_factory=ManualClock)
    policy: Callable[[str, bytes], str] | None = None  # overrides fates: (from, mad) -> fate

    def __post_init__(self) -> None:
        self.a = Side("sender", self.sender)
        self.b = Side("receiver")
        self._fates: Iterator[str] = iter(self.fates)
        self._q: list[tuple[float, int, str, bytes]] = []
        self._seq = itertools.count()
        self.wire: list[tuple[str, bytes, str]] = []  # (from, mad, fate)

    def _transmit(self, frm: str, mad: bytes) -> None:
        fate = self.policy(frm, mad) if self.policy else next(self._fates, "ok")
        self.wire.append((frm, mad, fate))
        to = "b" if frm == "a" else "a"
        now = self.clock.now()
        if fate == "drop":
            return
        delay = {"ok": LATENCY, "dup": LATENCY, "late": LATENCY + 0.7}.get(fate, LATENCY)
        heapq.heappush(self._q, (now + delay, next(self._seq), to, mad))
        if fate == "dup":
            heapq.heappush(self._q, (now + 2 * LATENCY, next(self._seq), to, mad))

    def apply(self, side: Side, actions: list[Action]) -> None:
        for act in actions:
            if isinstance(act, Transmit):
                assert len(act.mad) == 256
                self._transmit("a" if side is self.a else "b", act.mad)
            elif isinstance(act, ArmTimer):
                side.deadline = act.at
            elif isinstance(act, CancelTimer):
                side.deadline = None
            elif isinstance(act, Deliver):
                side.delivered.append(act)
            elif isinstance(act, Complete):
                side.completed.append(act)
            elif isinstance(act, Fail):
                side.failed.append(act)

    def inject(self, to: str, mad: bytes) -> None:
        """Put a MAD on the wire towards ``to`` ('a' sender, 'b' receiver)."""
        heapq.heappush(self._q, (self.clock.now() + LATENCY, next(self._seq), to, mad))

    def _arrive(self, to: str, mad: bytes) -> None:
        now = self.clock.now()
        side = self.a if to == "a" else self.b
        if side.machine is None:
            h = RmppHeader.of(mad)
            if h.type != RmppType.DATA:
                return
            rx = RmppReceiver(**self.receiver_args)  # type: ignore[arg-type]
            side.machine = rx
            self.apply(side, rx.start(now))
        self.apply(side, side.machine.handle(mad, now))

    def run(self, limit: float = 10_000.0) -> None:
        """Start the sender and run until nothing is in flight and no deadline is armed."""
        self.apply(self.a, self.sender.start(self.clock.now()))
        while True:
            times = [t for t in (self.a.deadline, self.b.deadline) if t is not None]
            if self._q:
                times.append(self._q[0][0])
            if not times:
                return
            t = min(times)
            assert t <= limit, "the transfer does not end"
            self.clock.advance_to(t)
            if self._q and self._q[0][0] <= t:
                _, _, to, mad = heapq.heappop(self._q)
                self._arrive(to, mad)
                continue
            for side in (self.a, self.b):
                if side.deadline is not None and side.deadline <= t and side.machine:
                    side.deadline = None
                    self.apply(side, side.machine.on_timer(t))
