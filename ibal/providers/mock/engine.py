"""The mock fabric's engine: a sans-IO transport driven by a clock.

Packets between QPs are events on a queue.  ``drive`` processes the queue in
order until nothing is ready; timers (ACK timeouts, RNR waits, delayed
packets) sit on a heap keyed by the fabric clock.  Nothing here does I/O or
sleeps, so a run is fully determined by the calls made, the clock and the seed
of the fault RNG.

Who drives:

* by default every verb that makes work (``post_send``, ``modify_qp``, ...)
  drives the queue inline until it is quiescent, and a timer thread fires due
  timers in real time;
* with ``fabric.manual_clock()`` the clock only moves on ``fabric.advance()``
  (and ``settle()``), so tests step RNR waits and retransmissions exactly.

Upcalls (completion and async-event callbacks) are collected while the fabric
lock is held and made after it is released, never for an object that is
already destroyed.
"""

from __future__ import annotations

from ibal.providers.mock.engine_core import FabricCounters
from ibal.providers.mock.requester import Requester
from ibal.providers.mock.responder import Responder

__all__ = ["Engine", "FabricCounters"]


class Engine(Requester, Responder):
    """Scheduling, routing and the RC/UC/UD transport of one fabric.

    The jobs are mixins: :class:`~.engine_core.EngineCore` (state, clock,
    upcalls, completions), :class:`~.transmit.Transmit` (memory, routing,
    wire), :class:`~.requester.Requester` and :class:`~.responder.Responder`.
    """
