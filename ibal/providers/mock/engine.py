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

import heapq
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ibal.providers.mock import invalidate
from ibal.providers.mock.agents import MadAgents, claims
from ibal.providers.mock.faults import FaultPlan
from ibal.providers.mock.objects import (
    MockCq,
    MockMcast,
    MockMr,
    MockMw,
    MockPd,
    MockQp,
    MockSrq,
    RecvSge,
    RecvWqe,
    SendWqe,
)
from ibal.providers.mock.packets import (
    GRH_LEN,
    MCAST_QPN,
    PSN_MASK,
    NakCode,
    Packet,
    PacketOp,
    ack_timeout_seconds,
    build_grh,
    packets_for,
    psn_diff,
    rnr_seconds,
)
from ibal.providers.mock.pma import wire_cost
from ibal.providers.mock.topology import Link, MockPort, Route, Switch
from ibal.transport.rules import NAK_WC_STATUS, atomic_result, effective_qkey, pkey_match
from ibal.transport.wc import make_wc
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AsyncEvent,
    EventRecord,
    LinkState,
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


class Engine:
    """Scheduling, routing and the RC/UC/UD transport of one fabric."""

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

    # =============================================================== memory
    @staticmethod
    def _local(
        ca: CaState, pd: MockPd, addr: int, length: int, lkey: int, write: bool
    ) -> tuple[MockMr, int] | None:
        mr = ca.keys.get(lkey)
        if mr is None or mr.__class__ is not MockMr or mr.lkey != lkey or mr.pd is not pd:
            return None
        off = addr - mr.vaddr
        if off < 0 or off + length > mr.length:
            return None
        if write and not mr.acc & _LOCAL_WRITE:
            return None
        return mr, off

    @staticmethod
    def _remote(
        ca: CaState, qp: MockQp, rkey: int, addr: int, length: int, need: int
    ) -> tuple[MockMr, int] | None:
        if not qp.acc & need:
            return None
        obj = ca.keys.get(rkey)
        if obj is None:
            return None
        if obj.__class__ is MockMr:
            mr: MockMr = obj
            if mr.rkey != rkey or mr.pd is not qp.pd or not mr.acc & need:
                return None
            off = addr - mr.vaddr
            if off < 0 or off + length > mr.length:
                return None
            return mr, off
        mw: MockMw = obj  # type: ignore[assignment]
        bound = mw.mr
        if mw.rkey != rkey or bound is None or mw.pd is not qp.pd or not mw.acc & need:
            return None
        if mw.qp is not None and mw.qp is not qp:
            return None  # type 2B: only through the QP it was bound on
        if addr < mw.addr or addr + length > mw.addr + mw.length:
            return None
        return bound, addr - bound.vaddr

    def gather(self, qp: MockQp, wqe: SendWqe) -> bytes | memoryview | None:
        if wqe.inline is not None:
            return wqe.inline
        sges = wqe.sges
        if not sges:
            return b""
        ca = qp.ca
        pd = qp.pd
        if len(sges) == 1:
            addr, length, lkey = sges[0]
            if not length:
                return b""
            got = self._local(ca, pd, addr, length, lkey, False)
            if got is None:
                return None
            return got[0].read(got[1], length)
        parts: list[bytes | memoryview] = []
        for addr, length, lkey in sges:
            if not length:
                continue
            got = self._local(ca, pd, addr, length, lkey, False)
            if got is None:
                return None
            parts.append(got[0].read(got[1], length))
        return b"".join(parts)

    def _scatter(
        self,
        ca: CaState,
        pd: MockPd,
        sges: tuple[RecvSge, ...],
        writes: tuple[tuple[int, bytes | memoryview], ...],
    ) -> WcStatus:
        """Write each ``(offset, data)`` into the scatter list; check every SGE first."""
        end = 0
        for off, data in writes:
            end = max(end, off + len(data))
        if len(sges) == 1:
            addr, length, lkey = sges[0]
            if end > length:
                return WcStatus.LOCAL_LEN_ERR
            if not length:
                return _OK
            got = self._local(ca, pd, addr, length, lkey, True)
            if got is None:
                return WcStatus.LOCAL_PROTECTION_ERR
            mr, base = got
            for off, data in writes:
                if len(data):
                    mr.write(base + off, data)
            return _OK
        if end > sum(s[1] for s in sges):
            return WcStatus.LOCAL_LEN_ERR
        targets: list[tuple[MockMr, int, int]] = []
        for addr, length, lkey in sges:
            if not length:
                continue
            got = self._local(ca, pd, addr, length, lkey, True)
            if got is None:
                return WcStatus.LOCAL_PROTECTION_ERR
            targets.append((got[0], got[1], length))
        for off, data in writes:
            src = memoryview(data).cast("B") if not isinstance(data, bytes) else data
            pos = 0
            n = len(src)
            skip = off
            for mr, base, length in targets:
                if pos >= n:
                    break
                if skip >= length:
                    skip -= length
                    continue
                take = min(length - skip, n - pos)
                mr.write(base + skip, src[pos : pos + take])
                pos += take
                skip = 0
        return _OK

    # ================================================================ routing
    def route_to(self, src: MockPort, dlid: int) -> Route | None:
        """Where a packet from ``src`` to ``dlid`` goes, and the links it crosses."""
        return self._route(src, dlid)

    def _route(self, src: MockPort, dlid: int) -> Route | None:
        if src.routes_gen != self._topo_gen:
            src.routes.clear()
            src.routes_gen = self._topo_gen
        try:
            return src.routes[dlid]
        except KeyError:
            route = self._compute_route(src, dlid)
            src.routes[dlid] = route
            return route

    def _compute_route(self, src: MockPort, dlid: int) -> Route | None:
        if src.removed or src.state is not LinkState.ACTIVE:
            return None
        if src.lid <= dlid < src.lid + (1 << src.lmc):
            return (src, ())
        link = src.link
        if link is None or not link.up:
            return None
        if dlid == PERMISSIVE:
            peer = link.other(src)
            if isinstance(peer, MockPort) and peer.state is LinkState.ACTIVE:
                return (peer, (link,))
            return None
        # Breadth-first through switches; CA ports are leaves.
        seen: set[int] = {id(src)}
        frontier: list[tuple[MockPort | Switch, tuple[Link, ...]]] = [(link.other(src), (link,))]
        while frontier:
            nxt: list[tuple[MockPort | Switch, tuple[Link, ...]]] = []
            for node, path in frontier:
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if isinstance(node, MockPort):
                    if (
                        not node.removed
                        and node.state is LinkState.ACTIVE
                        and node.lid <= dlid < node.lid + (1 << node.lmc)
                    ):
                        return (node, path)
                    continue
                for ln in node.links:
                    if ln.up:
                        nxt.append((ln.other(node), (*path, ln)))
            frontier = nxt
        return None

    def _still_routable(self, pkt: Packet) -> bool:
        dst = pkt.dst_port
        if dst.removed or dst.state is not LinkState.ACTIVE:
            return False
        route = self._route(pkt.src_port, dst.lid)
        return route is not None and route[0] is dst

    # =============================================================== transmit
    def _transmit(self, pkt: Packet) -> None:
        self.counters.sent += 1
        pm = pkt.src_port.pm
        n, words = pkt.cost = wire_cost(pkt)
        pm[2] += n
        pm[0] += words
        pkt.topo = self._topo_gen
        if self.capture is not None:
            self.capture(pkt)
        if self.packet_faults_armed:
            for p, delay in self.faults.on_packet(pkt, self.rng):
                delay += self.latency
                if delay > 0:
                    self._hold(p, delay)
                else:
                    self._ready.append(p)
            return
        if self.latency:
            self._hold(pkt, self.latency)
        else:
            self._ready.append(pkt)

    def _hold(self, pkt: Packet, delay: float) -> None:
        """Deliver ``pkt`` after ``delay``.

        A UD or UC send completes when it is transmitted, and the sender may then
        reuse its buffer: a packet that outlives the send gets its own copy.  RC
        keeps the view (its send completes only once the responder acknowledged).
        """
        if pkt.transport is not _RC and not isinstance(pkt.payload, bytes):
            pkt.payload = bytes(pkt.payload)
        self._schedule(self.now + delay, _T_PACKET, pkt)

    def _drop(self, why: str) -> None:
        c = self.counters
        c.dropped += 1
        setattr(c, why, getattr(c, why) + 1)

    # ================================================================ requester
    def sq_progress(self, qp: MockQp) -> None:
        """Transmit whatever the send queue may send now."""
        if qp.rnr_blocked:
            return
        state = qp.state
        if state is not _RTS and state is not _SQD:
            return
        sq = qp.sq
        while qp.send_idx < len(sq):
            wqe = sq[qp.send_idx]
            if wqe.done:  # answered already; a go-back-N does not resend it
                qp.send_idx += 1
                continue
            if wqe.psn is None:
                if state is _SQD:
                    return
                if wqe.fence and qp.rd_atomic_out:
                    return
                if wqe.is_rd_atomic and qp.rd_atomic_out >= max(1, qp.init_depth):
                    return
            qp.send_idx += 1
            self._send_wqe(qp, wqe)
            if qp.state is not state or qp.rnr_blocked:
                return

    def _send_wqe(self, qp: MockQp, wqe: SendWqe) -> None:
        if wqe.local is not None:
            self._local_op(qp, wqe)
            return
        if wqe.bind is not None:
            wqe.done = True
            if wqe.psn is None:
                wqe.psn = qp.sq_psn
                wqe.npsn = 0
            self._complete_front(qp)
            return
        transport = qp.transport
        op = wqe.opcode
        if op is WrType.SEND or op is WrType.RDMA_WRITE:
            data = self.gather(qp, wqe)
            if data is None:
                self._fail_wqe(qp, wqe, WcStatus.LOCAL_PROTECTION_ERR)
                self._complete_front(qp)
                return
        else:
            data = b""
        port = qp.port
        if port is None:
            self._fail_wqe(qp, wqe, WcStatus.LOCAL_OP_ERR)
            self._complete_front(qp)
            return
        if wqe.length >= MAX_MSG:
            self._fail_wqe(qp, wqe, WcStatus.LOCAL_LEN_ERR)
            self._complete_front(qp)
            return
        if transport is _UD:
            self._send_ud(qp, wqe, port, data)
            return
        # ------------------------------------------------------------ RC / UC
        first = wqe.psn is None
        if first:
            if op is WrType.RDMA_READ:
                npsn = packets_for(wqe.length, qp.mtu_bytes)
            elif wqe.is_rd_atomic:
                npsn = 1
            else:
                npsn = packets_for(wqe.length, qp.mtu_bytes)
            wqe.psn = qp.sq_psn
            wqe.npsn = npsn
            qp.sq_psn = (qp.sq_psn + npsn) & PSN_MASK
            if wqe.is_rd_atomic:
                qp.rd_atomic_out += 1
        else:
            self.counters.retransmitted += 1
        av = qp.av
        route = self._route(port, av.dlid) if av is not None else None
        if op is WrType.SEND:
            pop = PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM
        elif op is WrType.RDMA_WRITE:
            pop = PacketOp.RDMA_WRITE if wqe.imm is None else PacketOp.RDMA_WRITE_IMM
        elif op is WrType.RDMA_READ:
            pop = PacketOp.RDMA_READ_REQ
        elif op is WrType.COMPARE_SWAP:
            pop = PacketOp.COMPARE_SWAP
        else:
            pop = PacketOp.FETCH_ADD
        if route is None:
            self.counters.sent += 1
            self._drop("dropped_link")
        else:
            pkt = Packet(
                pop, transport, port, route[0], route[1], qp.num, qp.dest_qp,
                wqe.psn,  # type: ignore[arg-type]
                port.pkeys[qp.pkey_index] if qp.pkey_index < len(port.pkeys) else 0,
                data,
            )
            pkt.npsn = wqe.npsn
            pkt.imm = wqe.imm
            pkt.inv = wqe.inv
            pkt.solicited = wqe.solicited
            if pop is not PacketOp.SEND and pop is not PacketOp.SEND_IMM:
                pkt.remote_addr = wqe.remote_addr
                pkt.rkey = wqe.rkey
                if pop is PacketOp.RDMA_READ_REQ:
                    pkt.length = wqe.length
                elif wqe.is_rd_atomic:
                    pkt.length = 8
                    pkt.compare = wqe.compare
                    pkt.swap = wqe.swap
            self._transmit(pkt)
        if transport is _RC:
            self.ack_wait.add(qp)
        else:
            wqe.done = True
            self._complete_front(qp)

    def _local_op(self, qp: MockQp, wqe: SendWqe) -> None:
        """LOCAL_INV or a type 2 BIND_MW, reached in send-queue order."""
        loc = wqe.local
        assert loc is not None
        if loc[0] == "inv":
            status = invalidate.local_invalidate(qp.ca, qp, loc[1])
        else:
            status = invalidate.bind_type2(qp.ca, qp, *loc[1:])
        if wqe.psn is None:
            wqe.psn = qp.sq_psn
            wqe.npsn = 0
        if status is _OK:
            wqe.done = True
        else:
            self._fail_wqe(qp, wqe, status)
        self._complete_front(qp)

    def _send_ud(self, qp: MockQp, wqe: SendWqe, port: MockPort, data: bytes | memoryview) -> None:
        ud = wqe.ud
        assert ud is not None
        if wqe.status is not _OK:  # refused at post time (an AV of another PD)
            self._fail_wqe(qp, wqe, wqe.status)
            self._complete_front(qp)
            return
        attr, dqpn, qkey, pkey_index = ud
        if qp.qp_type is not QpType.QP1:
            pkey_index = qp.pkey_index
        if wqe.length > port.max_mtu.bytes or pkey_index >= len(port.pkeys):
            status = (
                WcStatus.LOCAL_LEN_ERR if wqe.length > port.max_mtu.bytes else WcStatus.LOCAL_OP_ERR
            )
            self._fail_wqe(qp, wqe, status)
            self._complete_front(qp)
            return
        qkey = effective_qkey(qkey, qp.qkey)
        pkey = port.pkeys[pkey_index]
        if wqe.psn is None:
            wqe.psn = qp.sq_psn
            qp.sq_psn = (qp.sq_psn + 1) & PSN_MASK
        if qp.special and self.mad_agents is not None and claims(qp.qp_type, dqpn, data):
            self._agent_reply(qp, port, attr.dlid, bytes(data), pkey)
            wqe.done = True
            self._complete_front(qp)
            return
        grh: bytes | None = None
        if attr.grh is not None:
            gid_index = attr.grh.sgid_index
            sgid = port.gid.packed if gid_index == 0 else None
            if sgid is None:
                self._fail_wqe(qp, wqe, WcStatus.LOCAL_OP_ERR)
                self._complete_front(qp)
                return
            grh = build_grh(
                sgid, attr.grh.dgid.packed, len(data), attr.grh.hop_limit,
                attr.grh.traffic_class, attr.grh.flow_label,
            )
        dlid = attr.dlid
        if MCAST_LID_MIN <= dlid <= MCAST_LID_MAX:
            self._send_mcast(qp, wqe, port, data, dlid, qkey, pkey, grh)
        else:
            route = self._route(port, dlid)
            if route is None:
                self.counters.sent += 1
                self._drop("dropped_link")
            else:
                pkt = Packet(
                    PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM,
                    _UD, port, route[0], route[1], qp.num, dqpn & 0xFFFFFF,
                    wqe.psn, pkey, data,
                )
                pkt.qkey = qkey
                pkt.imm = wqe.imm
                pkt.solicited = wqe.solicited
                pkt.sl = attr.sl
                pkt.grh = grh
                self._transmit(pkt)
        wqe.done = True
        self._complete_front(qp)

    def _agent_reply(self, qp: MockQp, port: MockPort, dlid: int, mad: bytes, pkey: int) -> None:
        """A request for the SMA/PMA: its reply comes back to ``qp`` (QP0 or QP1)."""
        assert self.mad_agents is not None
        req = Packet(PacketOp.SEND, _UD, port, port, (), qp.num, qp.num, 0, pkey, mad)
        n, words = wire_cost(req)
        port.pm[2] += n
        port.pm[0] += words
        self.counters.sent += 1
        reply = self.mad_agents.answer(port, dlid, mad, (n, words))
        if reply is None:
            self._drop("dropped_no_dest")
            return
        responder, slid, resp = reply
        pkt = Packet(PacketOp.SEND, _UD, responder or port, port, (), qp.num, qp.num, 0, pkey, resp)
        pkt.slid = slid
        pkt.qkey = QP1_WELL_KNOWN_QKEY if qp.num == 1 else 0
        self._transmit(pkt)
        if responder is None:  # a switch answered: the reply did not leave this port
            n, words = pkt.cost
            port.pm[2] -= n
            port.pm[0] -= words

    def _send_mcast(
        self,
        qp: MockQp,
        wqe: SendWqe,
        port: MockPort,
        data: bytes | memoryview,
        mlid: int,
        qkey: int,
        pkey: int,
        grh: bytes | None,
    ) -> None:
        ports: list[MockPort] = []
        for m in self.mcast_groups.get(mlid, ()):
            p = m.qp.port
            if p is not None and p not in ports and m.alive and m.qp.alive:
                ports.append(p)
        if not ports:
            self.counters.sent += 1
            self._drop("dropped_no_dest")
            return
        if not isinstance(data, bytes):
            data = bytes(data)
        for dst in ports:
            route = self._route(port, dst.lid)
            if route is None or route[0] is not dst:
                self.counters.sent += 1
                self._drop("dropped_link")
                continue
            pkt = Packet(
                PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM,
                _UD, port, dst, route[1], qp.num, MCAST_QPN,
                wqe.psn,  # type: ignore[arg-type]
                pkey, data,
            )
            pkt.dlid = mlid
            pkt.qkey = qkey
            pkt.imm = wqe.imm
            pkt.solicited = wqe.solicited
            pkt.grh = grh
            self._transmit(pkt)

    # ---------------------------------------------------------- RC responses
    def _find_wqe(self, qp: MockQp, psn: int) -> int:
        """Index in the send queue of the transmitted WQE whose PSNs hold ``psn``."""
        sq = qp.sq
        for i in range(qp.send_idx):
            w = sq[i]
            if w.psn is None or w.bind is not None:
                continue
            d = psn_diff(psn, w.psn)
            if 0 <= d < max(1, w.npsn):
                return i
        return -1

    def _implied_ack(self, qp: MockQp, upto: int) -> None:
        """Sends and writes before index ``upto`` are acknowledged by a later response."""
        sq = qp.sq
        for j in range(upto):
            w = sq[j]
            if not w.done and not w.is_rd_atomic:
                w.done = True

    def _progress(self, qp: MockQp) -> None:
        qp.retry_left = qp.retry_cnt
        qp.rnr_left = qp.rnr_retry_cnt
        if qp.timer_armed and not qp.rnr_blocked:
            self.cancel_timer(qp)
        self._complete_front(qp)
        if qp.send_idx:
            self.ack_wait.add(qp)
        if qp.send_idx < len(qp.sq):
            self.sq_progress(qp)

    def _requester_rx(self, pkt: Packet) -> None:
        port = pkt.dst_port
        qp = port.ca.qps.get(pkt.dst_qpn)
        if qp is None or qp.transport is not _RC or qp.port is not port:
            self._drop("dropped_no_dest")
            return
        if qp.state is not _RTS and qp.state is not _SQD:
            self._drop("dropped_state")
            return
        op = pkt.op
        if op is PacketOp.ACK:
            self._rc_ack(qp, pkt.psn)
        elif op is PacketOp.READ_RESP or op is PacketOp.ATOMIC_ACK:
            self._rc_data_resp(qp, pkt)
        elif op is PacketOp.RNR_NAK:
            self._rc_rnr(qp, pkt)
        else:
            self._rc_nak(qp, pkt)

    def _rc_ack(self, qp: MockQp, apsn: int) -> None:
        sq = qp.sq
        moved = False
        for i in range(qp.send_idx):
            w = sq[i]
            if w.psn is None or w.bind is not None:
                continue
            last = (w.psn + max(1, w.npsn) - 1) & PSN_MASK
            if psn_diff(apsn, last) < 0:
                break
            if w.done:
                continue
            if w.is_rd_atomic:
                # An ACK beyond an unanswered READ/atomic: its response was lost.
                qp.send_idx = i
                moved = True
                break
            w.done = True
            moved = True
        if moved:
            self._progress(qp)
        else:
            self.counters.duplicates_received += 1

    def _rc_data_resp(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        sq = qp.sq
        if i < 0 or sq[i].done or not sq[i].is_rd_atomic or sq[i].psn != pkt.psn:
            self.counters.duplicates_received += 1
            return
        w = sq[i]
        self._implied_ack(qp, i)
        if pkt.op is PacketOp.READ_RESP:
            status = self._scatter(qp.ca, qp.pd, w.sges, ((0, pkt.payload),))
        else:
            orig = pkt.compare.to_bytes(8, "little")
            status = self._scatter(qp.ca, qp.pd, w.sges, ((0, orig),))
        qp.rd_atomic_out -= 1
        if status is not _OK:
            self._fail_wqe(qp, w, status)
            self._complete_front(qp)
            return
        w.done = True
        self._progress(qp)

    def _rc_rnr(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        if i < 0 or qp.sq[i].done or qp.rnr_blocked:  # stale, or a copy of the one we wait on
            self.counters.duplicates_received += 1
            return
        self._implied_ack(qp, i)
        w = qp.sq[i]
        if qp.rnr_left == 0:
            self._fail_wqe(qp, w, WcStatus.RNR_RETRY_ERR)
            self._complete_front(qp)
            return
        if qp.rnr_retry_cnt != 7:
            qp.rnr_left -= 1
        self.counters.rnr_retries += 1
        qp.send_idx = i
        self.cancel_timer(qp)
        qp.rnr_blocked = True
        qp.timer_armed = True
        self._schedule(self.now + rnr_seconds(pkt.syndrome), _T_RNR, qp, qp.timer_gen)
        self._complete_front(qp)

    def _rc_nak(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        if i < 0 or qp.sq[i].done:
            self.counters.duplicates_received += 1
            return
        self._implied_ack(qp, i)
        w = qp.sq[i]
        code = pkt.syndrome
        if code == NakCode.PSN_SEQ_ERR:
            if qp.retry_left == 0:
                self._fail_wqe(qp, w, WcStatus.TIMEOUT_RETRY_ERR)
                self._complete_front(qp)
                return
            qp.retry_left -= 1
            qp.send_idx = i
            self.cancel_timer(qp)
            self._complete_front(qp)
            self.sq_progress(qp)
            return
        self._fail_wqe(qp, w, NAK_WC_STATUS.get(code, WcStatus.REM_OP_ERR))
        self._complete_front(qp)

    def _ack_timeout(self, qp: MockQp) -> None:
        if (qp.state is not _RTS and qp.state is not _SQD) or qp.send_idx == 0:
            return
        self.counters.timeouts += 1
        if qp.retry_left == 0:
            self._fail_wqe(qp, qp.sq[0], WcStatus.TIMEOUT_RETRY_ERR)
            self._complete_front(qp)
            return
        qp.retry_left -= 1
        qp.send_idx = 0
        self.sq_progress(qp)

    # ================================================================ responder
    def _receive(self, pkt: Packet) -> None:
        if pkt.icrc is not None and not pkt.icrc_ok():
            self._drop("corrupted")
            return
        if pkt.topo != self._topo_gen and not self._still_routable(pkt):
            self._drop("dropped_link")
            return
        self.counters.delivered += 1
        pm = pkt.dst_port.pm
        n, words = pkt.cost
        pm[3] += n
        pm[1] += words
        if pkt.op >= 16:
            self._requester_rx(pkt)
            return
        port = pkt.dst_port
        qpn = pkt.dst_qpn
        if pkt.transport is _UD:
            if qpn == MCAST_QPN:
                self._mcast_rx(pkt)
                return
            qp = port.special[qpn] if qpn <= 1 else port.ca.qps.get(qpn)
            if qp is None or qp.transport is not _UD or qp.port is not port:
                self._drop("dropped_no_dest")
                return
            self._ud_rx(qp, pkt)
            return
        qp = port.ca.qps.get(qpn)
        if qp is None or qp.transport is not pkt.transport or qp.port is not port:
            self._drop("dropped_no_dest")
            return
        state = qp.state
        if state is not _RTS and state is not _RTR and state is not _SQD and state is not _SQERR:
            self._drop("dropped_state")
            return
        pkeys = port.pkeys
        mine = pkeys[qp.pkey_index] if qp.pkey_index < len(pkeys) else 0
        if not (pkt.pkey == mine and mine & 0x8000) and not pkey_match(pkt.pkey, mine):
            self._pkey_violation(port)
            return
        if state is _RTR and not qp.comm_est:
            qp.comm_est = True
            self.qp_event(qp, AsyncEvent.QP_COMM)
        if qp.transport is _RC:
            self._rc_rx(qp, pkt)
        else:
            self._uc_rx(qp, pkt)

    def _pkey_violation(self, port: MockPort) -> None:
        self._drop("dropped_access")
        self.counters.pkey_violations += 1
        if port.ca.violation_counters:
            port.pkey_violations = min(port.pkey_violations + 1, 0xFFFF)

    def _qkey_violation(self, port: MockPort) -> None:
        self._drop("dropped_access")
        self.counters.qkey_violations += 1
        if port.ca.violation_counters:
            port.qkey_violations = min(port.qkey_violations + 1, 0xFFFF)

    def _take_recv(self, qp: MockQp) -> tuple[RecvWqe, MockPd] | None:
        srq = qp.srq
        if srq is None:
            rq = qp.rq
            if not rq:
                return None
            return rq.popleft(), qp.pd
        wqes = srq.wqes
        if not wqes:
            return None
        w = wqes.popleft()
        if srq.limit and len(wqes) < srq.limit:
            srq.limit = 0
            self._srq_event(srq, AsyncEvent.SRQ_LIMIT_REACHED)
        return w, srq.pd

    def _srq_event(self, srq: MockSrq, code: AsyncEvent) -> None:
        self._event(srq, srq.ca, code, srq.context)

    def _respond(self, qp: MockQp, req: Packet, op: PacketOp, psn: int) -> Packet | None:
        """A response packet from responder ``qp`` back to the requester of ``req``."""
        port = req.dst_port
        route = self._route(port, req.slid)
        if route is None:
            self.counters.sent += 1
            self._drop("dropped_link")
            return None
        return Packet(op, _RC, port, route[0], route[1], qp.num, qp.dest_qp, psn, req.pkey)

    def _send_ack(self, qp: MockQp, req: Packet, psn: int) -> None:
        resp = self._respond(qp, req, PacketOp.ACK, psn)
        if resp is not None:
            self.counters.acks += 1
            self._transmit(resp)

    def _send_nak(self, qp: MockQp, req: Packet, code: NakCode, psn: int) -> None:
        resp = self._respond(qp, req, PacketOp.NAK, psn)
        if resp is not None:
            resp.syndrome = int(code)
            self.counters.naks += 1
            self._transmit(resp)

    def _send_rnr(self, qp: MockQp, req: Packet) -> None:
        resp = self._respond(qp, req, PacketOp.RNR_NAK, req.psn)
        if resp is not None:
            resp.syndrome = qp.rnr_nak_timeout
            self.counters.rnr_naks += 1
            self._transmit(resp)

    def _responder_error(
        self, qp: MockQp, req: Packet, code: NakCode, event: AsyncEvent | None
    ) -> None:
        self._send_nak(qp, req, code, req.psn)
        self.qp_error(qp, event)

    def _rc_rx(self, qp: MockQp, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, qp.epsn)
        if d:
            if d > 0:
                self._drop("dropped_seq")
                if not qp.nak_sent:
                    qp.nak_sent = True
                    self._send_nak(qp, pkt, NakCode.PSN_SEQ_ERR, qp.epsn)
                return
            self._rc_duplicate(qp, pkt)
            return
        op = pkt.op
        ca = qp.ca
        if op is PacketOp.SEND or op is PacketOp.SEND_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._send_rnr(qp, pkt)
                return
            (wr_id, sges), rpd = taken
            status = self._scatter(ca, rpd, sges, ((0, pkt.payload),))
            if status is not _OK:
                self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
                code = (
                    NakCode.INVALID_REQUEST
                    if status is WcStatus.LOCAL_LEN_ERR
                    else NakCode.REMOTE_OP
                )
                self._responder_error(qp, pkt, code, None)
                return
            if pkt.inv is not None:
                if not invalidate.remote_invalidate(ca, qp, pkt.inv):
                    # kernel rxe's class J: the receive fails, the QP goes to error
                    self._push_wc(
                        qp.recv_cq,
                        make_wc(wr_id, _RECV, _INV_REQ, 0, None, _NO_OPT, qp.num),
                    )
                    self._responder_error(
                        qp, pkt, NakCode.INVALID_REQUEST, AsyncEvent.WQ_REQ_ERROR
                    )
                    return
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, None, RecvOpt.INVALIDATE, qp.num,
                    0, pkt.slid, invalidated_rkey=pkt.inv)  # fmt: skip
            elif pkt.imm is None:
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, None, _NO_OPT, qp.num, 0, pkt.slid)
            else:
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, pkt.imm, RecvOpt.IMMEDIATE,
                        qp.num, 0, pkt.slid)
            self._push_wc(qp.recv_cq, wc, pkt.solicited)
        elif op is PacketOp.RDMA_WRITE or op is PacketOp.RDMA_WRITE_IMM:
            n = pkt.length
            got = self._remote(ca, qp, pkt.rkey, pkt.remote_addr, n, _RDMA_WRITE) if n else None
            if n and got is None:
                self._responder_error(
                    qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR
                )
                return
            if op is PacketOp.RDMA_WRITE_IMM:
                taken = self._take_recv(qp)
                if taken is None:
                    self._send_rnr(qp, pkt)
                    return
                if got is not None:
                    got[0].write(got[1], pkt.payload)
                self._push_wc(
                    qp.recv_cq,
                    make_wc(taken[0][0], _RECV_WRITE, _OK, n, pkt.imm, RecvOpt.IMMEDIATE,
                       qp.num, 0, pkt.slid),
                    pkt.solicited,
                )
            elif got is not None:
                got[0].write(got[1], pkt.payload)
        elif op is PacketOp.RDMA_READ_REQ:
            if not self._rc_read(qp, pkt):
                return
        else:
            if not self._rc_atomic(qp, pkt):
                return
        qp.epsn = (qp.epsn + pkt.npsn) & PSN_MASK
        qp.nak_sent = False
        if op is not PacketOp.RDMA_READ_REQ and op < PacketOp.COMPARE_SWAP:
            self._send_ack(qp, pkt, (pkt.psn + pkt.npsn - 1) & PSN_MASK)

    def _rc_read(self, qp: MockQp, pkt: Packet) -> bool:
        n = pkt.length
        if n:
            got = self._remote(qp.ca, qp, pkt.rkey, pkt.remote_addr, n, _RDMA_READ)
            if got is None:
                self._responder_error(qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR)
                return False
            data = bytes(got[0].read(got[1], n))
        else:
            data = b""
        resp = self._respond(qp, pkt, PacketOp.READ_RESP, pkt.psn)
        if resp is not None:
            resp.payload = data
            resp.length = n
            resp.npsn = pkt.npsn
            self._transmit(resp)
        return True

    def _rc_atomic(self, qp: MockQp, pkt: Packet) -> bool:
        if pkt.remote_addr & 7:
            self._responder_error(qp, pkt, NakCode.INVALID_REQUEST, AsyncEvent.WQ_REQ_ERROR)
            return False
        got = self._remote(qp.ca, qp, pkt.rkey, pkt.remote_addr, 8, _ATOMIC)
        if got is None:
            self._responder_error(qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR)
            return False
        mr, off = got
        old = int.from_bytes(mr.read(off, 8), "little")
        if pkt.op is PacketOp.COMPARE_SWAP:
            new = atomic_result(True, old, pkt.compare, pkt.swap)
        else:
            new = atomic_result(False, old, 0, pkt.compare)
        if new != old:
            mr.write(off, new.to_bytes(8, "little"))
        cache = qp.atomic_cache
        cache[pkt.psn] = old.to_bytes(8, "little")
        if len(cache) > _ATOMIC_CACHE:
            del cache[next(iter(cache))]
        self._atomic_ack(qp, pkt, old)
        return True

    def _atomic_ack(self, qp: MockQp, pkt: Packet, old: int) -> None:
        resp = self._respond(qp, pkt, PacketOp.ATOMIC_ACK, pkt.psn)
        if resp is not None:
            resp.compare = old
            self._transmit(resp)

    def _rc_duplicate(self, qp: MockQp, pkt: Packet) -> None:
        self.counters.duplicates_received += 1
        op = pkt.op
        if op is PacketOp.RDMA_READ_REQ:
            self._rc_read(qp, pkt)
        elif op is PacketOp.COMPARE_SWAP or op is PacketOp.FETCH_ADD:
            saved = qp.atomic_cache.get(pkt.psn)
            if saved is not None:
                self._atomic_ack(qp, pkt, int.from_bytes(saved, "little"))
        else:
            self._send_ack(qp, pkt, (qp.epsn - 1) & PSN_MASK)

    def _uc_rx(self, qp: MockQp, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, qp.epsn)
        if d < 0:
            self.counters.duplicates_received += 1
            self._drop("dropped_seq")
            return
        qp.epsn = (pkt.psn + pkt.npsn) & PSN_MASK
        op = pkt.op
        ca = qp.ca
        if op is PacketOp.SEND or op is PacketOp.SEND_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._drop("dropped_no_recv")
                return
            (wr_id, sges), rpd = taken
            status = self._scatter(ca, rpd, sges, ((0, pkt.payload),))
            if status is not _OK:
                self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
                self.qp_error(qp)
                return
            opt = RecvOpt.NONE if pkt.imm is None else RecvOpt.IMMEDIATE
            self._push_wc(
                qp.recv_cq,
                make_wc(wr_id, _RECV, _OK, pkt.length, pkt.imm, opt, qp.num, 0, pkt.slid),
                pkt.solicited,
            )
            return
        n = pkt.length
        got = self._remote(ca, qp, pkt.rkey, pkt.remote_addr, n, _RDMA_WRITE) if n else None
        if n and got is None:
            self._drop("dropped_access")
            return
        if op is PacketOp.RDMA_WRITE_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._drop("dropped_no_recv")
                return
            if got is not None:
                got[0].write(got[1], pkt.payload)
            self._push_wc(
                qp.recv_cq,
                make_wc(taken[0][0], _RECV_WRITE, _OK, n, pkt.imm, RecvOpt.IMMEDIATE,
                   qp.num, 0, pkt.slid),
                pkt.solicited,
            )
        elif got is not None:
            got[0].write(got[1], pkt.payload)

    def _mcast_rx(self, pkt: Packet) -> None:
        port = pkt.dst_port
        src_ca = pkt.src_port.ca
        delivered = False
        for m in list(self.mcast_groups.get(pkt.dlid, ())):
            qp = m.qp
            if qp.port is not port or not m.alive:
                continue
            if qp.ca is src_ca and qp.num == pkt.src_qpn:
                continue  # no loopback to the sending QP itself
            if pkt.grh is not None and pkt.grh[24:40] != m.gid.packed:
                continue
            delivered = True
            self._ud_rx(qp, pkt)
        if not delivered:
            self._drop("dropped_no_dest")

    def _ud_rx(self, qp: MockQp, pkt: Packet) -> None:
        state = qp.state
        if state is not _RTS and state is not _RTR and state is not _SQD and state is not _SQERR:
            self._drop("dropped_state")
            return
        port = pkt.dst_port
        qp_type = qp.qp_type
        pkeys = port.pkeys
        if qp_type is QpType.QP0:
            pkey_index = 0
        elif qp_type is QpType.QP1:
            if pkt.qkey != QP1_WELL_KNOWN_QKEY:
                self._qkey_violation(port)
                return
            pkey_index = -1
            for index, key in enumerate(pkeys):
                if pkey_match(pkt.pkey, key):
                    pkey_index = index
                    break
            if pkey_index < 0:
                self._pkey_violation(port)
                return
        else:
            if pkt.qkey != qp.qkey:
                self._qkey_violation(port)
                return
            pkey_index = qp.pkey_index
            mine = pkeys[pkey_index] if pkey_index < len(pkeys) else 0
            if not (pkt.pkey == mine and mine & 0x8000) and not pkey_match(pkt.pkey, mine):
                self._pkey_violation(port)
                return
        if state is _RTR and not qp.comm_est:
            qp.comm_est = True
            self.qp_event(qp, AsyncEvent.QP_COMM)
        taken = self._take_recv(qp)
        if taken is None:
            self._drop("dropped_no_recv")
            return
        (wr_id, sges), rpd = taken
        grh = pkt.grh
        writes: tuple[tuple[int, bytes | memoryview], ...]
        if grh is not None:
            writes = ((0, grh), (GRH_LEN, pkt.payload))
        else:
            writes = ((GRH_LEN, pkt.payload),)
        status = self._scatter(qp.ca, rpd, sges, writes)
        if status is not _OK:
            self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
            return
        opt = RecvOpt.NONE
        if pkt.imm is not None:
            opt |= RecvOpt.IMMEDIATE
        if grh is not None:
            opt |= RecvOpt.GRH_VALID
        self._push_wc(
            qp.recv_cq,
            make_wc(
                wr_id, _RECV, _OK, GRH_LEN + pkt.length, pkt.imm, opt, qp.num, pkt.src_qpn,
                pkt.slid, pkt.sl, pkey_index, 0, 0, grh, None if grh is None else _IB_GRH,
            ),
            pkt.solicited,
        )
