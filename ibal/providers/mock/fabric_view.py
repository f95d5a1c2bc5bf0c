"""``EngineView``: the mock fabric's engine as users and tests see it.

:class:`~ibal.providers.mock.fabric.MockFabric` is the subnet (CAs, ports,
switches, links, events); what it reads or sets on its engine, the clock
(real time, manual, or shared with the access layer's timers) and the lock
that serialises every change, lives here.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ibal.clock import ManualClock
from ibal.providers.mock.engine import Engine, FabricCounters
from ibal.providers.mock.faults import FaultPlan
from ibal.providers.mock.packets import Packet
from ibal.providers.mock.topology import Link, MockPort
from ibal.status import InvalidParameter
from ibal.types import AsyncEvent

if TYPE_CHECKING:
    from ibal.providers.mock.sa_agent import SaAgent

__all__ = ["EngineView"]

T = TypeVar("T")


class EngineView:
    """The engine's clock, lock, counters and faults, as the fabric exposes them."""

    engine: Engine
    _shared_clock: ManualClock | None

    # ============================================================ locking
    def _locked(self, fn: Callable[[], T]) -> T:
        try:
            with self.lock:
                out = fn()
                # the SA reports what the change did to the subnet (traps 64/65/128)
                sa = self._sa_active()
                if sa is not None and sa.sweep() and self.engine.runs_inline:
                    self.engine.drive()
                return out
        finally:
            if self.upcalls:
                self.flush_upcalls()

    # ================================================================= clock
    def manual_clock(self, inline: bool = True) -> None:
        """Stop real time: the clock moves only with ``advance``/``settle``.

        With ``inline=False`` verbs also stop delivering packets: they queue
        until ``step``, ``run_until_idle``, ``advance`` or ``settle``.
        """
        self.engine.manual_clock(inline)

    def use_clock(self, clock: ManualClock, inline: bool = True) -> None:
        """Run on ``clock``, shared with others (the access layer's timers).

        The fabric goes manual and becomes a listener of ``clock``: one
        ``clock.advance(x)`` (or this fabric's ``advance``/``settle``) fires the
        fabric's retransmission and RNR timers and every other listener's
        timers in one global time order.  Timers already pending keep their
        remaining time.
        """
        if not isinstance(clock, ManualClock):
            raise InvalidParameter(f"use_clock needs an ibal.clock.ManualClock, not {clock!r}")
        with self.lock:
            old = self._shared_clock
            self.engine.manual_clock_at(clock.now(), inline)
            self._shared_clock = clock
        if old is not None and old is not clock:
            old.detach(self)
        clock.attach(self)

    @property
    def shared_clock(self) -> ManualClock | None:
        """The clock given to :meth:`use_clock`, if any."""
        return self._shared_clock

    def clock_deadline(self) -> float | None:
        """:class:`~ibal.clock.ClockListener`: the next live fabric timer."""
        return self.engine.next_deadline

    def clock_run(self, now: float) -> None:
        """:class:`~ibal.clock.ClockListener`: fire fabric timers due by ``now``."""
        self._locked(lambda: self.engine.advance_to(now))

    def auto_clock(self) -> None:
        """Back to real time (the default): timers fire on a timer thread."""
        shared, self._shared_clock = self._shared_clock, None
        if shared is not None:
            shared.detach(self)
        self._locked(self.engine.real_time_clock)

    @property
    def manual(self) -> bool:
        return self.engine.manual

    def advance(self, seconds: float) -> None:
        """Move the manual clock ``seconds`` on, firing due timers in time order.

        On a shared clock this is ``clock.advance(seconds)``: every listener's
        timers fire too.
        """
        engine = self.engine
        if not engine.manual:
            raise RuntimeError("advance() needs fabric.manual_clock()")
        if seconds < 0:
            raise ValueError("the clock does not go back")
        if self._shared_clock is not None:
            self._shared_clock.advance(seconds)
            return
        self._locked(lambda: engine.advance_to(engine.manual_now + seconds))

    def run_until_idle(self) -> int:
        """Deliver every packet ready now (no clock change); returns how many."""
        return self._locked(self.engine.run_until_idle)

    def step(self) -> bool:
        """Deliver one ready packet; ``False`` when none is ready."""
        return self._locked(self.engine.step)

    @property
    def next_deadline(self) -> float | None:
        """When the next live timer fires (``None`` when nothing is pending)."""
        return self.engine.next_deadline

    @property
    def ready(self) -> int:
        """Packets waiting for delivery now."""
        return self.engine.ready

    def settle(self, max_seconds: float = 3600.0, max_timers: int = 100_000) -> float:
        """Manual clock: fire timers one by one until none is left.

        Stops after ``max_seconds`` of fabric time or ``max_timers`` timers
        (an infinite RNR retry never settles).  Returns the time that passed.
        """
        engine = self.engine
        if not engine.manual:
            raise RuntimeError("settle() needs fabric.manual_clock()")
        start = engine.manual_now
        for _ in range(max_timers):
            self.run_until_idle()
            deadline = engine.next_deadline
            if deadline is None or deadline - start > max_seconds:
                break
            if self._shared_clock is not None:  # other listeners' timers on the way fire too
                self._shared_clock.advance_to(deadline)
                continue
            self._locked(lambda d=deadline: engine.advance_to(d))  # type: ignore[misc]
        return engine.manual_now - start

    # ============================================================ engine view
    # What users and tests read or set on the fabric; the engine owns it all.
    @property
    def sa(self) -> SaAgent:
        """The subnet administrator on the SM port (:mod:`ibal.providers.mock.sa_agent`)."""
        agents = self.engine.mad_agents
        assert agents is not None
        return agents.sa

    def _sa_active(self) -> SaAgent | None:
        agents = self.engine.mad_agents
        return None if agents is None else agents.sa_active

    def _note_link(self, link: Link) -> None:
        sa = self._sa_active()
        if sa is not None:
            sa.note_link(link)

    @property
    def lock(self) -> threading.RLock:
        return self.engine.lock

    @property
    def seed(self) -> int:
        return self.engine.seed

    @property
    def rng(self) -> random.Random:
        return self.engine.rng

    @property
    def counters(self) -> FabricCounters:
        return self.engine.counters

    @property
    def faults(self) -> FaultPlan:
        return self.engine.faults

    @property
    def callback_errors(self) -> list[BaseException]:
        return self.engine.callback_errors

    @property
    def now(self) -> float:
        """The fabric clock, in seconds (virtual under ``manual_clock``)."""
        return self.engine.now

    @property
    def clock(self) -> float:
        """The fabric clock (same as :attr:`now`)."""
        return self.engine.now

    @property
    def latency(self) -> float:
        return self.engine.latency

    @latency.setter
    def latency(self, value: float) -> None:
        self.engine.latency = value

    @property
    def capture(self) -> Callable[[Packet], None] | None:
        return self.engine.capture

    @capture.setter
    def capture(self, value: Callable[[Packet], None] | None) -> None:
        self.engine.capture = value

    @property
    def runs_inline(self) -> bool:
        return self.engine.runs_inline

    @property
    def packet_faults_armed(self) -> bool:
        return self.engine.packet_faults_armed

    @property
    def verb_faults_armed(self) -> bool:
        return self.engine.verb_faults_armed

    @property
    def upcalls(self) -> list[tuple[Any, Callable[[Any], None], Any]]:
        return self.engine.upcalls

    def in_callback(self) -> bool:
        """Whether the calling thread is inside an upcall made by this fabric."""
        return self.engine.in_callback()

    def flush_upcalls(self) -> None:
        self.engine.flush_upcalls()

    def callback_barrier(self) -> None:
        """Wait until no upcall is running on another thread."""
        self.engine.callback_barrier()

    def drive(self) -> None:
        self.engine.drive()

    def port_event(self, port: MockPort, code: AsyncEvent) -> None:
        self.engine.port_event(port, code)
