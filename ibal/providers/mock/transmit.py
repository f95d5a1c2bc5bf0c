"""The mock engine's wire: gather/scatter through each QP's ``MemoryAccess``, routing,
transmit and drops.

Called by the engine under the fabric lock.
"""

from __future__ import annotations

from ibal.providers.mock.engine_core import (
    _OK,
    _RC,
    _T_PACKET,
    _UD,
    PERMISSIVE,
    EngineCore,
)
from ibal.providers.mock.objects import (
    MockQp,
    RecvSge,
    SendWqe,
)
from ibal.providers.mock.packets import (
    Packet,
    PacketOp,
)
from ibal.providers.mock.pma import XMIT_DISCARDS, wire_cost
from ibal.providers.mock.topology import Link, MockPort, Route, Switch
from ibal.transport.qp import scatter
from ibal.transport.scatter import Range
from ibal.types import (
    LinkState,
    WcStatus,
)


class Transmit(EngineCore):
    """The mock engine's wire: memory access for the data path, routing, transmit and drops."""

    # =============================================================== memory
    @staticmethod
    def _remote(qp: MockQp, rkey: int, addr: int, length: int, need: int) -> Range | None:
        """An R_Key'd range for a request on ``qp``; None without the QP's or key's right."""
        if not qp.acc & need:
            return None
        return qp.mem.remote(rkey, addr, length, need)

    def gather(self, qp: MockQp, wqe: SendWqe) -> bytes | memoryview | None:
        if wqe.inline is not None:
            return wqe.inline
        sges = wqe.sges
        if not sges:
            return b""
        mem = qp.mem
        if len(sges) == 1:
            addr, length, lkey = sges[0]
            if not length:
                return b""
            got = mem.local(lkey, addr, length, False)
            if got is None or got.__class__ is memoryview:
                return got
            return bytes(got)  # pages of a physical region: the packet carries one buffer
        parts: list[bytes | memoryview] = []
        for addr, length, lkey in sges:
            if not length:
                continue
            got = mem.local(lkey, addr, length, False)
            if got is None:
                return None
            parts.append(got if got.__class__ is memoryview else bytes(got))
        return b"".join(parts)

    @staticmethod
    def _scatter(
        qp: MockQp,
        sges: tuple[RecvSge, ...],
        writes: tuple[tuple[int, bytes | memoryview], ...],
        recv: bool,
    ) -> WcStatus:
        """Write each ``(offset, data)`` into the scatter list (a receive WR's with
        ``recv``, else a READ/atomic's own); check every SGE first."""
        mem = qp.mem
        end = 0
        for off, data in writes:
            end = max(end, off + len(data))
        if len(sges) == 1:
            addr, length, lkey = sges[0]
            if end > length:
                return WcStatus.LOCAL_LEN_ERR
            if not length:
                return _OK
            got = mem.recv(lkey, addr, length) if recv else mem.local(lkey, addr, length, True)
            if got is None:
                return WcStatus.LOCAL_PROTECTION_ERR
            for off, data in writes:
                if len(data):
                    got[off : off + len(data)] = data
            return _OK
        if end > sum(s[1] for s in sges):
            return WcStatus.LOCAL_LEN_ERR
        targets: list[Range] = []
        for addr, length, lkey in sges:
            if not length:
                continue
            got = mem.recv(lkey, addr, length) if recv else mem.local(lkey, addr, length, True)
            if got is None:
                return WcStatus.LOCAL_PROTECTION_ERR
            targets.append(got)
        for off, data in writes:
            src = data if isinstance(data, bytes) else memoryview(data).cast("B")
            scatter(targets, off, src)
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

    def send_gsi(self, src: MockPort, dlid: int, dqpn: int, mad: bytes, pkey: int,
                 qkey: int) -> bool:
        """A MAD an agent on ``src`` (the SA on the SM port) sends from QP1 (lock held).

        ``False`` when no live route leads to ``dlid`` (counted as a discard).
        """
        route = self._route(src, dlid)
        if route is None:
            self._discard(src)
            return False
        pkt = Packet(PacketOp.SEND, _UD, src, route[0], route[1], 1, dqpn & 0xFFFFFF,
                     0, pkey, mad)  # fmt: skip
        pkt.qkey = qkey
        self._transmit(pkt)
        return True

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
        if len(pkt.route) > 1:
            _cross_switches(pkt, n, words)
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

    def _discard(self, port: MockPort) -> None:
        """A packet ``port`` could not send (no live route): PortXmitDiscards."""
        self.counters.sent += 1
        self._drop("dropped_link")
        port.pm[XMIT_DISCARDS] += 1

    def _drop(self, why: str) -> None:
        c = self.counters
        c.dropped += 1
        setattr(c, why, getattr(c, why) + 1)


def _cross_switches(pkt: Packet, n: int, words: int) -> None:
    """Count a message on the switch ports it crosses: each link's near end sends it,
    its far end receives it (the CA ports at the two ends count it themselves)."""
    here: object = pkt.src_port
    last = len(pkt.route) - 1
    for i, ln in enumerate(pkt.route):
        if ln.a is here:
            near, far, here = ln.pm_a, ln.pm_b, ln.b
        else:
            near, far, here = ln.pm_b, ln.pm_a, ln.a
        if i:
            near[2] += n
            near[0] += words
        if i < last:
            far[3] += n
            far[1] += words
