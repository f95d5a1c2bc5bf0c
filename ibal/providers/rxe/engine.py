"""The thin driver between an rxe device's sockets and its QPs' transport cores.

One :class:`Engine` per CA.  It is driven from three places, always under the
CA lock:

* the device's receive thread calls :meth:`Engine.on_packets` with a batch of
  decoded packets; each goes to the core of its destination QP (a multicast
  datagram to every attached QP), then every QP touched is pumped;
* verbs call :meth:`Engine.pump` after posting work or changing a QP;
* the engine's own timer thread runs :meth:`QpCore.handle_timer` when a core's
  :meth:`~QpCore.next_deadline` has passed (ACK timeout, RNR wait).

Pumping a QP takes its packets to send (queued on the device's socket batch,
flushed once per round), moves its completions into CQs and turns its events
into upcalls.  Upcalls are made with the lock held: the access layer only
queues them, and it makes "no upcall once destroy returned" hold by
construction.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ibal.providers.rxe.cq import Cq
from ibal.providers.rxe.qps import Qp, Srq, is_multicast_ip
from ibal.types import AsyncEvent, EventRecord, QpState, Wc
from ibal.wire.packet import Packet, Train, WqeRun

TIMER_TICK = 0.001
"""Timers run at most once per tick, as kernel rxe's run at jiffy resolution (its
shortest RNR wait and ACK timeout are one jiffy): a 10 us RNR timer cannot spin."""


MCAST_QPN = 0xFFFFFF
"""The destination QPN of a multicast datagram (IBA 10.5.2.3)."""



def _to_local(pkts: Iterable[Packet], dst: bytes, local: deque[Packet]) -> None:
    """A record's packets, for delivery to a device of this engine (source filled in)."""
    for q in pkts:
        if not q.src_ip:
            q.src_ip = dst
        local.append(q)

class Engine:
    """Routes packets into cores, runs their timers, drains their output."""

    def __init__(
        self,
        name: str,
        lock: threading.RLock,
        io: Any,
        counters: Any,
        completion_cb: Callable[[Any], None],
        event_cb: Callable[[EventRecord], None],
    ) -> None:
        self.name = name
        self.io = io
        self.counters = counters
        self._lock = lock
        self._cond = threading.Condition(lock)
        self.completion_cb = completion_cb
        self.event_cb = event_cb
        self.qps: dict[int, Qp] = {}
        self.mcast: dict[bytes, list[Qp]] = {}
        self._deadlines: dict[Qp, float] = {}
        self._timer_wake = float("inf")  # when the timer thread wakes next (under the lock)
        self._local: deque[Packet] = deque()
        self._own: frozenset[bytes] = frozenset()
        self._closed = False
        self._fast: Any = None  # fastrx.FastTable, made on the first on_ring
        self.mr_mirror: Any = None
        """The CA's ``fastmr.MrMirror``: FIRST/ONLY WRITEs in C (None: in Python)."""
        self._thread = threading.Thread(target=self._timers, name=f"{name}-timer", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- receive
    def on_packets(self, packets: list[Packet]) -> None:
        """The receive thread's callback: one batch of checked packets."""
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            self._own = self.io.own
            touched: dict[Qp, None] = {}
            for pkt in packets:
                self._dispatch(pkt, now, touched, True)
            for qp in touched:
                self._guarded_pump(qp, now)
            self._run_local(now)
            self._flush()

    def on_ring(self, ring: Any, n: int, decode_one: Callable[[int], list[Packet]]) -> None:
        """The receive thread's callback on the C engine: a batch straight from the ring.

        ``rxe_rx_fast`` lands the predicted packets (fastrx.py says which and how the
        state moves) and stops at the first other datagram, which the Python core
        decodes (``decode_one``) and executes before C resumes: every QP sees its
        packets in arrival order, as from :meth:`on_packets`.
        """
        with self._lock:
            if self._closed:
                return
            fast = self._fast
            if fast is None:
                from ibal.providers.rxe import fastpath
                from ibal.providers.rxe.fastrx import FastTable

                fast = self._fast = FastTable(*fastpath.ffi_lib(), self.mr_mirror)
            now = time.monotonic()
            self._own = self.io.own
            touched: dict[Qp, None] = {}
            i = 0
            arm = True
            while i < n:
                armed = arm and fast.arm(self.qps)
                if armed:
                    i = fast.run(ring, i, n)
                    fast.sync(touched, self.counters)
                    if i >= n:
                        break
                pkts = decode_one(i)
                for pkt in pkts:
                    self._dispatch(pkt, now, touched, True)
                i += 1
                # an armed QP's state may have moved with the packet, or it may have
                # left a QP where C can continue it: then the QPs are armed afresh
                arm = fast.wants_arm(pkts, armed)
            for qp in touched:
                self._pump(qp, now)
            self._run_local(now)
            self._flush()

    def _dispatch(self, pkt: Packet, now: float, touched: dict[Qp, None], wire: bool) -> None:
        """Hand one packet to the core of its QP (or of each member of its group)."""
        if pkt.dest_qpn == MCAST_QPN and is_multicast_ip(bytes(pkt.dst_ip)):
            if wire and bytes(pkt.src_ip) in self._own:
                self.counters.drop("mcast_own")  # its members had it when it was sent
                return
            for member in self.mcast.get(bytes(pkt.dst_ip), ()):
                member.core.receive(pkt, now)
                touched[member] = None
            return
        qp = self.qps.get(pkt.dest_qpn)
        if qp is None:
            self.counters.drop("unknown_qpn")
            return
        cfg = qp.cfg
        if cfg.dst_ip and bytes(pkt.src_ip) != cfg.dst_ip:
            self.counters.drop("wrong_source")  # a connected QP hears only its peer
            return
        qp.core.receive(pkt, now)
        touched[qp] = None

    # ------------------------------------------------------------------- pump
    def pump(self, qp: Qp) -> None:
        """Run ``qp`` after a verb changed it (posted work, a state change)."""
        with self._lock:
            now = time.monotonic()
            self._own = self.io.own
            self._guarded_pump(qp, now)
            self._run_local(now)
            self._flush()

    def _guarded_pump(self, qp: Qp, now: float, timer: bool = False) -> None:
        """:meth:`_pump` (after the core's timer when ``timer``); a core that raises
        goes to ERROR with QP_FATAL, so one QP's broken work request cannot stop the
        thread that serves every QP of the device (the timer thread above all)."""
        try:
            if timer:
                qp.core.handle_timer(now)
            self._pump(qp, now)
        except Exception:
            self.counters.drop("qp_fault")
            self._deadlines.pop(qp, None)
            try:
                qp.core.to_error()
                qp.core.out.events.append(AsyncEvent.QP_FATAL)
                self.deliver(qp)
            except Exception:
                self.counters.drop("qp_fault")

    def _pump(self, qp: Qp, now: float) -> None:
        core = qp.core
        io = self.io
        own = self._own
        local = self._local
        send_train = getattr(io, "send_train", None)
        runs = getattr(io, "runs", False)
        while True:
            if send_train is not None:
                pkts, count = core.poll_trains(now, runs=runs)
            else:
                pkts = core.poll(now)  # type: ignore[assignment]
                count = len(pkts)
            for p in pkts:
                if isinstance(p, WqeRun):
                    dst = bytes(p.dst_ip)
                    if dst in own:
                        _to_local(p.packets(), dst, local)
                        continue
                    try:
                        io.send_run(p, dst, p.src_port)
                    except (KeyError, OSError, ValueError):
                        self.counters.drop("no_route")
                    continue
                if isinstance(p, Train):
                    dst = bytes(p.head.dst_ip)
                    if dst in own or send_train is None:
                        # loopback delivery takes separate packets
                        _to_local(p.packets(), dst, local)
                        continue
                    try:
                        send_train(p, dst, p.head.src_port)
                    except (KeyError, OSError, ValueError):
                        self.counters.drop("no_route")
                    continue
                dst = bytes(p.dst_ip)
                if dst in own:
                    # to this device: straight to the receiving core, as kernel rxe's
                    # loopback does (no socket, no ICRC)
                    if not p.src_ip:
                        p.src_ip = dst
                    local.append(p)
                    continue
                if p.dest_qpn == MCAST_QPN and is_multicast_ip(dst):
                    self._loop_mcast(p, dst)
                try:
                    io.send(p, dst, p.src_port)
                except (KeyError, OSError, ValueError):
                    self.counters.drop("no_route")
            if count < 64:
                break
        self.deliver(qp)
        if qp.alive:
            d = core.next_deadline()
            if d is None:
                self._deadlines.pop(qp, None)
            else:
                self._deadlines[qp] = d
                if d < self._timer_wake:
                    # only when the timer thread would sleep past it: a wake-up per
                    # send (a new ACK deadline) costs a busy poller the CPU and the GIL
                    self._timer_wake = d
                    self._cond.notify()

    def _run_local(self, now: float) -> None:
        """Deliver the packets this device sent to itself, and what they cause in turn."""
        local = self._local
        while local:
            touched: dict[Qp, None] = {}
            while local:
                self._dispatch(local.popleft(), now, touched, False)
            for qp in touched:
                self._guarded_pump(qp, now)

    def _loop_mcast(self, pkt: Packet, dst: bytes) -> None:
        """This device's own members of a group get the datagram locally, as the IP
        stack's multicast loop would hand it back (the copy that comes back from the
        network is dropped)."""
        if not self.mcast.get(dst):
            return
        if not pkt.src_ip:
            src = [ip for ip in self._own if len(ip) == len(dst)]
            pkt.src_ip = src[0] if src else bytes(len(dst))
        self._local.append(pkt)

    def _flush(self) -> None:
        try:
            self.io.flush()
        except OSError:
            self.counters.drop("send_error")

    def deliver(self, qp: Qp) -> None:
        """Move ``qp``'s completions into its CQs and raise its events."""
        out = qp.core.out
        if out.send_wcs:
            wcs, out.send_wcs = out.send_wcs, []
            for wc in wcs:
                self.complete(qp.send_cq, wc, False)
        if out.recv_wcs:
            rwcs, out.recv_wcs = out.recv_wcs, []
            for wc, solicited in rwcs:
                self.complete(qp.recv_cq, wc, solicited)
        if out.events:
            events, out.events = out.events, []
            for code in events:
                self.event_cb(EventRecord(code, qp.context))
        srq = qp.srq
        if srq is not None:
            if srq.limit_hit:
                self.srq_limit(srq)
            if qp.cfg.state is QpState.ERROR and not qp.last_wqe:
                # IBA 11.6.3.2: no receive of this QP can consume another SRQ WQE
                qp.last_wqe = True
                self.event_cb(EventRecord(AsyncEvent.SRQ_QP_LAST_WQE_REACHED, qp.context))

    def srq_limit(self, srq: Srq) -> None:
        srq.limit_hit = False
        self.event_cb(EventRecord(AsyncEvent.SRQ_LIMIT_REACHED, srq.context))

    def complete(self, cq: Cq, wc: Wc, solicited: bool) -> None:
        if not cq.alive:
            return
        fire, overran = cq.add(wc, solicited)
        if fire:
            self.completion_cb(cq.context)
        elif overran:
            self.event_cb(EventRecord(AsyncEvent.CQ_ERROR, cq.context))

    # ------------------------------------------------------------------ QPs
    def add(self, qp: Qp) -> None:
        self.qps[qp.num] = qp

    def remove(self, qp: Qp) -> None:
        """Forget ``qp``: no packet, timer or completion reaches it afterwards."""
        self.qps.pop(qp.num, None)
        self._deadlines.pop(qp, None)
        for ip, members in list(self.mcast.items()):
            if qp in members:
                members.remove(qp)
                if not members:
                    del self.mcast[ip]

    # ---------------------------------------------------------------- timers
    def _timers(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = [qp for qp, d in self._deadlines.items() if d <= now]
                if due:
                    self._own = self.io.own
                    for qp in due:
                        self._deadlines.pop(qp, None)
                        if qp.alive:
                            self._guarded_pump(qp, now, timer=True)
                    self._run_local(now)
                    self._flush()
                    self._timer_wake = now + TIMER_TICK
                    # one tick before the next round: timers re-armed meanwhile (an RNR
                    # wait of 10 us) wait for it, and verbs get the lock
                    self._cond.wait(TIMER_TICK)
                    continue
                wake = min(self._deadlines.values(), default=now + 1.0)
                self._timer_wake = wake
                self._cond.wait(max(wake - now, 0.0001))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the timer thread (idempotent); no upcall after it returns."""
        with self._cond:
            self._closed = True
            self.qps.clear()
            self._deadlines.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
