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

import ipaddress
from dataclasses import dataclass
from typing import Any

from ibal.al import AccessLayer
from ibal.cm.cma import IpAddress, gid_of, ip_of
from ibal.mad import sa
from ibal.mad.consts import Method, SaAttr
from ibal.sa import user_query
from ibal.status import IbError, InvalidParameter, NotFound
from ibal.types import Gid, LinkLayer, LinkState, PortAttr

__all__ = ["RdmaRoute", "resolve_route"]


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
    """The PathRecord's fields (``ibal.mad.sa.PATH_RECORD``): MTU, rate, hop limit..."""

    @property
    def sgid(self) -> Gid:
        return gid_of(self.src)

    @property
    def dgid(self) -> Gid:
        return gid_of(self.dst)


def _addr(v: IpAddress | str) -> IpAddress:
    try:
        return ipaddress.ip_address(v) if isinstance(v, str) else v
    except ValueError:
        raise InvalidParameter(f"{v!r} is not an IP address") from None


def _candidates(al: AccessLayer, port_guid: int | None) -> list[tuple[int, PortAttr]]:
    """Active Ethernet ports (CA GUID, port), or just the one asked for."""
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
    d = _addr(dst)
    s = _addr(src) if src is not None else None
    if s is not None and s.version != d.version:
        raise InvalidParameter(f"source {s} and destination {d} are of different IP versions")
    ports = _candidates(al, port_guid)
    if s is not None:
        want = gid_of(s)
        ports = [(g, p) for g, p in ports if any(e.gid == want for e in p.gid_table)]
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
        index = next((e.index for e in port.gid_table if e.gid == sgid), None)
        if index is None:  # the port's table changed under us
            continue
        return RdmaRoute(ip_of(sgid), d, ca_guid, port.port_num, port.port_guid, index, fields)
    if last is not None:
        raise last
    raise NotFound(f"no path to {d}")
