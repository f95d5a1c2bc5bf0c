"""The mock engine's core: its state, the clock and timers, upcalls, completions, QP errors.

The engine is split by job into mixins over this core: :mod:`.transmit`
(memory access, routing, the wire), :mod:`.requester` and :mod:`.responder`;
:class:`~ibal.providers.mock.engine.Engine` puts them together.  The shared
plain-int constants of the hot path live here.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ibal.providers.mock.agents import MadAgents
from ibal.providers.mock.faults import FaultPlan
from ibal.providers.mock.objects import (
    MockCq,
    MockMcast,
    MockQp,
    SendWqe,
)
from ibal.providers.mock.packets import (
    Packet,
    ack_timeout_seconds,
)
from ibal.providers.mock.topology import MockPort
from ibal.transport.wc import make_wc
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    EventRecord,
    NetworkHeader,
    QpState,
    QpType,
    RecvOpt,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.providers.mock.ca_state import CaState

# Plain ints for the hot path (IntFlag arithmetic is slow).
_LOCAL_WRITE = int(AccessFlags.LOCAL_WRITE)
_RDMA_READ = int(AccessFlags.RDMA_READ)
_RDMA_WRITE = int(AccessFlags.RDMA_WRITE)
_ATOMIC = int(AccessFlags.ATOMIC)

_RTS = QpState.RTS
_SQD = QpState.SQD
_RTR = QpState.RTR
_SQERR = QpState.SQERR
_ERROR = QpState.ERROR
_RC = QpType.RC
_UC = QpType.UC
_UD = QpType.UD

_OK = WcStatus.SUCCESS
_RECV = WcType.RECV
_RECV_WRITE = WcType.RECV_RDMA_WRITE
_FLUSHED = WcStatus.WR_FLUSHED_ERR
_INV_REQ = WcStatus.REM_INVALID_REQ_ERR
_NO_OPT = RecvOpt.NONE

_SEND_WC: dict[WrType, WcType] = {
    WrType.SEND: WcType.SEND,
    WrType.RDMA_WRITE: WcType.RDMA_WRITE,
    WrType.RDMA_READ: WcType.RDMA_READ,
    WrType.COMPARE_SWAP: WcType.COMPARE_SWAP,
    WrType.FETCH_ADD: WcType.FETCH_ADD,
    WrType.LOCAL_INV: WcType.LOCAL_INV,
    WrType.BIND_MW: WcType.MW_BIND,
}


_IB_GRH = NetworkHeader.IB_GRH  # the mock is an InfiniBand fabric

MAX_MSG = 1 << 31
MCAST_LID_MIN = 0xC000
MCAST_LID_MAX = 0xFFFE
PERMISSIVE = 0xFFFF

_T_PACKET = 0
_T_ACK = 1
_T_RNR = 2
_T_CALL = 3  # an agent's timer (``obj.fire()``): see ibal.providers.mock.sa_agent

_ATOMIC_CACHE = 64


@dataclass(slots=True)
class FabricCounters:
    """What happened on the wire, for tests and ``vendor_call``."""

    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    dropped_fault: int = 0
    dropped_link: int = 0
    dropped_no_dest: int = 0
    dropped_state: int = 0
    dropped_no_recv: int = 0
    dropped_seq: int = 0
    dropped_access: int = 0
    corrupted: int = 0
    corrupted_sent: int = 0
    duplicated: int = 0
    delayed: int = 0
    duplicates_received: int = 0
    retransmitted: int = 0
    acks: int = 0
    naks: int = 0
    rnr_naks: int = 0
    timeouts: int = 0
    rnr_retries: int = 0
    pkey_violations: int = 0
    qkey_violations: int = 0
    cq_overflows: int = 0
    completions: int = 0
    smp_dropped: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


class EngineCore:
    """State, clock, upcalls and completions of one fabric's engine."""


    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._cb_lock = threading.RLock()
        self._tls = threading.local()
        self._manual = False
        self.runs_inline = True
        self._now_manual = 0.0
        self._t0 = time.monotonic()
        self._ready: deque[Packet] = deque()
        self.timer_heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0
        self._driving = False
        self.ack_wait: set[MockQp] = set()
        self.upcalls: list[tuple[Any, Callable[[Any], None], Any]] = []
        self.counters = FabricCounters()
        self.faults = FaultPlan(self)
        self.packet_faults_armed = False
        self.verb_faults_armed = False
        self.mcast_groups: dict[int, list[MockMcast]] = {}
        self._topo_gen = 0
        self._timer_thread: threading.Thread | None = None
        self._closed = False
        self.latency = 0.0
        self.callback_errors: list[BaseException] = []
        # IBAL_CAPTURE / the "capture" option: called with every transmitted packet
        self.capture: Callable[[Packet], None] | None = None
        # the SMA/PMA behind QP0/QP1 (set by the fabric): ibal.providers.mock.agents
        self.mad_agents: MadAgents | None = None

    def call_at(self, deadline: float, timer: Any) -> None:
        """Call ``timer.fire()`` at ``deadline`` on the fabric clock (lock held) unless
        ``timer.alive`` is cleared (or ``timer.timer_gen`` moved on) first."""
        self._schedule(deadline, _T_CALL, timer, timer.timer_gen)

    if TYPE_CHECKING:  # defined by the requester and responder parts
        def sq_progress(self, qp: MockQp) -> None: ...
        def _ack_timeout(self, qp: MockQp) -> None: ...
        def _receive(self, pkt: Packet) -> None: ...
        def _requester_rx(self, pkt: Packet) -> None: ...

    # ================================================================== clock
    @property
    def now(self) -> float:
        """The fabric clock, in seconds (virtual under ``manual_clock``)."""
        return self._now_manual if self._manual else time.monotonic() - self._t0

    @property
    def clock(self) -> float:
        """The fabric clock (same as :attr:`now`)."""
        return self.now

    def _schedule(self, deadline: float, kind: int, obj: Any, gen: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.timer_heap, (deadline, self._seq, kind, obj, gen))
        if not self._manual:
            self._kick_timer_thread()

    def _fire(self, kind: int, obj: Any, gen: int) -> None:
        if kind == _T_PACKET:
            self._ready.append(obj)
            return
        if kind == _T_CALL:
            if obj.alive and obj.timer_gen == gen:
                obj.alive = False
                obj.fire()
            return
        qp: MockQp = obj
        if not qp.alive or qp.timer_gen != gen:
            return
        qp.timer_armed = False
        if kind == _T_ACK:
            self._ack_timeout(qp)
        else:
            qp.rnr_blocked = False
            self.sq_progress(qp)

    def _fire_due(self, until: float) -> None:
        heap = self.timer_heap
        while heap and heap[0][0] <= until:
            deadline, _, kind, obj, gen = heapq.heappop(heap)
            if self._manual and deadline > self._now_manual:
                self._now_manual = deadline
            self._fire(kind, obj, gen)
            self._run_ready()

    def _run_ready(self) -> None:
        ready = self._ready
        receive = self._receive
        while ready:
            receive(ready.popleft())
        if self.ack_wait:
            self._arm_ack_timers()

    def advance_to(self, target: float) -> None:
        """Manual clock: fire every timer due up to ``target``, in time order (lock held)."""
        if self._driving:
            return
        self._driving = True
        try:
            self._run_ready()
            self._fire_due(target)
            if target > self._now_manual:
                self._now_manual = target
        finally:
            self._driving = False

    # ------------------------------------------------------------ clock modes
    @property
    def manual(self) -> bool:
        """Whether the clock moves only when told to (``manual_clock``/``use_clock``)."""
        return self._manual

    @property
    def manual_now(self) -> float:
        """The manual clock's reading (meaningful only while :attr:`manual`)."""
        return self._now_manual

    def manual_clock(self, inline: bool = True) -> None:
        """Stop real time at :attr:`now`; ``inline`` says whether verbs drive the queue."""
        with self._cond:
            if not self._manual:
                self._now_manual = self.now
                self._manual = True
            self.runs_inline = inline
            self._cond.notify_all()

    def manual_clock_at(self, now: float, inline: bool = True) -> None:
        """Go manual at ``now`` (another clock's reading); pending timers keep their
        remaining time."""
        with self._cond:
            shift = now - self.now
            if shift and self.timer_heap:
                self.timer_heap = [(d + shift, *rest) for d, *rest in self.timer_heap]
            self._now_manual = now
            self._manual = True
            self.runs_inline = inline
            self._cond.notify_all()

    def real_time_clock(self) -> None:
        """Back to real time from :attr:`now` on, timers on the timer thread (lock held)."""
        if self._manual:
            self._t0 = time.monotonic() - self._now_manual
            self._manual = False
        self.runs_inline = True
        if self.timer_heap:
            self._kick_timer_thread()
        self.drive()

    def run_until_idle(self) -> int:
        """Deliver every packet ready now (lock held); returns how many."""
        n = 0
        ready = self._ready
        self._driving = True
        try:
            while ready:
                self._receive(ready.popleft())
                n += 1
            if self.ack_wait:
                self._arm_ack_timers()
        finally:
            self._driving = False
        return n

    def step(self) -> bool:
        """Deliver one ready packet (lock held); ``False`` when none is ready."""
        if not self._ready:
            return False
        self._driving = True
        try:
            self._receive(self._ready.popleft())
            if not self._ready and self.ack_wait:
                self._arm_ack_timers()
        finally:
            self._driving = False
        return True

    @property
    def next_deadline(self) -> float | None:
        """When the next live timer fires (``None`` when nothing is pending)."""
        with self.lock:
            for deadline, _, kind, obj, gen in sorted(self.timer_heap):
                if kind == 0 or (obj.alive and obj.timer_gen == gen):
                    return deadline
            return None

    @property
    def ready(self) -> int:
        """Packets waiting for delivery now."""
        return len(self._ready)

    @property
    def topo_gen(self) -> int:
        """Bumped on every topology change (routes and LFTs are cached by it)."""
        return self._topo_gen

    def topology_changed(self) -> None:
        """Ports, links or LIDs changed: packets in flight are routed again (lock held)."""
        self._topo_gen += 1

    # ------------------------------------------------------------ lifetime
    def open(self) -> None:
        """Allow the timer thread again (after :meth:`close`)."""
        with self.lock:
            self._closed = False

    def close(self) -> None:
        """Stop the timer thread and start no new one until :meth:`open`."""
        with self.lock:
            self._closed = True
        self._stop_timer_thread()

    # ------------------------------------------------------------ timer thread
    def _kick_timer_thread(self) -> None:
        t = self._timer_thread
        if t is None or not t.is_alive():
            if self._closed:
                return
            t = threading.Thread(target=self._timer_loop, name="ibal-mock-timer", daemon=True)
            self._timer_thread = t
            t.start()
        else:
            self._cond.notify_all()

    def _timer_loop(self) -> None:
        idle_since: float | None = None
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._closed or self._manual or self._timer_thread is not me:
                    if self._timer_thread is me:
                        self._timer_thread = None
                    return
                heap = self.timer_heap
                now = self.now
                if heap and heap[0][0] <= now:
                    idle_since = None
                    self.drive()
                    wait = None
                elif heap:
                    idle_since = None
                    wait = heap[0][0] - now
                else:
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since > 2.0:
                        self._timer_thread = None
                        return
                    wait = 0.5
                if wait is not None:
                    self._cond.wait(wait)
            if self.upcalls:
                self.flush_upcalls()

    def _stop_timer_thread(self) -> None:
        with self._cond:
            t = self._timer_thread
            self._timer_thread = None
            self._cond.notify_all()
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    # ================================================================== drive
    def drive(self) -> None:
        """Process every ready event (and, on the real-time clock, due timers)."""
        if self._driving:
            return
        self._driving = True
        try:
            self._run_ready()
            heap = self.timer_heap
            if heap and not self._manual and heap[0][0] <= self.now:
                self._fire_due(self.now)
        finally:
            self._driving = False

    def _arm_ack_timers(self) -> None:
        waiting = self.ack_wait
        self.ack_wait = set()
        now: float | None = None
        for qp in waiting:
            if (
                not qp.alive
                or qp.send_idx == 0
                or qp.timer_armed
                or qp.rnr_blocked
                or (qp.state is not _RTS and qp.state is not _SQD)
            ):
                continue
            timeout = ack_timeout_seconds(qp.local_ack_timeout)
            if not timeout:
                continue
            if now is None:
                now = self.now
            qp.timer_gen += 1
            qp.timer_armed = True
            self._schedule(now + timeout, _T_ACK, qp, qp.timer_gen)

    @staticmethod
    def cancel_timer(qp: MockQp) -> None:
        qp.timer_gen += 1
        qp.timer_armed = False
        qp.rnr_blocked = False

    # ================================================================ upcalls
    def _completion_upcall(self, cq: MockCq) -> None:
        h = cq.ca.opened
        if h is not None:
            self.upcalls.append((cq, h.completion_cb, cq.context))

    def _event(
        self, obj: Any, ca: CaState, code: AsyncEvent, context: Any, port_num: int = 0
    ) -> None:
        h = ca.opened
        if h is None:
            return
        rec = EventRecord(code, context, 0, port_num)
        self.upcalls.append((obj if obj is not None else h, h.async_event_cb, rec))

    def qp_event(self, qp: MockQp, code: AsyncEvent) -> None:
        self._event(qp, qp.ca, code, qp.context, qp.port_num)

    def port_event(self, port: MockPort, code: AsyncEvent) -> None:
        h = port.ca.opened
        if h is not None:
            self._event(h, port.ca, code, h.context, port.num)

    def in_callback(self) -> bool:
        """Whether the calling thread is inside an upcall made by this fabric."""
        return bool(getattr(self._tls, "in_cb", False))

    def flush_upcalls(self) -> None:
        tls = self._tls
        if getattr(tls, "in_cb", False):
            return  # the flush running further up this stack delivers them
        first: BaseException | None = None
        with self._cb_lock:
            tls.in_cb = True
            try:
                while True:
                    with self.lock:
                        batch = self.upcalls
                        if not batch:
                            break
                        self.upcalls = []
                    for obj, fn, arg in batch:
                        if not obj.alive:
                            continue
                        try:
                            fn(arg)
                        except BaseException as exc:  # a consumer bug: report it later
                            self.callback_errors.append(exc)
                            if first is None:
                                first = exc
            finally:
                tls.in_cb = False
        if first is not None:
            raise first

    def callback_barrier(self) -> None:
        """Wait until no upcall is running on another thread."""
        with self._cb_lock:
            pass

    # ============================================================ completions
    def _push_wc(self, cq: MockCq, wc: Wc, solicited: bool = False) -> None:
        if not cq.alive:
            return
        ents = cq.entries
        if len(ents) >= cq.size:
            cq.overflowed += 1
            self.counters.cq_overflows += 1
            if cq.overflowed == 1:
                self._event(cq, cq.ca, AsyncEvent.CQ_ERROR, cq.context)
            return
        ents.append(wc)
        self.counters.completions += 1
        if cq.notify and (cq.notify == 1 or solicited or wc.status is not _OK):
            cq.notify = 0
            self._completion_upcall(cq)
        if cq.notify_n:
            cq.notify_n -= 1
            if not cq.notify_n:
                self._completion_upcall(cq)

    def _complete_front(self, qp: MockQp) -> None:
        """Move finished send WQEs off the front of the queue, in order."""
        sq = qp.sq
        cq = qp.send_cq
        while sq and sq[0].done:
            w = sq.popleft()
            qp.send_idx -= 1
            if w.status is not _OK or w.signaled:
                wc_type = WcType.MW_BIND if w.bind is not None else _SEND_WC[w.opcode]
                self._push_wc(
                    cq, make_wc(w.wr_id, wc_type, w.status, w.length, None, _NO_OPT, qp.num)
                )
        if qp.sqd_notify and qp.state is _SQD and qp.send_idx == 0:
            qp.sqd_notify = False
            self.qp_event(qp, AsyncEvent.SQ_DRAINED)

    def flush_recv(self, qp: MockQp, wr_id: int) -> None:
        self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, _FLUSHED, 0, None, _NO_OPT, qp.num))

    # ============================================================ QP errors
    def qp_error(self, qp: MockQp, event: AsyncEvent | None = None) -> None:
        """Move ``qp`` to ERROR: complete what finished, flush every other WQE."""
        if qp.state is _ERROR:
            return
        qp.state = _ERROR
        self.cancel_timer(qp)
        qp.rnr_blocked = False
        self.flush_sq(qp)
        rq = qp.rq
        while rq:
            self.flush_recv(qp, rq.popleft()[0])
        if event is not None:
            self.qp_event(qp, event)
        if qp.srq is not None:
            self.qp_event(qp, AsyncEvent.SRQ_QP_LAST_WQE_REACHED)

    def _sq_error(self, qp: MockQp) -> None:
        """UC/UD send-queue error: SQE state, send queue flushed, receives go on."""
        if qp.state is _ERROR or qp.state is _SQERR:
            return
        qp.state = _SQERR
        self.flush_sq(qp)

    def flush_sq(self, qp: MockQp) -> None:
        sq = qp.sq
        cq = qp.send_cq
        while sq:
            w = sq.popleft()
            if w.done:
                status = w.status
                if status is _OK and not w.signaled:
                    continue
            else:
                status = _FLUSHED
            wc_type = WcType.MW_BIND if w.bind is not None else _SEND_WC[w.opcode]
            self._push_wc(cq, make_wc(w.wr_id, wc_type, status, w.length, None, _NO_OPT, qp.num))
        qp.send_idx = 0
        qp.rd_atomic_out = 0

    def _fail_wqe(self, qp: MockQp, wqe: SendWqe, status: WcStatus) -> None:
        """A requester-side error on ``wqe``: it completes with ``status``."""
        wqe.done = True
        wqe.status = status
        if qp.transport is _RC:
            self.qp_error(qp)
        else:
            self._sq_error(qp)

