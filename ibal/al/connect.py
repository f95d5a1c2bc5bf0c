"""Connection helpers: what every channel driver writes by hand around ``modify_qp``.

Each end describes itself with :func:`endpoint` (QP number, PSN, LID, GID,
MTU, Q_Key), the two records are exchanged out of band (a socket, a file, the
CM later), and :func:`connect_qp` walks the QP RESET → INIT → RTR → RTS
towards the other end.  The attribute computation is pure
(:func:`path_to`, :func:`transitions`); ``connect_qp`` only queries the CA and
issues the modifies.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from ipaddress import AddressValueError
from typing import TYPE_CHECKING, Any

from ibal.status import IbError, InvalidParameter, InvalidPort, InvalidQpState, NotFound
from ibal.types import (
    AccessFlags,
    AvAttr,
    CaAttr,
    Gid,
    GidEntry,
    GidType,
    Grh,
    LinkLayer,
    Mtu,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    UdDest,
)

if TYPE_CHECKING:
    from ibal.al.qp import Qp

DEFAULT_QKEY = 0x1111_1111
"""Q_Key a datagram QP gets when neither side names one (high bit clear)."""

_PSN_MASK = 0xFF_FFFF
_QPN_MASK = 0xFF_FFFF


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One end of a connection, as the other end needs to know it.

    ``lid`` addresses an InfiniBand port; ``gid`` a RoCE port (always) or an
    IB port off the local subnet.  ``mtu`` is the sender's active MTU (the
    path uses the smaller of the two); ``qkey`` is what a datagram QP accepts.
    ``port_num`` is local information (the port :func:`endpoint` was asked
    for); the other end ignores it.
    """

    qpn: int
    psn: int = 0
    lid: int = 0
    gid: Gid | None = None
    mtu: Mtu | None = None
    qkey: int = 0
    port_num: int = 0

    def __post_init__(self) -> None:
        for name, limit in (("qpn", _QPN_MASK), ("psn", _PSN_MASK), ("lid", 0xFFFF)):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v <= limit:
                raise InvalidParameter(f"{name} {v!r} outside 0..0x{limit:x}")
        if type(self.qkey) is not int or not 0 <= self.qkey <= 0xFFFF_FFFF:
            raise InvalidParameter(f"qkey {self.qkey!r} is not 32 bits")
        if self.gid is not None and not isinstance(self.gid, Gid):
            raise InvalidParameter(f"gid {self.gid!r} is not an ibal.types.Gid")
        if self.mtu is not None and not isinstance(self.mtu, Mtu):
            raise InvalidParameter(f"mtu {self.mtu!r} is not an ibal.types.Mtu")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form to send to the other end (``port_num`` stays here)."""
        return {
            "qpn": self.qpn,
            "psn": self.psn,
            "lid": self.lid,
            "gid": None if self.gid is None else str(self.gid),
            "mtu": None if self.mtu is None else self.mtu.bytes,
            "qkey": self.qkey,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Endpoint:
        """The inverse of :meth:`to_dict`; bad input raises ``InvalidParameter``."""
        if not isinstance(data, Mapping):
            raise InvalidParameter("an endpoint is a mapping")
        try:
            gid = data.get("gid")
            mtu = data.get("mtu")
            return cls(
                qpn=data["qpn"],
                psn=data.get("psn", 0),
                lid=data.get("lid", 0),
                gid=None if gid is None else Gid(gid),
                mtu=None if mtu is None else {m.bytes: m for m in Mtu}[mtu],
                qkey=data.get("qkey", 0),
            )
        except (KeyError, AddressValueError, ValueError, TypeError) as exc:
            raise InvalidParameter(f"bad endpoint {dict(data)!r}: {exc!r}") from None

    def ud_dest(self, av: Any, qkey: int | None = None) -> UdDest:
        """Datagram addressing towards this end through ``av`` (an AV made for it)."""
        return UdDest(av=av, remote_qp=self.qpn, remote_qkey=self.qkey if qkey is None else qkey)


RemoteEndpoint = Endpoint
"""The same record, named for the side it describes in :func:`connect_qp`."""


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """Tunables of :func:`connect_qp`; the defaults suit a data-centre fabric.

    Timers use the IBA encodings: ``local_ack_timeout`` 14 is 4.096 µs * 2^14
    ≈ 67 ms; ``rnr_nak_timeout`` 12 is 0.64 ms; retry counts 7 (``rnr_retry_cnt``
    7 means "retry forever").  ``resp_res`` / ``init_depth`` ``None`` take the
    CA's limits (at most 16).  ``mtu`` caps the path MTU; ``grh`` forces a GRH
    on InfiniBand (RoCE always has one); ``sgid_index`` picks the source GID
    (default: index 0 on IB, the best RoCE GID for the remote's address family).
    """

    access: AccessFlags | None = None
    pkey_index: int = 0
    qkey: int | None = None
    sl: int = 0
    mtu: Mtu | None = None
    local_ack_timeout: int = 14
    retry_cnt: int = 7
    rnr_retry_cnt: int = 7
    rnr_nak_timeout: int = 12
    resp_res: int | None = None
    init_depth: int | None = None
    grh: bool = False
    sgid_index: int | None = None
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0


DEFAULT_OPTIONS = ConnectOptions()


# --------------------------------------------------------------------- pure parts


def _check_port(port: object) -> PortAttr:
    if not isinstance(port, PortAttr):
        raise InvalidParameter("a PortAttr is required")
    return port


def preferred_gid(port: PortAttr, *, ipv4: bool | None = None) -> GidEntry:
    """The GID this port is best addressed by.

    InfiniBand: index 0.  RoCE: RoCE v2 before v1; among those, IPv4-mapped
    GIDs when ``ipv4`` is true or ``None``, else global IPv6 before link-local.
    ``NotFound`` when the port has no usable GID.
    """
    entries = [e for e in _check_port(port).gid_table if e.gid.packed != bytes(16)]
    if not entries:
        raise NotFound(f"port {port.port_num} has no GID")
    if port.link_layer is not LinkLayer.ETHERNET:
        first = port.gid_entry(0)
        return first if first is not None else entries[0]

    want_v4 = True if ipv4 is None else ipv4

    def rank(e: GidEntry) -> tuple[bool, bool, bool]:
        return (e.gid_type is not GidType.ROCE_V2, e.is_ipv4 != want_v4, e.gid.is_link_local)

    return min(entries, key=lambda e: (rank(e), e.index))


def path_to(
    port: PortAttr, remote: Endpoint, options: ConnectOptions = DEFAULT_OPTIONS
) -> AvAttr:
    """The address vector from ``port`` to ``remote`` (GRH on RoCE and when needed on IB).

    ``InvalidParameter`` when a RoCE port is given a remote without a GID, or
    an IB remote with neither LID nor GID.
    """
    _check_port(port)
    if not isinstance(remote, Endpoint):
        raise InvalidParameter("remote must be an ibal.Endpoint")
    roce = port.link_layer is LinkLayer.ETHERNET
    if roce and remote.gid is None:
        raise InvalidParameter("a RoCE port reaches its peer by GID: the remote has none")
    if not roce and not remote.lid and remote.gid is None:
        raise InvalidParameter("the remote has neither a LID nor a GID")
    grh: Grh | None = None
    want_grh = roce or options.grh or (remote.gid is not None and not remote.lid)
    if not want_grh and remote.gid is not None and port.gids:
        # Off-subnet on IB: the subnet prefixes differ, so routers need the GRH.
        want_grh = remote.gid.packed[:8] != port.gids[0].packed[:8]
    if want_grh:
        if remote.gid is None:
            raise InvalidParameter("a GRH needs the remote's GID")
        if options.sgid_index is not None:
            if port.gid_entry(options.sgid_index) is None:
                raise InvalidParameter(f"port {port.port_num} has no GID {options.sgid_index}")
            sgid_index = options.sgid_index
        else:
            want_v4 = remote.gid.ipv4_mapped is not None if roce else None
            sgid_index = preferred_gid(port, ipv4=want_v4).index
        grh = Grh(
            dgid=remote.gid,
            sgid_index=sgid_index,
            flow_label=options.flow_label,
            hop_limit=options.hop_limit,
            traffic_class=options.traffic_class,
        )
    return AvAttr(
        port_num=port.port_num,
        dlid=0 if roce else remote.lid,
        sl=options.sl,
        grh=grh,
    )


def path_mtu(port: PortAttr, remote: Endpoint, options: ConnectOptions = DEFAULT_OPTIONS) -> Mtu:
    """The smallest of the local active MTU, the remote's and the option's."""
    cands = [port.active_mtu] + [m for m in (remote.mtu, options.mtu) if m is not None]
    return Mtu(min(int(m) for m in cands))


def default_access(atomics: bool = False) -> AccessFlags:
    """Local write, RDMA read and write, and atomics when the CA has them."""
    acc = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
    if atomics:
        acc |= AccessFlags.ATOMIC
    return acc


def _depth(asked: int | None, limit: int) -> int:
    if asked is not None:
        return asked
    return max(1, min(16, limit or 4))


_NO_LIMITS = CaAttr(ca_guid=0)  # no CA limits given: depths as asked


def transitions(
    qp_type: QpType,
    port: PortAttr,
    remote: Endpoint,
    *,
    psn: int = 0,
    options: ConnectOptions = DEFAULT_OPTIONS,
    ca_attr: CaAttr | None = None,
) -> list[QpMod]:
    """The three ``QpMod`` s (INIT, RTR, RTS) that connect a ``qp_type`` QP to ``remote``.

    ``psn`` is this end's first send PSN (what it told the other end);
    ``remote.psn`` is the first PSN it will receive.  Datagram QPs get their
    Q_Key from ``options.qkey``, else this end's advertised one, else
    :data:`DEFAULT_QKEY`; they need no remote to reach RTS.
    """
    _check_port(port)
    if not isinstance(options, ConnectOptions):
        raise InvalidParameter("options must be a ConnectOptions")
    if type(psn) is not int or not 0 <= psn <= _PSN_MASK:
        raise InvalidParameter(f"psn {psn!r} outside 0..0xffffff")
    pn, pki = port.port_num, options.pkey_index
    if qp_type is QpType.UD or qp_type is QpType.MAD:
        qkey = options.qkey if options.qkey is not None else DEFAULT_QKEY
        return [
            QpMod(QpState.INIT, port_num=pn, pkey_index=pki, qkey=qkey),
            QpMod(QpState.RTR),
            QpMod(QpState.RTS, sq_psn=psn),
        ]
    if qp_type not in (QpType.RC, QpType.UC):
        raise InvalidParameter(f"connect_qp handles RC, UC and UD QPs, not {qp_type.name}")
    access = options.access if options.access is not None else default_access()
    if qp_type is QpType.UC:
        access &= ~(AccessFlags.RDMA_READ | AccessFlags.ATOMIC)  # UC has neither
    av = path_to(port, remote, options)
    mtu = path_mtu(port, remote, options)
    init = QpMod(QpState.INIT, port_num=pn, pkey_index=pki, access=access)
    if qp_type is QpType.UC:
        return [
            init,
            QpMod(QpState.RTR, primary_av=av, path_mtu=mtu, dest_qp=remote.qpn,
                  rq_psn=remote.psn),
            QpMod(QpState.RTS, sq_psn=psn),
        ]  # fmt: skip
    limits = ca_attr or _NO_LIMITS
    return [
        init,
        QpMod(
            QpState.RTR,
            primary_av=av,
            path_mtu=mtu,
            dest_qp=remote.qpn,
            rq_psn=remote.psn,
            resp_res=_depth(options.resp_res, limits.max_qp_resp_res),
            rnr_nak_timeout=options.rnr_nak_timeout,
        ),
        QpMod(
            QpState.RTS,
            sq_psn=psn,
            local_ack_timeout=options.local_ack_timeout,
            retry_cnt=options.retry_cnt,
            rnr_retry_cnt=options.rnr_retry_cnt,
            init_depth=_depth(options.init_depth, limits.max_qp_init_depth),
        ),
    ]


# ------------------------------------------------------------------------ I/O


def _port_of(qp: Qp, port_num: int) -> tuple[CaAttr, PortAttr]:
    attr = qp.pd.ca.query()
    try:
        return attr, attr.port(port_num)
    except KeyError:
        raise InvalidPort(f"CA {qp.pd.ca.name} has no port {port_num!r}") from None


def start_psn(psn: int | None) -> int:
    """``psn``, checked, or (``None``) a 24-bit start PSN from the OS's randomness.

    Not ``random``: a Mersenne Twister's output (and the same after ``random.seed``)
    lets an off-path peer predict the PSNs of the next connections; Linux draws
    them with ``get_random_u32``.
    """
    if psn is None:
        return secrets.randbits(24)
    if type(psn) is not int or not 0 <= psn <= 0xFFFFFF:
        raise InvalidParameter(f"a PSN is a 24-bit int, not {psn!r:.40}")
    return psn


def endpoint(
    qp: Qp,
    port_num: int,
    *,
    psn: int | None = None,
    qkey: int | None = None,
    gid_index: int | None = None,
) -> Endpoint:
    """This QP's end of a connection through ``port_num``, to send to the other end.

    ``psn`` ``None`` draws a random 24-bit start PSN (IBA recommends that);
    ``gid_index`` ``None`` takes :func:`preferred_gid`; ``qkey`` (datagram
    QPs) defaults to :data:`DEFAULT_QKEY`.
    """
    from ibal.al.qp import Qp

    if not isinstance(qp, Qp):
        raise InvalidParameter(f"qp must be an ibal Qp, not {type(qp).__name__}")
    if type(port_num) is not int:
        raise InvalidParameter("port_num must be an int")
    _, port = _port_of(qp, port_num)
    gid: Gid | None = None
    if gid_index is not None:
        entry = port.gid_entry(gid_index)
        if entry is None:
            raise InvalidParameter(f"port {port_num} has no GID {gid_index}")
        gid = entry.gid
    else:
        try:
            gid = preferred_gid(port).gid
        except NotFound:
            gid = None
    psn = start_psn(psn)
    if qkey is None:
        qkey = DEFAULT_QKEY if qp.qp_type.is_datagram else 0
    return Endpoint(
        qpn=qp.num,
        psn=psn,
        lid=0 if port.link_layer is LinkLayer.ETHERNET else port.lid,
        gid=gid,
        mtu=port.active_mtu,
        qkey=qkey,
        port_num=port_num,
    )


def connect_qp(
    qp: Qp,
    local: Endpoint | int,
    remote: Endpoint,
    *,
    options: ConnectOptions | None = None,
    psn: int | None = None,
) -> AvAttr:
    """Bring ``qp`` from RESET to RTS towards ``remote``; return the path to it.

    ``local`` is this end's :class:`Endpoint` (from :func:`endpoint`: its
    ``port_num``, ``psn`` and ``qkey`` are used) or a port number (then ``psn``,
    default: a random one, as :func:`endpoint` draws).  RC and UC QPs are connected
    to ``remote.qpn``; a UD QP is made ready to send and receive and the returned ``AvAttr`` is what
    ``pd.create_av`` needs to reach ``remote`` (``remote.ud_dest(av)`` then
    addresses the work request).  The QP must be in RESET
    (``InvalidQpState``); if a step fails it goes back to RESET and the error
    is raised.
    """
    from ibal.al.qp import Qp

    if not isinstance(qp, Qp):
        raise InvalidParameter("qp must be an ibal Qp")
    opts = DEFAULT_OPTIONS if options is None else options
    if isinstance(local, Endpoint):
        port_num, my_psn = local.port_num, local.psn
        if psn is not None:
            my_psn = start_psn(psn)
        if opts.qkey is None and local.qkey and qp.qp_type.is_datagram:
            opts = replace(opts, qkey=local.qkey)
    elif type(local) is int:
        port_num, my_psn = local, start_psn(psn)
    else:
        raise InvalidParameter("local is an Endpoint or a port number")
    if not isinstance(remote, Endpoint):
        raise InvalidParameter("remote must be an ibal.Endpoint")
    if qp.state is not QpState.RESET:
        raise InvalidQpState(f"connect_qp starts from RESET; the QP is in {qp.state.name}")
    ca_attr, port = _port_of(qp, port_num)
    if opts.access is None:
        opts = replace(opts, access=default_access(qp.pd.ca.capabilities.atomics))
    mods = transitions(qp.qp_type, port, remote, psn=my_psn, options=opts, ca_attr=ca_attr)
    av = path_to(port, remote, opts) if remote.lid or remote.gid is not None else None
    for i, mod in enumerate(mods):
        try:
            qp.modify(mod)
        except IbError:
            if i:
                with contextlib.suppress(IbError):  # the original error is what counts
                    qp.modify(QpMod(QpState.RESET))
            raise
    if av is None:
        return AvAttr(port_num=port_num)
    return av


__all__ = [
    "DEFAULT_OPTIONS",
    "DEFAULT_QKEY",
    "ConnectOptions",
    "Endpoint",
    "RemoteEndpoint",
    "connect_qp",
    "default_access",
    "endpoint",
    "path_mtu",
    "path_to",
    "preferred_gid",
    "transitions",
]
