"""One local port as the CM sees it: :class:`CmPort`, the MAD I/O of ``ibal.cm``.

A :class:`CmPort` belongs to the process-wide agent (``ibal.cm.service``) and
lives in the agent's own AL, hung on ``(ca, port_num)`` so PnP's removal of
the port takes it along.  It owns the port's QP1 alias and one MAD service of
class 0x07 version 2 registered for unsolicited Sends (every CM message is a
Send: the CM retries and matches them itself, by communication IDs), and one
AL timer for the deadlines of every CEP reached through the port (a heap,
as ``ibal.sa.port.SaPort`` does).

Threads: the service is inline, so a received MAD reaches
:attr:`CmPort.on_mad` on the thread that took it off QP1 (the completion
queue on the AL's special-QP transport), which runs the machine, moves the
QP and sends the answer there: no queue hand-off between the receive batch
and the send batch.  Unsolicited CM MADs come as bytes (the service's
``datagram_cb``) and go as bytes (``send_datagram``): no MAD element either
way.  The timer fires on the misc queue.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ibal.al import Dependent
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.status import IbError, ResourceBusy
from ibal.types import LinkLayer, MadAddr, QpType
from ibal.wire.mad import header as mad_header
from ibal.wire.mad.cm import CM_CLASS, CM_CLASS_VERSION
from ibal.wire.mad.consts import Method

if TYPE_CHECKING:
    from ibal.al import Ca, Timer
    from ibal.wire.mad.consts import CmAttr

__all__ = ["CmPort"]

log = logging.getLogger("ibal.cm")
_SLACK = 1e-9
MadHandler = Callable[["CmPort", bytes, MadAddr], None]
_DATA = 232  # a CM message's data area: the MAD after its 24-byte common header


@functools.cache
def _head(attr: CmAttr) -> bytes:
    """The common header of a CM Send of ``attr`` (TID zero: patched per message)."""
    return bytes(mad_header.build(CM_CLASS, Method.SEND, attr, tid=0)[:24])


class Timed(Protocol):
    """What the port's timer serves: ``due`` is its one deadline (``None``: none)."""

    due: float | None

    def fire(self, now: float) -> None: ...


class CmPort(Dependent):
    """The CM's MAD service and timer on one local port (see the module docstring)."""

    _kind = "CM port"

    def __init__(self, ca: Ca, port_num: int, on_mad: MadHandler,
                 on_gone: Callable[[CmPort], object] | None = None) -> None:  # fmt: skip
        attr = ca.query_port(port_num)
        self.ca = ca
        self.ca_guid = ca.guid
        self.port_guid = attr.port_guid
        self.link_layer: LinkLayer = attr.link_layer
        self.on_mad = on_mad
        self.on_gone = on_gone
        self.stats: dict[str, int] = {"sent": 0, "send_failed": 0}
        self._tlock = threading.Lock()
        self._heap: list[tuple[float, int, Timed]] = []
        self._tseq = itertools.count()
        self._compact_at = 64  # heap size that triggers the next sweep of disarmed entries
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self._clock = ca.al.timers.clock
        pd = ca.alloc_pd()
        svc = MadSvc(CM_CLASS, CM_CLASS_VERSION, self._recv, self._sent,
                     methods=frozenset({Method.SEND}), support_unsol=True)  # fmt: skip
        try:
            alias = pd.get_spl_qp(self.port_guid, QpType.QP1_ALIAS)
            self.service: MadService = reg_mad_svc(alias, svc, inline=True,
                                                   datagram_cb=self._datagram)  # fmt: skip
        except ResourceBusy:
            # Another CM owns the port's CM class (another manager of this process, or the
            # kernel's CM through umad): no CM of ours on this port.
            log.warning("%s port %d: another CM serves class 0x07 here", ca.name, port_num)
            pd.dealloc()
            raise
        except BaseException:
            pd.dealloc()
            raise
        self._pd = pd
        super().__init__((ca, port_num))

    def __repr__(self) -> str:
        return f"<CmPort {self.ca.name} port {self.port_num} 0x{self.port_guid:016x}>"

    # ------------------------------------------------------------------ MADs
    @property
    def hi_tid(self) -> int:
        """The TID high half the port's transport stamps on our requests (0: the kernel's)."""
        hi = self.service.hi_tid
        return 0 if hi is None else hi

    def send(self, attr: CmAttr, tid: int, data: bytes, addr: MadAddr) -> bool:
        """Send one CM message (method Send, no MAD-layer retry); ``False`` if it could not go."""
        if len(data) != _DATA:
            raise ValueError(f"CM data is {_DATA} bytes, not {len(data)}")
        head = _head(attr)
        try:
            self.service.send_datagram(head[:8] + tid.to_bytes(8, "big") + head[16:] + data, addr)
        except IbError as exc:
            self.stats["send_failed"] += 1
            log.debug("%r: CM MAD not sent: %s", self, exc)
            return False
        self.stats["sent"] += 1
        return True

    def _sent(self, e: MadElement) -> None:
        put_mad(e)

    def _recv(self, e: MadElement) -> None:
        # Only responses come as elements, and the CM sends none (every CM message is a Send).
        put_mad(e)

    def _datagram(self, mad: bytes, addr: MadAddr) -> None:
        self.on_mad(self, mad, addr)

    # ------------------------------------------------------------------ time
    def now(self) -> float:
        return self._clock.now()

    def arm(self, item: Timed, at: float | None) -> None:
        """Set ``item``'s one deadline (``None``: disarm); ``item.fire(now)`` runs on the
        misc queue when it comes.  Disarming only forgets it: its entry is skipped."""
        with self._tlock:
            item.due = at
            if at is None:
                return
            heap = self._heap
            if len(heap) >= self._compact_at:  # drop disarmed entries; amortised O(1)
                heap[:] = [d for d in heap if d[2].due == d[0]]
                heapq.heapify(heap)
                self._compact_at = max(64, 2 * len(heap))
            heapq.heappush(heap, (at, next(self._tseq), item))
            if self._timer_at is None or at < self._timer_at:
                self._arm_timer(at)

    def _arm_timer(self, at: float) -> None:
        self._timer_at = at
        delay = max(at - self.now(), 0.0)
        with contextlib.suppress(IbError):  # the port is going away
            if self._timer is None:
                self._timer = self.call_later(delay, self._on_timer)
            else:
                self._timer.reschedule(delay)

    def _on_timer(self) -> None:
        with self._tlock:
            now = self.now()
            heap = self._heap
            due: list[Timed] = []
            while heap and heap[0][0] <= now + _SLACK:
                at, _, item = heapq.heappop(heap)
                if item.due == at:
                    item.due = None
                    due.append(item)
            while heap and heap[0][2].due != heap[0][0]:
                heapq.heappop(heap)  # disarmed meanwhile: no reason to wake for it
            self._timer_at = None
            if heap:
                self._arm_timer(heap[0][0])
        for item in due:
            item.fire(now)

    @property
    def armed(self) -> int:
        """Deadlines armed (entries of disarmed items not counted)."""
        with self._tlock:
            return sum(1 for at, _, item in self._heap if item.due == at)

    def on_destroying(self) -> None:
        with self._tlock:
            self._heap.clear()
            self._timer_at = None
        if self.on_gone is not None:  # its endpoints can no longer send, time or hear
            self.on_gone(self)

    def cleanup(self) -> None:
        with contextlib.suppress(IbError):
            self._pd.dealloc()  # its alias QP and the MAD service go with it
