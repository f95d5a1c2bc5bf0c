"""RDMA CM compatibility: reach (and be reached by) Linux ``rdma_cm`` endpoints by IP and port.

``rdma_resolve_addr`` + ``rdma_resolve_route`` are :func:`resolve_route`: the
destination IP becomes a GID (IPv4-mapped), the port that can reach it is
picked, and the RoCE path comes from ``ibal.sa``'s path query (answered on an
Ethernet port by ``ibal.sa.roce`` from the IP stack, as the kernel's
``cma_resolve_iboe_route`` does).  The connection itself is the IB CM's; this
module adds what ``rdma_cm`` puts on top (:mod:`ibal.cm.cma`): the port-space
service ID and the CMA header in the REQ's private data.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ibal.al import AccessLayer, Qp
from ibal.cm import simple
from ibal.cm.cma import (
    CMA_HDR_SIZE,
    RDMA_UDP_QKEY,
    USER_PDATA_MAX,
    CmaHeader,
    IpAddress,
    PortSpace,
    ephemeral_port,
    gid_of,
    ip_address,
    ip_of,
    join_private_data,
    service_id,
)
from ibal.cm.ops import DEFAULT_ACCESS as CM_DEFAULT_ACCESS
from ibal.cm.ops import port_pkey_index
from ibal.cm.simple import Connection, Incoming, Listener
from ibal.sa import user_query
from ibal.status import (
    IbError,
    InvalidParameter,
    InvalidQpState,
    InvalidSetting,
    NotFound,
    RemoteError,
    Timeout,
)
from ibal.types import (
    DEFAULT_PKEY,
    AvAttr,
    Gid,
    Grh,
    LinkLayer,
    LinkState,
    PortAttr,
    QpMod,
    QpState,
)
from ibal.wire.fields import FieldError
from ibal.wire.mad import sa
from ibal.wire.mad.cm import RejReason, SidrStatus
from ibal.wire.mad.consts import CmAttr, Method, SaAttr

__all__ = [
    "RdmaConnection", "RdmaIncoming", "RdmaListener", "RdmaRoute", "UdPeer", "connect",
    "init_qp", "listen", "port_with_gid", "resolve_route", "resolve_udp", "roce_ports",
]  # fmt: skip

log = logging.getLogger("ibal.cm")


def port_with_gid(al: AccessLayer, gid: Gid,
                  error: type[Exception] = NotFound) -> tuple[int, int]:  # fmt: skip
    """The (CA GUID, port number) that has ``gid``: where an rdma_cm request to that
    address came in (``rdma_bind_addr``'s device look-up); ``error`` if none has it."""
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        try:
            port = ca.query().port_of_gid(gid.packed)
        finally:
            ca.close()
        if port is not None:
            return guid, port.port_num
    raise error(f"no port has GID {gid}")


@dataclass(frozen=True)
class RdmaRoute:
    """A resolved route: the endpoints' addresses, the local port and the RoCE path."""

    src: IpAddress
    dst: IpAddress
    ca_guid: int
    port_num: int
    port_guid: int
    sgid_index: int
    path: dict[str, Any]
    """The PathRecord's fields (``ibal.wire.mad.sa.PATH_RECORD``): MTU, rate, hop limit..."""

    @property
    def sgid(self) -> Gid:
        return gid_of(self.src)

    @property
    def dgid(self) -> Gid:
        return gid_of(self.dst)


def roce_ports(al: AccessLayer, port_guid: int | None = None) -> list[tuple[int, PortAttr]]:
    """The active Ethernet ports as (CA GUID, port), or just the one asked for."""
    out = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        try:
            ports = ca.query().ports
        finally:
            ca.close()
        for p in ports:
            if port_guid is not None and p.port_guid != port_guid:
                continue
            if p.link_layer is LinkLayer.ETHERNET and p.link_state is LinkState.ACTIVE:
                out.append((guid, p))
    return out


def resolve_route(al: AccessLayer, dst: IpAddress | str, *, src: IpAddress | str | None = None,
                  port_guid: int | None = None, timeout_ms: int = 2000) -> RdmaRoute:  # fmt: skip
    """The route to ``dst`` from ``src`` (default: the address the IP route prefers).

    Blocks until resolved.  Raises ``InvalidParameter`` for a bad address,
    ``NotFound`` when no active RoCE port has the source address (or can reach
    ``dst``), and the path query's status exceptions (e.g. ``Timeout`` when the
    neighbour does not answer ARP).
    """
    d = ip_address(dst)
    s = ip_address(src) if src is not None else None
    if s is not None and s.version != d.version:
        raise InvalidParameter(f"source {s} and destination {d} are of different IP versions")
    ports = roce_ports(al, port_guid)
    if s is not None:
        want = gid_of(s)
        ports = [(g, p) for g, p in ports if p.gid_index(want.packed) is not None]
        if not ports:
            raise NotFound(f"no active RoCE port has the address {s}")
    if not ports:
        raise NotFound("no active RoCE port" + (f" with GUID {port_guid:#x}" if port_guid else ""))
    names = ["dgid"] if s is None else ["dgid", "sgid"]
    values: dict[str, Any] = {"dgid": gid_of(d).packed}
    if s is not None:
        values["sgid"] = gid_of(s).packed
    record = sa.PATH_RECORD.encode(values)
    mask = sa.component_mask(sa.PATH_RECORD, names)
    last: IbError | None = None
    for ca_guid, port in ports:
        try:
            recs = user_query(al, Method.GET, SaAttr.PATH_RECORD, mask, record,
                              port_guid=port.port_guid, timeout_ms=timeout_ms,
                              retry_cnt=0)  # fmt: skip
        except IbError as e:  # this port cannot reach it; another may
            last = e
            continue
        if not recs:
            continue
        fields = dict(recs[0].fields)
        sgid = Gid(bytes(fields["sgid"]))
        index = port.gid_index(sgid.packed)
        if index is None:  # the port's table changed under us
            continue
        return RdmaRoute(ip_of(sgid), d, ca_guid, port.port_num, port.port_guid, index, fields)
    if last is not None:
        raise last
    raise NotFound(f"no path to {d}")


# ---------------------------------------------------------------- connections


class RdmaConnection:
    """A connection to or from an ``rdma_cm`` endpoint: the CM connection and its addresses.

    ``connection`` is the :class:`ibal.cm.Connection` (``disconnect``, ``on_disconnect``,
    ``state``); ``private_data`` what the peer sent (without any CMA header).
    """

    def __init__(self, connection: Connection | None, local: tuple[IpAddress, int],
                 remote: tuple[IpAddress, int], private_data: bytes | None = None,
                 route: RdmaRoute | None = None) -> None:  # fmt: skip
        self._connection = connection
        self.local = local
        self.remote = remote
        self._private_data = private_data
        self.route = route
        self._ready = threading.Event()

    def attach(self, cm_call: Callable[[Callable[[Connection], None] | None], Connection],
               callback: Callable[[RdmaConnection], object] | None) -> RdmaConnection:  # fmt: skip
        """Run ``cm_call`` (the CM's connect or accept, given the CM callback for
        ``callback``) and take the :class:`Connection` it returns; returns ``self``."""
        self._connection = cm_call(self._bind(callback))
        self._ready.set()
        return self

    def _bind(self, callback: Callable[[RdmaConnection], object] | None
              ) -> Callable[[Connection], None] | None:  # fmt: skip
        """The CM's callback for ours: it may come before the CM call returned here."""
        if callback is None:
            return None

        def done(_: Connection) -> None:
            self._ready.wait()  # microseconds: until the line after the CM call
            callback(self)

        return done

    @property
    def connection(self) -> Connection:
        assert self._connection is not None
        return self._connection

    @property
    def private_data(self) -> bytes:
        """The peer's: its REP's (client), or its REQ's after the CMA header (server)."""
        if self._private_data is not None:
            return self._private_data
        return self.connection.private_data

    def __repr__(self) -> str:
        (la, lp), (ra, rp) = self.local, self.remote
        return f"<RdmaConnection {la}:{lp} -> {ra}:{rp} {self.connection.state.name}>"

    @property
    def qp(self) -> Qp | None:
        return self.connection.qp

    def disconnect(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """DREQ (``rdma_disconnect``); ``wait``: until the DREP came (or timed out)."""
        self.connection.disconnect(wait=wait, timeout=timeout)


def init_qp(qp: Qp, route: RdmaRoute) -> None:
    """``rdma_create_qp``'s second half: librdmacm moves a connected QP to INIT as it creates
    it (port, P_Key index and access flags of the route), so ``rdma_connect`` only sends.
    ``qp`` (RC or UC, RESET, on the route's CA) goes to INIT as :func:`connect` would move
    it; ``InvalidSetting`` for a QP of another CA or a P_Key the port lacks, the AL's
    status exceptions for a destroyed QP, ``InvalidQpState`` for one past RESET."""
    ca = qp.pd.ca
    if qp.state is not QpState.RESET:
        raise InvalidQpState(f"the QP is {qp.state.name}: rdma_create_qp inits a new QP")
    if ca.guid != route.ca_guid:
        raise InvalidSetting("the QP is not on the route's CA")
    pkey = int(route.path.get("p_key", DEFAULT_PKEY))
    index = port_pkey_index(ca.query_port(route.port_num), pkey)
    qp.modify(QpMod(QpState.INIT, port_num=route.port_num, pkey_index=index,
                    access=CM_DEFAULT_ACCESS))  # fmt: skip


def connect(al: AccessLayer, dst: IpAddress | str, port: int, qp: Qp, private_data: bytes = b"",
            *, src: IpAddress | str | None = None, src_port: int | None = None,
            ps: PortSpace = PortSpace.TCP, timeout: float | None = None,
            route: RdmaRoute | None = None, route_timeout_ms: int = 2000,
            callback: Callable[[RdmaConnection], object] | None = None,
            **options: Any) -> RdmaConnection:  # fmt: skip
    """``rdma_resolve_addr`` + ``rdma_resolve_route`` + ``rdma_connect`` for an RC ``qp``.

    The REQ goes to service ``(ps << 16) + port`` with the CMA header (this
    side's address and ``src_port``, default an ephemeral port) before
    ``private_data`` (at most 56 bytes).  Blocks until established; raises
    :class:`ibal.cm.ConnectionRejected` on a REJ, ``Timeout`` without an answer.
    ``options`` go to :func:`ibal.cm.connect` (``resp_res``, ``init_depth``,
    ``retry_cnt``...; rdma_cm's own REQ timings are its defaults).  ``route``: one
    :func:`resolve_route` gave already (the QP must be on its CA).  ``callback``: return
    at once, ``callback(conn)`` runs on the AL's misc queue when the outcome is known
    (``conn.connection.established`` says which).
    """
    if ps not in (PortSpace.TCP, PortSpace.IB):
        raise InvalidParameter(f"an RC connection uses the TCP or IB port space, not {ps.name}")
    if len(private_data) > USER_PDATA_MAX[CmAttr.REQ]:
        raise InvalidParameter(f"private data is at most {USER_PDATA_MAX[CmAttr.REQ]} bytes "
                               f"after the RDMA CM header, got {len(private_data)}")  # fmt: skip
    if route is None:
        route = resolve_route(al, dst, src=src, timeout_ms=route_timeout_ms)
    sport = ephemeral_port() if src_port is None else src_port
    hdr = CmaHeader(route.src, route.dst, sport)
    sid = service_id(ps, port)
    out = RdmaConnection(None, (route.src, sport), (route.dst, port), None, route)
    return out.attach(lambda cb: simple.connect(al, qp, route.path, sid,
                                                join_private_data(hdr, private_data),
                                                timeout=timeout, callback=cb, **options),
                      callback)  # fmt: skip


@dataclass(frozen=True)
class UdPeer:
    """Where a UDP-port-space peer receives (``RDMA_CM_EVENT_ESTABLISHED``'s ``param.ud``)."""

    qpn: int
    qkey: int
    av: AvAttr
    """Create the address handle with ``pd.create_av(peer.av)``."""
    route: RdmaRoute
    private_data: bytes


def resolve_udp(al: AccessLayer, dst: IpAddress | str, port: int, private_data: bytes = b"",
                *, src: IpAddress | str | None = None, src_port: int | None = None,
                route: RdmaRoute | None = None, timeout_ms: int = 4096,
                retries: int = 15) -> UdPeer:  # fmt: skip
    """``rdma_connect`` on a UDP id: SIDR_REQ to ``(UDP << 16) + port`` with the CMA header;
    blocks for the SIDR_REP.  Timings as rdma_cm's (``1 << (20 - 8)`` ms, 15 retries).

    Raises :class:`ibal.status.RemoteError` when the peer answers with another
    status than SUCCESS or a Q_Key other than ``RDMA_UDP_QKEY``
    (``cma_sidr_rep_handler`` refuses those), ``Timeout`` without an answer.
    """
    room = USER_PDATA_MAX[CmAttr.SIDR_REQ]
    if len(private_data) > room:
        raise InvalidParameter(f"private data is at most {room} bytes after the RDMA CM "
                               f"header, got {len(private_data)}")  # fmt: skip
    if route is None:
        route = resolve_route(al, dst, src=src)
    hdr = CmaHeader(route.src, route.dst, ephemeral_port() if src_port is None else src_port)
    pdata = join_private_data(hdr, private_data, CmAttr.SIDR_REQ)
    rep = simple.resolve_service(al, route.path, service_id(PortSpace.UDP, port), pdata,
                                 timeout_ms=timeout_ms, retries=retries)  # fmt: skip
    assert rep is not None
    if rep.status != SidrStatus.SUCCESS:
        raise RemoteError(f"SIDR_REP status {rep.status.name}")
    if rep.qkey != RDMA_UDP_QKEY:
        raise RemoteError(f"SIDR_REP Q_Key {rep.qkey:#x}, not RDMA_UDP_QKEY")
    av = AvAttr(port_num=route.port_num, grh=Grh(
        dgid=route.dgid, sgid_index=route.sgid_index, hop_limit=int(route.path["hop_limit"])))
    return UdPeer(rep.qpn, rep.qkey, av, route, rep.private_data)


class RdmaIncoming:
    """A connection request from an ``rdma_cm`` peer (``RDMA_CM_EVENT_CONNECT_REQUEST``)."""

    def __init__(self, incoming: Incoming, header: CmaHeader, port: int) -> None:
        self.incoming = incoming
        self.header = header
        self.src = (header.src, header.src_port)
        """The peer's address and source port."""
        self.dst = (header.dst, port)
        """The address and port the peer connected to (this side's)."""
        self.private_data = bytes(incoming.private_data[CMA_HDR_SIZE:])
        """The user's part (56 bytes: the REQ's private data is fixed-size)."""

    def __repr__(self) -> str:
        return f"<RdmaIncoming {self.src[0]}:{self.src[1]} -> {self.dst[0]}:{self.dst[1]}>"

    def accept(self, qp: Qp, private_data: bytes = b"", *, timeout: float | None = None,
               callback: Callable[[RdmaConnection], object] | None = None,
               **options: Any) -> RdmaConnection:  # fmt: skip
        """``rdma_accept``: REP with ``qp``; blocks until the RTU came unless ``callback``
        is given (then it runs on the misc queue once the outcome is known)."""
        out = RdmaConnection(None, self.dst, self.src, self.private_data)
        return out.attach(lambda cb: self.incoming.accept(qp, private_data, timeout=timeout,
                                                          callback=cb, **options),
                          callback)  # fmt: skip

    def reject(self, private_data: bytes = b"") -> None:
        """``rdma_reject``: REJ "consumer defined" (UDP: SIDR_REP "reject") with
        ``private_data``."""
        self.incoming.reject(RejReason.CONSUMER_DEFINED, private_data=private_data)

    @property
    def ud(self) -> bool:
        """A SIDR_REQ (UDP port space): answer it with :meth:`answer`."""
        return bool(self.incoming.sidr)

    def answer(self, qp: Qp, private_data: bytes = b"") -> None:
        """``rdma_accept`` on a UDP id: SIDR_REP naming UD ``qp`` and ``RDMA_UDP_QKEY``
        (the Q_Key a Linux peer insists on; the QP must have it)."""
        qkey = qp.query().qkey
        if qkey != RDMA_UDP_QKEY:
            raise InvalidSetting(f"the UD QP's Q_Key is {qkey:#x}; a Linux peer takes only "
                                 f"RDMA_UDP_QKEY {RDMA_UDP_QKEY:#x}")  # fmt: skip
        self.incoming.answer(qp, private_data)

    def peer_av(self, port_num: int, sgid_index: int = 0) -> AvAttr:
        """An address vector back to the requester (its address from the CMA header)."""
        return AvAttr(port_num=port_num, grh=Grh(dgid=gid_of(self.header.src),
                                                 sgid_index=sgid_index))  # fmt: skip


class RdmaListener:
    """``rdma_listen`` on ``port`` (optionally only for REQs to address ``addr``).

    Each REQ is looked at as it arrives (on the AL's misc queue): one without a
    valid CMA header is rejected (REJ "consumer defined", as a Linux listener
    refuses it), one for another address than ``addr`` with REJ "invalid
    service ID" (nobody listens there); both are counted in :attr:`stats`.
    The others wait for :meth:`get`, or go to ``callback``.
    """

    def __init__(self, al: AccessLayer, port: int, *, ps: PortSpace = PortSpace.TCP,
                 addr: IpAddress | str | None = None,
                 callback: Callable[[RdmaIncoming], object] | None = None,
                 backlog: int = 128) -> None:  # fmt: skip
        self.port = port
        self.ps = PortSpace(ps)
        self.addr = ip_address(addr) if addr is not None else None
        self.stats: Counter[str] = Counter()
        """REQs refused before the user saw them, by reason."""
        self._callback = callback
        self._queue: queue.Queue[RdmaIncoming] = queue.Queue()
        self.listener: Listener = simple.listen(al, service_id(self.ps, port),
                                                callback=self._arrived, backlog=backlog,
                                                ud=self.ps is PortSpace.UDP)  # fmt: skip

    def __repr__(self) -> str:
        return f"<RdmaListener {self.addr or '*'}:{self.port} {self.ps.name}>"

    def _arrived(self, inc: Incoming) -> None:
        try:
            hdr = CmaHeader.decode(inc.private_data)
        except FieldError as e:
            self.stats["bad header"] += 1
            log.info("%r: REQ refused: %s", self, e)
            inc.reject(RejReason.CONSUMER_DEFINED)  # a SIDR_REQ: SIDR_REP "reject"
            return
        if self.addr is not None and hdr.dst != self.addr:
            self.stats["other address"] += 1
            inc.reject(RejReason.INVALID_SERVICE_ID)
            return
        req = RdmaIncoming(inc, hdr, self.port)
        if self._callback is not None:
            self._callback(req)
        else:
            self._queue.put(req)

    def get(self, timeout: float | None = None) -> RdmaIncoming:
        """The next request; ``Timeout`` after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise Timeout(f"no connection request within {timeout} s") from None

    def close(self) -> None:
        """Stop listening."""
        self.listener.close()

    def __enter__(self) -> RdmaListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def listen(al: AccessLayer, port: int, *, ps: PortSpace = PortSpace.TCP,
           addr: IpAddress | str | None = None,
           callback: Callable[[RdmaIncoming], object] | None = None,
           backlog: int = 128) -> RdmaListener:  # fmt: skip
    """``rdma_bind_addr`` + ``rdma_listen``: REQs of ``rdma_connect`` peers to ``port``
    (see :class:`RdmaListener`; ``callback`` runs on the AL's misc queue; ``backlog``
    half-open connections at most, as ``rdma_listen``'s: docs/cm.md)."""
    return RdmaListener(al, port, ps=ps, addr=addr, callback=callback, backlog=backlog)
