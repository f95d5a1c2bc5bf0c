"""ibnetdiscover's fabric cache (``--cache``/``--load-cache``) and ``ibal ibcacheedit``.

The file is libibnetdisc's: little-endian, a 28-byte header (magic 0x8FE7832B,
version 1, node and port counts, the GUID of the node the sweep started at,
the hops discovered), then each node (SMA LID and LMC, enhanced port 0,
SwitchInfo, GUID, type, ports, NodeInfo, NodeDescription and the keys
(GUID, number) of its stored ports), then each port (GUID, number, external
number, base LID, LMC, PortInfo, its node's GUID and the key of the port at
the far end of its link).  :class:`Cache` is that content as objects; a port
holds its node and its far end by reference, so an edit of a GUID
(:func:`edit`) is seen wherever the file names it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Final

import click

from ibal.mad.discover import DiscNode, DiscPort, Topology
from ibal.mad.rpc import MadClient, MadError, PortId, smp_request
from ibal.records import record
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["MAGIC", "Cache", "CacheError", "CacheNode", "CachePort", "discover_cached", "edit",
           "from_fabric", "ibcacheedit_cmd", "load", "loads", "to_topology"]  # fmt: skip

MAGIC: Final = 0x8FE7832B
VERSION: Final = 1
_HEAD = struct.Struct("<IIIIQI")
_NODE = struct.Struct("<HBB64sQBB64s64sB")
_KEY = struct.Struct("<QB")
_PORT = struct.Struct("<QBBHB64sQBQB")


class CacheError(ValueError):
    """A file that is not a valid fabric cache (the reason in the message)."""


@record(kw_only=True)
class CachePort:
    guid: int
    num: int
    ext_num: int = 0
    base_lid: int = 0
    lmc: int = 0
    info: bytes = bytes(64)
    node: Any = None  # its CacheNode
    remote: Any = None  # the CachePort at the far end, if any


@record(kw_only=True)
class CacheNode:
    sma_lid: int = 0
    sma_lmc: int = 0
    enhanced_port0: bool = False
    switch_info: bytes = bytes(64)
    guid: int
    node_type: int
    num_ports: int
    info: bytes = bytes(64)
    desc: bytes = bytes(64)
    ports: list[CachePort]


@record
class Cache:
    from_guid: int
    max_hops: int
    nodes: list[CacheNode]

    def dumps(self) -> bytes:
        """The file's bytes."""
        ports = [p for n in self.nodes for p in n.ports]
        out = [_HEAD.pack(MAGIC, VERSION, len(self.nodes), len(ports), self.from_guid,
                          self.max_hops)]  # fmt: skip
        for n in self.nodes:
            out.append(_NODE.pack(n.sma_lid, n.sma_lmc, int(n.enhanced_port0), n.switch_info,
                                  n.guid, n.node_type, n.num_ports, n.info, n.desc,
                                  len(n.ports)))  # fmt: skip
            out += [_KEY.pack(p.guid, p.num) for p in n.ports]
        for p in ports:
            far = p.remote
            out.append(_PORT.pack(p.guid, p.num, p.ext_num, p.base_lid, p.lmc, p.info,
                                  p.node.guid, 1 if far else 0, far.guid if far else 0,
                                  far.num if far else 0))  # fmt: skip
        return b"".join(out)


def loads(data: bytes) -> Cache:
    """A cache file's content; :class:`CacheError` naming what is wrong."""
    if len(data) < _HEAD.size:
        raise CacheError("short file: no header")
    magic, version, n_nodes, n_ports, from_guid, hops = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CacheError("invalid fabric cache file")
    if version != VERSION:
        raise CacheError("invalid fabric cache version")
    off = _HEAD.size
    nodes: list[tuple[CacheNode, list[tuple[int, int]]]] = []
    try:
        for _ in range(n_nodes):
            f = _NODE.unpack_from(data, off)
            off += _NODE.size
            keys = [_KEY.unpack_from(data, off + i * _KEY.size) for i in range(f[9])]
            off += f[9] * _KEY.size
            nodes.append((CacheNode(sma_lid=f[0], sma_lmc=f[1], enhanced_port0=bool(f[2]),
                                    switch_info=f[3], guid=f[4], node_type=f[5],
                                    num_ports=f[6], info=f[7], desc=f[8], ports=[]),
                          keys))  # fmt: skip
        ports: dict[tuple[int, int], tuple[CachePort, int, tuple[int, int] | None]] = {}
        for _ in range(n_ports):
            g, num, ext, lid, lmc, info, owner, has, rg, rn = _PORT.unpack_from(data, off)
            off += _PORT.size
            p = CachePort(guid=g, num=num, ext_num=ext, base_lid=lid, lmc=lmc, info=info)
            ports[(g, num)] = (p, owner, (rg, rn) if has else None)
    except struct.error:
        raise CacheError("read short: the file ends inside a record") from None
    by_guid = {n.guid: n for n, _ in nodes}
    if from_guid not in by_guid:
        raise CacheError("Cache invalid: cannot find from node")
    for n, keys in nodes:
        for k in keys:
            if k not in ports:
                raise CacheError("Cache invalid: cannot find port")
            n.ports.append(ports[k][0])
    for p, owner, far in ports.values():
        if owner not in by_guid:
            raise CacheError("Cache invalid: cannot find node")
        p.node = by_guid[owner]
        if far is not None:
            if far not in ports:
                raise CacheError("Cache invalid: cannot find remote port")
            p.remote = ports[far][0]
    return Cache(from_guid, hops, [n for n, _ in nodes])


def load(path: Path) -> Cache:
    try:
        return loads(path.read_bytes())
    except OSError as exc:
        raise CacheError(f"{path}: {exc.strerror}") from exc


def from_fabric(client: MadClient, topo: Topology, max_hops: int, window: int = 64) -> Cache:
    """A cache of a swept topology: its nodes' NodeInfo, NodeDescription and SwitchInfo and
    every port's PortInfo read again, raw, as libibnetdisc keeps them."""
    nodes = list(topo.nodes.values())
    reqs = []
    for n in nodes:
        to = PortId(dr_path=n.path)
        reqs += [smp_request(SmpAttr.NODE_INFO, to), smp_request(SmpAttr.NODE_DESC, to)]
        if n.is_switch:
            reqs.append(smp_request(SmpAttr.SWITCH_INFO, to))
        reqs += [smp_request(SmpAttr.PORT_INFO, to, p) for p in sorted(n.ports)]
    reps = iter(client.call_many(reqs, window=window))
    made: dict[tuple[int, int], CachePort] = {}
    out = []
    for n in nodes:
        ni, nd = (bytes(next(reps).data) for _ in range(2))
        si = bytes(next(reps).data) if n.is_switch else bytes(64)  # a CA's is zeros
        cn = CacheNode(guid=n.guid, node_type=n.node_type, num_ports=n.num_ports, info=ni,
                       desc=nd, switch_info=si,
                       enhanced_port0=n.enhanced_port0, ports=[])  # fmt: skip
        for pn in sorted(n.ports):
            rep = next(reps)
            info = bytes(rep.data) if rep.ok else bytes(64)
            pi = smp.PORT_INFO.decode(info)
            port = n.ports[pn]
            cp = CachePort(guid=port.guid, num=pn, base_lid=int(pi["lid"]), lmc=int(pi["lmc"]),
                           info=info, node=cn)  # fmt: skip
            cn.ports.append(cp)
            made[(n.guid, pn)] = cp
        port0 = cn.ports[0] if n.is_switch and cn.ports else None
        if port0 is not None:  # as libibnetdisc: a switch's ports carry its port 0's LID
            cn.sma_lid, cn.sma_lmc = port0.base_lid, port0.lmc
            for cp in cn.ports:
                cp.base_lid = port0.base_lid
        out.append(cn)
    for n in nodes:
        for pn, port in n.ports.items():
            if port.remote is not None:
                made[(n.guid, pn)].remote = made.get(port.remote)
    if topo.root is None:
        raise MadError("discover failed: the local port did not answer NodeInfo")
    # libibnetdisc lists its nodes newest first
    return Cache(topo.root, max_hops, list(reversed(out)))


def to_topology(cache: Cache) -> Topology:
    """The cache as the sweep's :class:`Topology`, nodes in the order found (the file's
    reversed), so ``discover``'s printers print it as ibnetdiscover prints a load."""
    topo = Topology()
    for cn in reversed(cache.nodes):
        ni = smp.NODE_INFO.decode(cn.info)
        node = DiscNode(cn.guid, cn.node_type, cn.num_ports, int(ni["system_image_guid"]),
                        int(ni["port_guid"]), int(ni["vendor_id"]), int(ni["device_id"]),
                        int(ni["revision"]), (),
                        cn.desc.split(b"\0", 1)[0].decode("latin-1"),
                        cn.enhanced_port0)  # fmt: skip
        for cp in cn.ports:
            pi = smp.PORT_INFO.decode(cp.info)
            node.ports[cp.num] = DiscPort(
                cp.num, cp.guid, cp.base_lid, cp.lmc, int(pi["capability_mask"]),
                int(pi["link_width_active"]), int(pi["link_speed_active"]),
                int(pi["link_speed_ext_active"]), int(pi["port_state"]),
                int(pi["port_phys_state"]),
                (cp.remote.node.guid, cp.remote.num) if cp.remote is not None else None)
        topo.nodes[cn.guid] = node
    topo.root = cache.from_guid
    return topo


def edit(cache: Cache, *, switchguid: tuple[int, int] | None = None,
         caguid: tuple[int, int] | None = None, sysimgguid: tuple[int, int] | None = None,
         portguid: tuple[int, int, int] | None = None) -> None:  # fmt: skip
    """ibcacheedit's changes, in its order; :class:`CacheError` when a GUID is not there."""

    def node_guid(kind: int, before: int, after: int, what: str) -> None:
        found = [n for n in cache.nodes if n.node_type == kind and n.guid == before]
        if not found:
            raise CacheError(f"{what} = {before:x} not found")
        for n in found:
            _set_node_guid(cache, n, after)

    if switchguid:
        node_guid(smp.NodeType.SWITCH, *switchguid, "switchguid")
    if caguid:
        node_guid(smp.NodeType.CA, *caguid, "caguid")
    if sysimgguid:
        before, after = sysimgguid
        found = 0
        for n in cache.nodes:
            ni = dict(smp.NODE_INFO.decode(n.info))
            if int(ni["system_image_guid"]) == before:
                ni["system_image_guid"] = after
                n.info = smp.NODE_INFO.encode(ni)
                found += 1
        if not found:
            raise CacheError(f"sysimgguid = {before:x} not found")
    if portguid:
        owner, before, after = portguid
        nodes = [n for n in cache.nodes if n.guid == owner]
        if not nodes:
            raise CacheError(f"nodeguid = {owner:x} not found")
        found = 0
        for n in nodes:
            if n.node_type == smp.NodeType.SWITCH:
                if n.guid == before:
                    _set_node_guid(cache, n, after)
                    found += 1
                continue
            for p in n.ports:
                if p.num and p.guid == before:
                    p.guid = after
                    found += 1
                    break
        if not found:
            raise CacheError(f"portguid = {before:x} not found")


def _set_node_guid(cache: Cache, node: CacheNode, guid: int) -> None:
    if node.guid == cache.from_guid:
        cache.from_guid = guid
    node.guid = guid
    if node.node_type == smp.NodeType.SWITCH:  # a switch's ports carry its GUID
        for p in node.ports:
            p.guid = guid


def _guids(text: str, opt: str, n: int) -> list[int]:
    parts = text.split(":")
    try:
        if len(parts) == n and all(parts):
            return [int(x, 0) for x in parts]
    except ValueError:
        pass
    raise click.ClickException(f"invalid input '{text}' for {opt}")


def _two(text: str | None, opt: str) -> tuple[int, int] | None:
    if text is None:
        return None
    a, b = _guids(text, opt, 2)
    return a, b


def _print(topo: Topology, *, show: bool, group: bool, list_types: tuple[int, ...],
           ports: bool, names: dict[int, str] | None = None) -> str:  # fmt: skip
    """ibnetdiscover's text of ``topo``, its options in its precedence (``names``: a
    ``--node-name-map``)."""
    import time

    from ibal.mad.discover import (
        ibnetdiscover_list,
        ibnetdiscover_ports,
        ibnetdiscover_show,
        ibnetdiscover_text,
    )

    head = ibnetdiscover_show(topo) if show else ""
    if ports:
        return head + ibnetdiscover_ports(topo, names)
    if list_types:
        return head + ibnetdiscover_list(topo, list_types, names)
    return head + ibnetdiscover_text(topo, time.ctime(), group=group, names=names)


def discover_cached(client: MadClient | None, *, write: Path | None, read: Path | None,
                    window: int = 64, **opts: Any) -> str:  # fmt: skip
    """``discover --cache FILE`` (sweep, print, write the cache) or ``--load-cache FILE``
    (print the cached fabric, no MADs)."""
    from ibal.mad.discover import sweep

    if read is not None:
        return _print(to_topology(load(read)), **opts)
    assert client is not None and write is not None
    topo = sweep(client, window=window).topology
    cache = from_fabric(client, topo, max((len(n.path) for n in topo.nodes.values()),
                                          default=0), window)  # fmt: skip
    try:
        write.write_bytes(cache.dumps())
    except OSError as exc:
        raise CacheError(f"{write}: {exc.strerror}") from exc
    return _print(topo, **opts)


@click.command("ibcacheedit")
@click.argument("orig", type=click.Path(path_type=Path), metavar="ORIG.CACHE")
@click.argument("new", type=click.Path(path_type=Path), metavar="NEW.CACHE")
@click.option("--switchguid", metavar="BEFOREGUID:AFTERGUID", help="A switch's GUID to change.")
@click.option("--caguid", metavar="BEFOREGUID:AFTERGUID", help="A CA's GUID to change.")
@click.option("--sysimgguid", metavar="BEFOREGUID:AFTERGUID",
              help="A system image GUID to change.")  # fmt: skip
@click.option("--portguid", metavar="NODEGUID:BEFOREGUID:AFTERGUID",
              help="A port GUID of a node to change.")  # fmt: skip
def ibcacheedit_cmd(orig: Path, new: Path, switchguid: str | None, caguid: str | None,
                    sysimgguid: str | None, portguid: str | None) -> None:  # fmt: skip
    """ibcacheedit: change GUIDs in an ibnetdiscover cache, writing a new cache file."""
    try:
        cache = load(orig)
        port3 = None
        if portguid is not None:
            a, b, c = _guids(portguid, "--portguid", 3)
            port3 = (a, b, c)
        edit(cache, switchguid=_two(switchguid, "--switchguid"),
             caguid=_two(caguid, "--caguid"), sysimgguid=_two(sysimgguid, "--sysimgguid"),
             portguid=port3)  # fmt: skip
    except CacheError as exc:
        raise click.ClickException(f"loading original cached fabric failed: {exc}"
                                   if "found" not in str(exc) else str(exc)) from exc
    try:
        new.write_bytes(cache.dumps())
    except OSError as exc:
        raise click.ClickException(f"caching new cache data failed: {exc.strerror}") from exc
