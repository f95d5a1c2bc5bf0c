"""RoCE path resolution: PathRecords from GIDs and the IP stack, where there is no SA.

An Ethernet port has no subnet manager to ask, so a PathRecord query on it is
answered here, as Linux's ``ib_addr``/``rdma_cm`` build a RoCE path
(``drivers/infiniband/core/addr.c``, ``cma_resolve_iboe_route``):

- the GIDs are IP addresses (IPv4-mapped or IPv6): the route from the source
  GID's address to the destination's gives the outgoing interface, which must
  be the netdev of the source GID (unless the destination is this host), the
  gateway and the route's MTU and hop limit metrics;
- the next hop's MAC comes from the neighbour table; when it is missing the
  resolver provokes ARP/ND and reads the table again, with bounded tries and a
  ``TIMEOUT`` status at the end (the kernel's ``rdma_resolve_ip`` loop);
- MTU: the IB MTU that fits the device's (and the route's) MTU less the RoCE
  headers (``iboe_get_mtu``: 96 bytes), no larger than the port's active MTU;
  hop limit: the route's metric, else the namespace's default TTL / the
  interface's IPv6 hop limit (``ip4_dst_hoplimit``/``ip6_dst_hoplimit``, 64 by
  default, even on the local subnet); traffic class and SL 0 unless asked
  (non-VLAN devices map every ToS to SL 0); rate from the port's active
  speed and width; packet lifetime 16 (``CMA_IBOE_PACKET_LIFETIME``, 18 up
  to Linux 6.1); P_Key 0xFFFF, reversible, DLID/SLID 0 (the CM
  writes the permissive LID for RoCE paths); selectors "exactly".

:func:`resolve` is the pure part (a query, the port, and what the IP stack
said); :class:`RoceResolver` is the thin driver: it asks an
:class:`~ibal.sa.roce_net.IpStack`, probes and polls on a timer, and answers
with the :class:`~ibal.sa.txn.SaAnswer` an SA would have sent, so
``SaPort.request(GET/GET_TABLE, PATH_RECORD, ...)`` means the same on both
link layers.  The resolved MAC is reported (:class:`RocePath.dmac`) but no
address vector carries it: providers resolve L2 themselves (kernel verbs in
``ibv_create_ah``, the rxe provider through the kernel's UDP sockets).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ibal.sa.roce_net import (
    IpAddress,
    IpStack,
    LazyIpStack,
    Link,
    Neighbour,
    Route,
    RouteError,
)
from ibal.sa.txn import SaAnswer
from ibal.status import Status
from ibal.types import DEFAULT_PKEY, Gid, GidEntry, GidType, LinkLayer, PortAttr
from ibal.wire.fields import FieldError, Value
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus, Method, MgmtClass, SaAttr
from ibal.wire.mad.header import SA_HEADER, SA_HEADER_OFFSET, build

__all__ = [
    "PACKET_LIFE_TIME", "ROCE_HEADER_BYTES", "NeedNeighbour", "PathError", "PathQuery",
    "ProbeSchedule",
    "RoceAnswer", "RocePath", "RoceRequest", "RoceResolver", "iboe_mtu", "port_rate",
    "rate_code", "resolve", "resolver_for", "start",
]  # fmt: skip

#: GRH 40 + UDP 8 + BTH 12 + XRC ETH 4 + AtomicETH 28 + ICRC 4 (``iboe_get_mtu``).
ROCE_HEADER_BYTES: Final = 96
#: ``CMA_IBOE_PACKET_LIFETIME`` (about 268 ms; Linux 6.1 and older use 18).
PACKET_LIFE_TIME: Final = 16
#: The selector value "exactly" (IBA 15.2.5.16), which RoCE records carry.
EXACTLY: Final = 2
_GREATER, _LESS, _LARGEST = 0, 1, 3

#: PathRecord Rate codes (IBA 15.2.5.16, ``enum ib_rate``) -> Gb/s.
RATE_GBPS: Final[dict[int, float]] = {
    2: 2.5, 5: 5, 3: 10, 11: 14, 6: 20, 15: 25, 19: 28, 4: 30, 7: 40, 20: 50, 12: 56,
    8: 60, 9: 80, 16: 100, 13: 112, 10: 120, 14: 168, 17: 200, 18: 300, 21: 400, 22: 600,
}  # fmt: skip


def iboe_mtu(netdev_mtu: int) -> int:
    """The IB MTU code (1..5) a netdev MTU carries after the RoCE headers; 0 if none fits."""
    room = netdev_mtu - ROCE_HEADER_BYTES
    for code in (5, 4, 3, 2, 1):
        if room >= 128 << code:
            return code
    return 0


def rate_code(gbps: float) -> int:
    """The largest PathRecord rate code not faster than ``gbps`` (2.5 Gb/s at least)."""
    fit = [(g, c) for c, g in RATE_GBPS.items() if g <= gbps]
    return max(fit)[1] if fit else 2


def port_rate(port: PortAttr) -> int:
    """The rate code of a port's active speed times its width ("10.0 Gbps", "4X" -> 40 Gb/s)."""
    try:
        speed = float(port.active_speed.split()[0])
        lanes = int(port.active_width.rstrip("xX"))
    except (ValueError, IndexError):
        return 2
    return rate_code(speed * lanes)


class PathError(Exception):
    """A query no path satisfies: the MAD status an SA would answer, and why."""

    def __init__(self, mad_status: int, reason: str) -> None:
        super().__init__(reason)
        self.mad_status = mad_status
        self.reason = reason


def _no_records(reason: str) -> PathError:
    return PathError(MadStatus.SA_NO_RECORDS, reason)


# ----------------------------------------------------------------- the query


@dataclass(frozen=True)
class PathQuery:
    """A PathRecord query: the components its mask selects, by field name."""

    dgid: Gid
    sgid: Gid | None = None
    given: dict[str, int] = field(default_factory=dict)
    service_id: int = 0

    @classmethod
    def decode(cls, data: bytes, comp_mask: int) -> PathQuery:
        """From a request's PathRecord and component mask; ``PathError`` when unusable."""
        try:
            rec = sa.PATH_RECORD.decode(data)
        except FieldError as e:
            raise PathError(MadStatus.SA_REQ_INVALID, str(e)) from None
        bits = sa.component_bits(sa.PATH_RECORD)
        chosen = {n for n, b in bits.items() if comp_mask >> b & 1}
        if "dgid" not in chosen:
            raise PathError(
                MadStatus.SA_INSUFFICIENT_COMPONENTS, "RoCE paths need the DGID (there are no LIDs)"
            )
        ints = {n: v for n, v in rec.items() if n in chosen and isinstance(v, int)}
        sgid = _gid(rec["sgid"]) if "sgid" in chosen else None
        dgid = _gid(rec["dgid"])
        if dgid.is_multicast:
            raise _no_records("multicast DGIDs have no unicast path (join the group instead)")
        return cls(dgid, sgid, ints, ints.get("service_id", 0))


# ----------------------------------------------------------------- the result


@dataclass(frozen=True)
class NeedNeighbour:
    """The next hop's MAC is not known yet: probe ``ip`` on ``ifindex`` and ask again."""

    ip: IpAddress
    ifindex: int
    src: IpAddress | None


@dataclass(frozen=True)
class RocePath:
    """A resolved path: the PathRecord's fields and the L2 facts behind them."""

    record: dict[str, Value]
    dmac: bytes
    sgid_index: int
    netdev: str
    route: Route

    def encode(self) -> bytes:
        """The 64-byte PathRecord."""
        return sa.PATH_RECORD.encode(self.record)


def _select_capacity(name: str, have: int, given: dict[str, int], order: Callable[[int], float],
                     codes: list[int]) -> int:  # fmt: skip
    """MTU and rate: the path carries ``have`` or anything slower (IBA selectors)."""
    if name not in given or f"{name}_selector" not in given:
        want = given.get(name)
        if want is None:
            return have
        if order(want) > order(have):
            raise _no_records(f"{name} {want} asked, the path carries {have}")
        return want
    want, sel = given[name], given[f"{name}_selector"]
    if sel == _LARGEST:
        return have
    if sel == _GREATER:
        if order(have) <= order(want):
            raise _no_records(f"{name} greater than {want} asked, the path carries {have}")
        return have
    if sel == _LESS:
        below = [c for c in codes if order(c) < order(want) and order(c) <= order(have)]
        if not below:
            raise _no_records(f"{name} less than {want} asked, the path carries {have}")
        return max(below, key=order)
    if order(want) > order(have):
        raise _no_records(f"{name} {want} asked, the path carries {have}")
    return want


def _select_life(have: int, given: dict[str, int]) -> int:
    """Packet lifetime: the path needs ``have`` or longer (3 selects the smallest)."""
    name = "packet_life_time"
    want, sel = given.get(name), given.get(f"{name}_selector", EXACTLY)
    if want is None or sel == _LARGEST:
        return have
    if sel == _GREATER:
        if want >= 63:
            raise _no_records(f"{name} greater than {want} asked")
        return max(have, want + 1)
    if sel == _LESS:
        if have >= want:
            raise _no_records(f"{name} less than {want} asked, the path needs {have}")
        return have
    if want < have:
        raise _no_records(f"{name} {want} asked, the path needs {have}")
    return want


def source_entry(port: PortAttr, sgid: Gid) -> GidEntry:
    """The port's RoCE GID entry for ``sgid``; ``PathError`` (invalid GID) when absent."""
    for e in port.gid_table:
        if e.gid == sgid and e.gid_type is not GidType.IB:
            return e
    raise PathError(
        MadStatus.SA_INVALID_GID, f"{show_gid(sgid)} is not a GID of port {port.port_num}"
    )


def needs_neighbour(route: Route, out: Link) -> bool:
    """Whether the next hop's MAC comes from the neighbour table (``addr_resolve_neigh``)."""
    return not (route.local or out.loopback or out.noarp)


def resolve(
    query: PathQuery,
    port: PortAttr,
    entry: GidEntry,
    route: Route,
    out: Link,
    dev: Link,
    neighbour: Neighbour | None,
    default_hop_limit: int,
) -> RocePath | NeedNeighbour:
    """The path from ``entry`` (a GID of ``port``, on interface ``dev``) to the query's DGID.

    ``route`` and ``out`` are what the IP stack says about reaching the DGID's
    address from the source GID's; ``neighbour`` the next hop's table entry
    (when :func:`needs_neighbour`).  Raises :class:`PathError` when no path
    satisfies the query.
    """
    if port.link_layer is not LinkLayer.ETHERNET:
        raise PathError(MadStatus.SA_REQ_INVALID, f"port {port.port_num} is not Ethernet")
    if not (route.local or out.loopback) and out.index != dev.index:
        raise _no_records(
            f"{route.dst} is reached through {out.name}, not through {dev.name}, "
            f"the netdev of GID {entry.index} ({show_gid(entry.gid)})"
        )
    if route.local or out.loopback:
        dmac = dev.mac  # loopback: the frame comes back to the source's own MAC
    elif out.noarp:
        dmac = bytes(6)
    elif neighbour is None or not neighbour.valid:
        return NeedNeighbour(route.next_hop, out.index, route.src)
    else:
        dmac = neighbour.mac
    g = query.given
    for name in ("dlid", "slid"):
        if g.get(name, 0):
            raise _no_records(f"{name} {g[name]} asked: RoCE paths have no LIDs")
    p_key = DEFAULT_PKEY
    if "p_key" in g:
        same = [k for k in port.pkeys if (g["p_key"] ^ k) & 0x7FFF == 0]
        if not same:
            raise _no_records(f"P_Key {g['p_key']:#06x} is not in the port's table")
        p_key = max(same)  # the full member's, if the port has it
    if g.get("sl", 0) > 7:
        raise _no_records(f"SL {g['sl']} asked: Ethernet priorities are 0-7")
    if g.get("raw_traffic"):
        raise _no_records("raw traffic paths are not RoCE paths")
    mtus = [iboe_mtu(dev.mtu), int(port.active_mtu)]
    if route.mtu:
        mtus.append(iboe_mtu(route.mtu))
    have_mtu = min(mtus)
    if have_mtu == 0:
        raise _no_records(f"{dev.name} MTU {dev.mtu} (route {route.mtu}) holds no IB MTU")
    mtu = _select_capacity("mtu", have_mtu, g, float, [1, 2, 3, 4, 5])
    rate = _select_capacity("rate", port_rate(port), g, RATE_GBPS.__getitem__, list(RATE_GBPS))
    life = _select_life(PACKET_LIFE_TIME, g)
    hop_limit = g.get("hop_limit") or route.hop_limit or default_hop_limit
    record: dict[str, Value] = {
        "service_id": query.service_id,
        "dgid": query.dgid.packed,
        "sgid": entry.gid.packed,
        "flow_label": g.get("flow_label", 0),
        "hop_limit": hop_limit,
        "tclass": g.get("tclass", 0),
        "reversible": 1,
        "numb_path": 1 if "numb_path" in g else 0,
        "p_key": p_key,
        "sl": g.get("sl", 0),
        "mtu_selector": EXACTLY,
        "mtu": mtu,
        "rate_selector": EXACTLY,
        "rate": rate,
        "packet_life_time_selector": EXACTLY,
        "packet_life_time": life,
    }
    return RocePath(record, bytes(dmac), entry.index, dev.name, route)


# ----------------------------------------------------------------- the driver


@dataclass(frozen=True)
class RoceAnswer:
    """The answer in the shape an SA transaction gives (``ibal.sa.txn.SaAnswer``'s
    fields, ``detail`` saying why for a status other than SUCCESS), plus the path."""

    status: Status
    mad_status: int = 0
    method: int = 0
    attr_id: int = SaAttr.PATH_RECORD
    records: tuple[bytes, ...] = ()
    mad: bytes = b""
    path: RocePath | None = None
    detail: str = ""

    def sa_answer(self) -> SaAnswer:
        """The :class:`~ibal.sa.txn.SaAnswer` an SA request on the port ends with."""
        return SaAnswer(self.status, self.mad_status, self.method, self.attr_id, self.records,
                        self.mad, self.detail)  # fmt: skip


class Cancellable(Protocol):
    def cancel(self) -> bool: ...


CallLater = Callable[[float, Callable[[], None]], Cancellable]
"""``call_later(delay_s, fn)``: run ``fn`` later on a callback thread (the AL's timers)."""

_FIRST_POLL: Final = 0.001
_MAX_POLL: Final = 0.064


def _response_mad(
    method: int, records: tuple[bytes, ...], mad_status: int, comp_mask: int
) -> bytes:
    resp = Method.GET_TABLE_RESP if method == Method.GET_TABLE else Method.GET_RESP
    data = b"".join(records)
    mad = build(MgmtClass.SUBN_ADM, resp, SaAttr.PATH_RECORD, tid=0, data=data,
                status=mad_status, comp_mask=comp_mask)  # fmt: skip
    attr_offset = sa.PATH_RECORD.size // 8 if records else 0
    SA_HEADER.pack_into(mad, SA_HEADER_OFFSET, 0, attr_offset, comp_mask)
    return bytes(mad)


class ProbeSchedule:
    """Sans-IO: when to probe and look again while the next hop's MAC is missing.

    A try lasts ``timeout_ms``: it probes once, then looks again after 1 ms,
    doubling to 64 ms, until its time is spent; ``retry_cnt`` more tries do
    the same; then it is over.  Time is the sum of the delays it handed out
    (the timers that run them are the clock).
    """

    def __init__(self, timeout_ms: int, retry_cnt: int) -> None:
        self._try_s = max(timeout_ms, 1) / 1000
        self._tries_left = retry_cnt
        self._left_s = self._try_s
        self._poll = _FIRST_POLL
        self._probed = False

    def next(self) -> tuple[bool, float | None]:
        """``(probe now, seconds until the next look)``; ``None`` seconds: time out."""
        probe = not self._probed
        self._probed = True
        if self._left_s <= 0:
            if self._tries_left <= 0:
                return False, None
            self._tries_left -= 1
            self._left_s, self._poll, probe = self._try_s, _FIRST_POLL, True
        delay = min(self._poll, self._left_s)
        self._left_s -= delay
        self._poll = min(self._poll * 2, _MAX_POLL)
        return probe, delay


class RoceRequest:
    """One PathRecord query on an Ethernet port, from start to its single callback.

    Each step reads the route and the neighbour table afresh; while the next
    hop's MAC is unknown a :class:`ProbeSchedule` says when to probe and look
    again, and its end is the ``TIMEOUT`` answer.  Steps run on the
    ``call_later`` thread.
    """

    def __init__(
        self,
        resolver: RoceResolver,
        method: int,
        data: bytes,
        comp_mask: int,
        *,
        timeout_ms: int,
        retry_cnt: int,
        callback: Callable[[RoceAnswer], None],
    ) -> None:
        self._r = resolver
        self._method = method
        self._data = data
        self._comp_mask = comp_mask
        self._schedule = ProbeSchedule(timeout_ms, retry_cnt)
        self._callback = callback
        self._lock = threading.Lock()
        self._timer: Cancellable | None = None
        self._answer: RoceAnswer | None = None
        self._done = threading.Event()
        self._timer = resolver.call_later(0, self._step)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def answer(self) -> RoceAnswer | None:
        """The answer once made (its ``path`` has the MAC), else ``None``."""
        return self._answer

    def wait(self, timeout: float | None = None) -> RoceAnswer:
        """The answer, once the callback has been made (not on the callback thread)."""
        if not self._done.wait(timeout):
            raise TimeoutError("RoCE path resolution still running")
        assert self._answer is not None
        return self._answer

    def cancel(self) -> None:
        """Stop; the callback still runs once, with ``CANCELED`` (unless already made)."""
        with self._lock:
            if self._answer is not None:
                return
            if self._timer is not None:
                self._timer.cancel()
        self._finish(RoceAnswer(Status.CANCELED, detail="canceled"))

    def _finish(self, answer: RoceAnswer) -> None:
        with self._lock:
            if self._answer is not None:
                return
            self._answer = answer
            self._timer = None
        try:
            self._callback(answer)
        finally:
            self._done.set()

    def _step(self) -> None:
        if self._answer is not None:
            return
        try:
            outcome = self._r.attempt(self._data, self._comp_mask)
        except OSError as e:  # the IP stack failed us (a netlink socket closed under us)
            self._finish(RoceAnswer(Status.ERROR, detail=f"IP stack: {e}"))
            return
        except PathError as e:
            records: tuple[bytes, ...] = ()
            if self._method == Method.GET_TABLE and e.mad_status == MadStatus.SA_NO_RECORDS:
                # a GetTable with nothing to list succeeds with no records, as an SA answers
                mad = _response_mad(self._method, records, 0, self._comp_mask)
                self._finish(RoceAnswer(Status.SUCCESS, 0, mad[3], mad=mad, detail=e.reason))
                return
            mad = _response_mad(self._method, records, e.mad_status, self._comp_mask)
            self._finish(RoceAnswer(Status.REMOTE_ERROR, e.mad_status, mad[3], mad=mad,
                                    detail=e.reason))  # fmt: skip
            return
        if isinstance(outcome, RocePath):
            recs = (outcome.encode(),)
            mad = _response_mad(self._method, recs, 0, self._comp_mask)
            self._finish(RoceAnswer(Status.SUCCESS, 0, mad[3], records=recs, mad=mad,
                                    path=outcome))  # fmt: skip
            return
        self._wait_neighbour(outcome)

    def _wait_neighbour(self, need: NeedNeighbour) -> None:
        probe, delay = self._schedule.next()
        if probe:
            self._r.net.probe(need.ip, need.src, need.ifindex)
        if delay is None:
            why = f"no MAC for {need.ip} (ARP/ND unanswered)"
            self._finish(RoceAnswer(Status.TIMEOUT, detail=why))
            return
        with self._lock:
            if self._answer is not None:
                return
            try:
                self._timer = self._r.call_later(delay, self._step)
            except Exception as e:  # the AL's timers closed: its port is going away
                failed = RoceAnswer(Status.CANCELED, detail=f"no timer: {e}")
            else:
                return
        self._finish(failed)


class RoceResolver:
    """Answers PathRecord queries for one Ethernet port from the IP stack.

    ``port_attr`` returns the port's current attributes (GID table, MTU,
    speed); ``net`` is the IP stack of the port's network namespace;
    ``call_later`` schedules the steps (the AL's timers: their callbacks run
    on the AL's callback thread, where the answer callback is made too).
    """

    def __init__(
        self, port_attr: Callable[[], PortAttr], net: IpStack, call_later: CallLater
    ) -> None:
        self.port_attr = port_attr
        self.net = net
        self.call_later = call_later

    def request(
        self,
        method: int,
        data: bytes,
        comp_mask: int,
        *,
        timeout_ms: int = 1000,
        retry_cnt: int = 3,
        callback: Callable[[RoceAnswer], None],
    ) -> RoceRequest:
        """Start a GET or GET_TABLE of PathRecord; ``callback`` gets the answer once."""
        return RoceRequest(self, method, data, comp_mask, timeout_ms=timeout_ms,
                           retry_cnt=retry_cnt, callback=callback)  # fmt: skip

    def attempt(self, data: bytes, comp_mask: int) -> RocePath | NeedNeighbour:
        """One look at the IP stack: a path, a neighbour to wait for, or ``PathError``."""
        query = PathQuery.decode(data, comp_mask)
        port = self.port_attr()
        dst = _gid_ip(query.dgid)
        if query.sgid is not None:
            entry = source_entry(port, query.sgid)
        else:
            entry = self._pick_source(port, dst)
        src = _gid_ip(entry.gid)
        if src.version != dst.version:
            raise _no_records(f"source {src} and destination {dst} are of different families")
        try:
            dev = self.net.link(entry.netdev) if entry.netdev else None
            # a link-local destination exists only on a link: the GID's (the kernel
            # routes out of the GID's netdev, bound_dev_if, in every case)
            oif = dev.index if dev is not None and dst.version == 6 and dst.is_link_local else 0
            route = self.net.route(dst, src, oif)
            out = self.net.link(route.ifindex)
            dev = dev or out
        except RouteError as e:
            raise _no_records(f"no route from {src} to {dst}: {e.strerror}") from None
        except KeyError as e:
            raise _no_records(f"interface {e.args[0]} is gone") from None
        neigh = None
        if needs_neighbour(route, out):
            neigh = self.net.neighbour(route.next_hop, out.index)
            if neigh is not None and neigh.state & 0x20:  # NUD_FAILED: ask again
                self.net.probe(route.next_hop, src, out.index)
        hops = self.net.default_hop_limit(dst.version, out.name)
        return resolve(query, port, entry, route, out, dev, neigh, hops)

    def _pick_source(self, port: PortAttr, dst: IpAddress) -> GidEntry:
        """No SGID asked: the port's GID for the source address the route prefers."""
        try:
            route = self.net.route(dst, None)
        except RouteError as e:
            raise _no_records(f"no route to {dst}: {e.strerror}") from None
        same = [
            g for g in port.gid_table
            if g.gid_type is GidType.ROCE_V2 and _gid_ip(g.gid).version == dst.version
        ]  # fmt: skip
        for g in same:
            if _gid_ip(g.gid) == route.src:
                return g
        if route.local:  # to this host: any routable GID of the family will do
            for g in same:
                if not g.gid.is_link_local:
                    return g
        raise _no_records(f"port {port.port_num} has no GID for source {route.src} (to {dst})")


# ----------------------------------------------------------------- the SaPort hook


class _CaLike(Protocol):
    def query_port(self, port_num: int) -> PortAttr: ...


class PortLike(Protocol):
    """What :func:`start` uses of an ``ibal.sa.port.SaPort`` (or a test's stand-in)."""

    @property
    def ca(self) -> _CaLike: ...

    @property
    def port_num(self) -> int: ...

    def call_later(self, delay: float, fn: Callable[..., object], *args: Any) -> Cancellable: ...


_RESOLVERS: weakref.WeakKeyDictionary[Any, RoceResolver] = weakref.WeakKeyDictionary()
_RESOLVERS_LOCK = threading.Lock()


def resolver_for(port: PortLike) -> RoceResolver:
    """The port's resolver, made on first use; its IP stack opens on the AL's callback
    thread, so it reads the network namespace the AL runs in, and closes when the
    port object goes."""
    with _RESOLVERS_LOCK:
        r = _RESOLVERS.get(port)
        if r is not None:
            return r
        ref = weakref.ref(port)  # the resolver must not keep the port alive

        def attrs() -> PortAttr:
            p = ref()
            if p is None:
                raise PathError(MadStatus.SA_NO_RESOURCES, "the port is gone")
            return p.ca.query_port(p.port_num)

        def later(delay: float, fn: Callable[[], None]) -> Cancellable:
            p = ref()
            if p is None:
                raise PathError(MadStatus.SA_NO_RESOURCES, "the port is gone")
            return p.call_later(delay, fn)

        net = LazyIpStack()
        r = RoceResolver(attrs, net, later)
        _RESOLVERS[port] = r
        weakref.finalize(port, net.close)
        return r


def start(
    port: PortLike,
    method: int,
    data: bytes,
    comp_mask: int,
    *,
    timeout_ms: int,
    retry_cnt: int,
    callback: Callable[[RoceAnswer], None],
) -> RoceRequest:
    """Answer a PathRecord GET/GET_TABLE on an Ethernet port: ``callback(answer)`` once,
    from the port's timers (the AL's misc queue).  ``cancel()`` the result to stop."""
    return resolver_for(port).request(method, data, comp_mask, timeout_ms=timeout_ms,
                                      retry_cnt=retry_cnt, callback=callback)  # fmt: skip


def show_gid(gid: Gid) -> str:
    """A GID as text, an IPv4-mapped one with its dotted address (``::ffff:10.0.0.1``)."""
    v4 = gid.ipv4_mapped
    return f"::ffff:{v4}" if v4 is not None else str(gid)


def _gid_ip(gid: Gid) -> IpAddress:
    return gid.ipv4_mapped or gid


def _gid(v: Value) -> Gid:
    if isinstance(v, int):
        return Gid(v)
    return Gid(bytes(v))
