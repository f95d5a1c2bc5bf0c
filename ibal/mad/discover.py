"""Fabric discovery by directed route, as a sans-IO engine, and ibnetdiscover's text format.

:class:`Sweep` is the engine: :meth:`Sweep.start` gives the first SMP to
send (NodeInfo of the local port), :meth:`Sweep.answer` takes one SMP's
answer (the 64-byte attribute data, or ``None`` when it failed) and gives the
SMPs that follow from it, as :class:`Query` records (attribute, modifier,
directed-route path).  The engine never sends, waits or reads a clock: any
number of its queries may be in flight, answered in any order.
:attr:`Sweep.topology` is the :class:`Topology` found so far.

What it asks, per node, the first time a NodeInfo names its GUID:
NodeDescription; PortInfo of the port it was reached through (CAs,
routers) or of every port 0..N (switches, port 0 giving the switch's LID),
and SwitchInfo (switches: enhanced port 0).  From a switch port whose link
is up and whose far end is not yet known it asks NodeInfo one hop further
(the local CA: through its own port).  A NodeInfo naming a known GUID only
records the link, so loops and parallel paths visit each node once.

:func:`sweep` is the thin I/O layer over a :class:`~ibal.mad.rpc.MadClient`
(a window of SMPs in flight).  :func:`ibnetdiscover_text` prints a topology
as ``ibnetdiscover`` does; :func:`parse_ibnetdiscover` reads that text back
(nodes, ports and links) so two tools' outputs can be compared as topologies.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ibal.records import record
from ibal.wire.mad import smp
from ibal.wire.mad.consts import DR_DIRECTION, SmpAttr

__all__ = [
    "DiscNode",
    "DiscPort",
    "Query",
    "Sweep",
    "Topology",
    "ibnetdiscover_text",
    "parse_ibnetdiscover",
    "sweep",
]

MAX_HOPS: Final = 63
CAP_EXT_SPEEDS: Final = int(smp.CapabilityMask.IS_EXTENDED_SPEEDS_SUPPORTED)


def _index(table: Any, *names: str) -> tuple[int, ...]:
    return tuple(table.names.index(n) for n in names)


def _getter(table: Any, *names: str) -> Callable[[Any], tuple[Any, ...]]:
    """The named fields of ``table``'s unpacked tuple, picked in one C call."""
    return operator.itemgetter(*_index(table, *names))


_NI = _getter(smp.NODE_INFO, "node_type", "num_ports", "system_image_guid", "node_guid",
              "port_guid", "device_id", "revision", "local_port_num", "vendor_id")  # fmt: skip
_PI = _getter(smp.PORT_INFO, "lid", "lmc", "capability_mask", "link_width_active",
              "link_speed_active", "link_speed_ext_active", "port_state",
              "port_phys_state")  # fmt: skip
_SI_ENH0 = _index(smp.SWITCH_INFO, "enhanced_port0")[0]
_unpack_ni = smp.NODE_INFO.unpack
_unpack_pi = smp.PORT_INFO.unpack
_unpack_si = smp.SWITCH_INFO.unpack
_Data = bytes | bytearray | memoryview


@record
class DiscPort:
    """One port as discovered: its PortInfo highlights and the far end of its link."""

    num: int
    guid: int = 0
    lid: int = 0
    lmc: int = 0
    capmask: int = 0
    width: int = 0
    speed: int = 0
    ext_speed: int = 0
    state: int = 0
    phys_state: int = 0
    remote: tuple[int, int] | None = None  # (node GUID, port number)


@record
class DiscNode:
    """One node: its NodeInfo, description, the DR path it was first reached by, its ports."""

    guid: int
    node_type: int
    num_ports: int
    system_guid: int
    port_guid: int
    vendor_id: int
    device_id: int
    revision: int
    path: tuple[int, ...]
    desc: str = ""
    enhanced_port0: bool = False
    ports: dict[int, DiscPort] = field(default_factory=dict)

    @property
    def is_switch(self) -> bool:
        return self.node_type == smp.NodeType.SWITCH

    @property
    def lid(self) -> int:
        """A switch's LID (its port 0); a CA's first port's."""
        p = self.ports.get(0) if self.is_switch else next(iter(self.ports.values()), None)
        return p.lid if p is not None else 0


@dataclass
class Topology:
    """Nodes by GUID, in the order they were found; ``root`` is the local node."""

    nodes: dict[int, DiscNode] = field(default_factory=dict)
    root: int | None = None

    def links(self) -> set[frozenset[tuple[int, int]]]:
        """Each link once, as the pair of its ends ``(node GUID, port)``."""
        out = set()
        for n in self.nodes.values():
            for p in n.ports.values():
                if p.remote is not None:
                    out.add(frozenset(((n.guid, p.num), p.remote)))
        return out


@record(frozen=True)
class Query:
    """One SMP the engine wants: SubnGet(attr, mod) along ``path``.

    ``node`` is the GUID the answer is about (0 for a NodeInfo, which finds
    it out); ``via`` the (node GUID, port) a NodeInfo was sent out of.
    """

    attr: int
    mod: int
    path: tuple[int, ...]
    node: int = 0
    via: tuple[int, int] | None = None


class Sweep:
    """The discovery engine (see the module docstring)."""

    def __init__(self, *, max_hops: int = MAX_HOPS) -> None:
        self.topology = Topology()
        self.max_hops = max_hops
        self.pending = 0
        """Queries handed out and not yet answered."""
        self.failed: list[Query] = []
        """Queries answered with ``None`` (no answer or an error status)."""
        self.asked = 0

    @property
    def done(self) -> bool:
        return self.pending == 0 and self.asked > 0

    def start(self) -> list[Query]:
        """The first query: NodeInfo of the local port (path ``0``)."""
        return self._out([Query(SmpAttr.NODE_INFO, 0, ())])

    def _out(self, qs: list[Query]) -> list[Query]:
        self.pending += len(qs)
        self.asked += len(qs)
        return qs

    def answer(self, q: Query, data: bytes | bytearray | memoryview | None) -> list[Query]:
        """Take the answer to ``q`` (its 64-byte data, or ``None``); the queries it leads to."""
        self.pending -= 1
        if data is None:
            self.failed.append(q)
            return []
        if q.attr == SmpAttr.NODE_INFO:
            return self._out(self._node_info(q, data))
        node = self.topology.nodes.get(q.node)
        if node is None:
            return []
        if q.attr == SmpAttr.PORT_INFO:
            return self._out(self._port_info(q, node, data))
        if q.attr == SmpAttr.NODE_DESC:
            node.desc = bytes(data[:64]).split(b"\0", 1)[0].decode("utf-8", "replace")
        elif q.attr == SmpAttr.SWITCH_INFO:
            node.enhanced_port0 = bool(_unpack_si(data)[_SI_ENH0])
        return []

    def _node_info(self, q: Query, data: _Data) -> list[Query]:
        ntype, nports, sysguid, guid, pguid, dev, rev, lport, vendor = _NI(_unpack_ni(data))
        nodes = self.topology.nodes
        node = nodes.get(guid)
        out: list[Query] = []
        path = q.path
        if node is None:
            node = DiscNode(guid, ntype, nports, sysguid, pguid, vendor, dev, rev, path)
            nodes[guid] = node
            if self.topology.root is None:
                self.topology.root = guid
            out.append(Query(SmpAttr.NODE_DESC, 0, path, guid))
            if node.is_switch:
                out.append(Query(SmpAttr.SWITCH_INFO, 0, path, guid))
                for p in range(nports + 1):
                    node.ports[p] = DiscPort(p, pguid)
                    out.append(Query(SmpAttr.PORT_INFO, p, path, guid))
        if not node.is_switch and lport not in node.ports:
            node.ports[lport] = DiscPort(lport, pguid)
            out.append(Query(SmpAttr.PORT_INFO, lport, path, guid))
        port = node.ports.get(lport)
        if q.via is not None and port is not None:
            port.remote = q.via
            far = nodes[q.via[0]].ports.get(q.via[1])
            if far is not None:
                far.remote = (guid, lport)
        return out

    def _port_info(self, q: Query, node: DiscNode, data: _Data) -> list[Query]:
        port = node.ports.get(q.mod)
        if port is None:
            return []
        (port.lid, port.lmc, port.capmask, port.width, port.speed, port.ext_speed, port.state,
         port.phys_state) = _PI(_unpack_pi(data))  # fmt: skip
        if port.remote is not None or port.state <= smp.PortState.DOWN or q.mod == 0:
            return []
        if node.is_switch:
            path = (*q.path, q.mod)
        elif not q.path and node.guid == self.topology.root:
            path = (q.mod,)  # the local CA: out through its own port
        else:
            return []  # CAs do not forward directed-route SMPs
        if len(path) > self.max_hops:
            return []
        return [Query(SmpAttr.NODE_INFO, 0, path, 0, (node.guid, q.mod))]


# ---------------------------------------------------------------- the I/O layer


def sweep(
    client: Any,
    *,
    window: int = 64,
    max_hops: int = MAX_HOPS,
    progress: Callable[[Sweep, int], None] | None = None,
) -> Sweep:
    """Discover the fabric through ``client`` (a :class:`~ibal.mad.rpc.MadClient`).

    At most ``window`` SMPs are in flight; the engine runs where the answers
    arrive (:meth:`~ibal.mad.rpc.MadClient.drive`).  ``progress(engine,
    in_flight)`` is called on the caller's thread about every 0.1 s and at the
    end.  Returns the engine (its ``topology`` and ``failed`` queries).
    """
    from ibal.mad.rpc import PortId, Reply, Request
    from ibal.wire.mad.consts import Method, MgmtClass

    if window < 1:
        raise ValueError("window must be at least 1")
    engine = Sweep(max_hops=max_hops)
    answer = engine.answer
    dr, get = int(MgmtClass.SUBN_DR), int(Method.GET)
    ports: dict[tuple[int, ...], PortId] = {}  # a node's queries share its path

    def requests(qs: list[Query]) -> list[Request]:
        out = []
        for q in qs:
            to = ports.get(q.path)
            if to is None:
                to = ports[q.path] = PortId(dr_path=q.path)
            out.append(Request(dr, get, q.attr, to, q.mod, b"", 0, q))
        return out

    def on_reply(rep: Reply) -> list[Request]:
        mad = rep.mad
        data = None
        # a DR SMP's status without its D bit; its data is bytes 64..127
        if mad is not None and not int.from_bytes(mad[4:6], "big") & ~DR_DIRECTION:
            data = memoryview(mad)[64:128]
        return requests(answer(rep.request.context, data))

    tick = None if progress is None else lambda: progress(engine, client.outstanding)
    client.drive(requests(engine.start()), on_reply, window=window, tick=tick)
    if progress is not None:
        progress(engine, client.outstanding)
    return engine


# ---------------------------------------------------------------- ibnetdiscover's text

_TYPE_LETTER = {1: "H", 2: "S", 3: "R"}


def _name(n: DiscNode) -> str:
    return f'"{_TYPE_LETTER.get(n.node_type, "?")}-{n.guid:016x}"'


def _clean(desc: str) -> str:
    if desc.isprintable():  # nearly always: no per-character pass
        return desc
    return "".join(c if c.isprintable() else " " for c in desc)


_SPEED = {1: "SDR", 2: "DDR", 4: "QDR"}
_EXT = {1: "FDR", 2: "EDR", 4: "HDR", 8: "NDR"}
_WIDTH = {1: "1x", 2: "4x", 4: "8x", 8: "12x", 16: "2x"}


def _rate(port: DiscPort, capmask: int) -> str:
    espeed = port.ext_speed if capmask & CAP_EXT_SPEEDS else 0
    width = _WIDTH.get(port.width, "??")
    if port.speed != 4 and not espeed:
        return width + _SPEED.get(port.speed, "???")
    if espeed == 0:
        return width + _SPEED.get(port.speed, "???")
    return width + _EXT.get(espeed, "???")


def _ids(n: DiscNode) -> list[str]:
    out = ["", f"vendid=0x{n.vendor_id:x}", f"devid=0x{n.device_id:x}"]
    if n.system_guid:
        out.append(f"sysimgguid=0x{n.system_guid:x}")
    return out


def _remote_lid(topo: Topology, guid: int, port: int) -> int:
    far = topo.nodes[guid]
    if far.is_switch:
        return far.lid
    p = far.ports.get(port)
    return p.lid if p is not None else 0


def _named(n: DiscNode, names: Mapping[int, str] | None) -> str:
    """A node as a node-name-map names it (``names``: by node GUID), else its description."""
    if names and n.guid in names:
        return names[n.guid]
    return _clean(n.desc)


def _lines(topo: Topology, names: Mapping[int, str] | None = None) -> Iterator[str]:
    nodes = topo.nodes
    # each node is named and described once per link end: format those once
    name = {g: _name(n) for g, n in nodes.items()}
    desc = {g: _named(n, names) for g, n in nodes.items()}
    switches = [n for n in nodes.values() if n.is_switch]
    cas = [n for n in nodes.values() if n.node_type == smp.NodeType.CA]
    routers = [n for n in nodes.values() if n.node_type == smp.NodeType.ROUTER]
    # ibnetdiscover lists each kind newest first (its lists are built by prepending)
    for n in reversed(switches):
        port0 = n.ports.get(0)
        yield from _ids(n)
        yield f"switchguid=0x{n.guid:x}({n.port_guid:x})"
        kind = "enhanced" if n.enhanced_port0 else "base"
        lid, lmc = (port0.lid, port0.lmc) if port0 else (0, 0)
        yield (f"Switch\t{n.num_ports} {name[n.guid]}\t\t# \"{desc[n.guid]}\" {kind} port 0 "
               f"lid {lid} lmc {lmc}")  # fmt: skip
        capmask = port0.capmask if port0 else 0
        for pn in range(1, n.num_ports + 1):
            p = n.ports.get(pn)
            if p is None or p.remote is None:
                continue
            far = nodes[p.remote[0]]
            line = f"[{pn}]\t{name[far.guid]}[{p.remote[1]}]"
            if not far.is_switch:
                line += f"({far.ports[p.remote[1]].guid:x}) "
            rlid = _remote_lid(topo, *p.remote)
            yield line + f"\t\t# \"{desc[far.guid]}\" lid {rlid} {_rate(p, capmask)}"
    for n in (*reversed(cas), *reversed(routers)):
        yield from _ids(n)
        yield f"{'ca' if n.node_type == smp.NodeType.CA else 'rt'}guid=0x{n.guid:x}"
        kind = "Ca" if n.node_type == smp.NodeType.CA else "Rt"
        # ibnetdiscover's CA and router lines keep the description (not remapped)
        yield f"{kind}\t{n.num_ports} {name[n.guid]}\t\t# \"{_clean(n.desc)}\""
        for pn in range(1, n.num_ports + 1):
            p = n.ports.get(pn)
            if p is None or p.remote is None:
                continue
            far = nodes[p.remote[0]]
            line = f"[{pn}]({p.guid:x}) \t{name[far.guid]}[{p.remote[1]}]"
            if not far.is_switch:
                line += f" ({far.ports[p.remote[1]].guid:x}) "
            rlid = _remote_lid(topo, *p.remote)
            yield (line + f"\t\t# lid {p.lid} lmc {p.lmc} \"{desc[far.guid]}\" lid {rlid} "
                   f"{_rate(p, p.capmask)}")  # fmt: skip


def ibnetdiscover_text(topo: Topology, generated: str, *, group: bool = False,
                       names: Mapping[int, str] | None = None) -> str:  # fmt: skip
    """``topo`` as ``ibnetdiscover`` prints it; ``generated`` is the ctime() date it shows;
    ``names``: a node-name-map's names by node GUID, where ibnetdiscover uses them.

    ``group`` (``-g``): the grouped layout.  Chassis are not recognised (ibnetdiscover
    knows some vendors' chassis by their GUIDs), so every node is a non-chassis one.
    """
    root = topo.nodes[topo.root] if topo.root is not None else None
    head = ["#", f"# Topology file: generated on {generated}", "#"]
    if root is not None:
        head.append(f"# Initiated from node {root.guid:016x} port {root.port_guid:016x}")
    body: Iterable[str] = _lines(topo, names)
    if group:
        # no chassis type or slot to name after a switch's GUIDs: the comment stays empty
        head += ["", "Non-Chassis Nodes"]
        body = (ln + "\t# " if ln.startswith("switchguid=") else ln for ln in body)
    return "".join(line + "\n" for line in (*head, *body))


_KIND = {1: ("Ca", "CA", "Channel Adapter"), 2: ("Switch", "SW", "Switch"),
         3: ("Router", "RT", "Router")}  # fmt: skip


def _by_type(topo: Topology, node_type: int) -> list[DiscNode]:
    """ibnetdiscover's list of one node type: newest first."""
    return [n for n in reversed(topo.nodes.values()) if n.node_type == node_type]


def ibnetdiscover_list(topo: Topology, node_types: Iterable[int],
                       names: Mapping[int, str] | None = None) -> str:  # fmt: skip
    """``ibnetdiscover -l`` (CAs, switches, routers), ``-H``, ``-S`` or ``-R``: one line
    per node of ``node_types`` (``smp.NodeType`` values), in that type order."""
    lines = []
    for t in node_types:
        for n in _by_type(topo, t):
            ids = f"devid 0x{n.device_id:x} vendid 0x{n.vendor_id:x}"
            lines.append(f"{_KIND[t][0]}\t : 0x{n.guid:016x} ports {n.num_ports} {ids} "
                         f"\"{_named(n, names)}\"")  # fmt: skip
    return "".join(line + "\n" for line in lines)


def _port_rate(node: DiscNode, port: DiscPort) -> str:
    """``-p``'s width and speed: a switch port's speed needs its port 0's CapabilityMask."""
    info = node.ports.get(0) if node.is_switch else port
    if info is None:
        return f"{_WIDTH.get(0, '??')} {_SPEED.get(0, '???')}"
    espeed = port.ext_speed if info.capmask & CAP_EXT_SPEEDS else 0
    if port.speed != 4 and not espeed:
        speed = _SPEED.get(port.speed, "???")
    elif espeed == 0:
        speed = _SPEED.get(port.speed, "???")  # FDR10 needs Mellanox's ExtPortInfo: not read
    else:
        speed = _EXT.get(espeed, "???")
    return f"{_WIDTH.get(port.width, '??')} {speed}"


def ibnetdiscover_ports(topo: Topology, names: Mapping[int, str] | None = None) -> str:
    """``ibnetdiscover -p``: every port the sweep read, node by node (newest first), each
    node's ports from the last to 1, with the port at the far end of its link."""
    nodes = topo.nodes
    out = []
    for n in reversed(nodes.values()):
        for num in range(n.num_ports, 0, -1):
            p = n.ports.get(num)
            if p is None:
                continue
            lid = n.lid if n.is_switch else p.lid
            line = (f"{_KIND.get(n.node_type, ('', '??'))[1]:>2} {lid:5d} {num:2d} "
                    f"0x{p.guid:016x} {_port_rate(n, p)}")  # fmt: skip
            if p.remote is None:
                out.append(f"{line}{'':36s}'{_named(n, names)}'")
                continue
            far = nodes[p.remote[0]]
            fp = far.ports.get(p.remote[1])
            flid = far.lid if far.is_switch else (fp.lid if fp else 0)
            out.append(f"{line} - {_KIND.get(far.node_type, ('', '??'))[1]:>2} {flid:5d} "
                       f"{p.remote[1]:2d} 0x{fp.guid if fp else 0:016x} "
                       f"( '{_named(n, names)}' - '{_named(far, names)}' )")  # fmt: skip
    return "".join(line + "\n" for line in out)


def ibnetdiscover_show(topo: Topology) -> str:
    """``ibnetdiscover -s``'s lines: each node as its first NodeInfo answer found it
    (directed route, type, GUID, the port it was entered by; LIDs and description not
    read yet).  ibnetdiscover also prints a "known" line for every further answer of a
    node already found; those depend on the order answers arrive and are left out."""
    out = []
    for n in topo.nodes.values():
        path = ",".join(["0", *map(str, n.path)])
        kind = _KIND[n.node_type][2] if n.node_type in _KIND else f"?({n.node_type})"
        port = 0 if n.is_switch else next(iter(n.ports), 0)
        out.append(f'DR path slid 0; dlid 0; {path} -> new {kind} {{{n.guid:016x}}} '
                   f'portnum {port} lid 0-0 ""')  # fmt: skip
    return "".join(line + "\n" for line in out)


# ---------------------------------------------------------------- reading it back

# Patterns, compiled (and cached by re) when a topology is read back, not at import.
_NODE_LINE = r'^(Switch|Ca|Rt)\t(\d+) "([SHR])-([0-9a-f]+)"\t\t# "(.*?)"(.*)$'
_SW_TAIL = r" (base|enhanced) port 0 lid (\d+) lmc (\d+)$"
_PORT_LINE = (
    r'^\[(\d+)\](?:\(([0-9a-f]+)\) )?\t"([SHR])-([0-9a-f]+)"\[(\d+)\](?: ?\(([0-9a-f]+)\) )?'
    r'\t\t# (?:lid (\d+) lmc (\d+) )?"(.*?)" lid (\d+) (\S+)$'
)


def parse_ibnetdiscover(text: str) -> dict[str, Any]:
    """ibnetdiscover's topology text as data, for comparisons.

    ``{"nodes": {guid: {"type", "ports", "desc", "sysimgguid", "vendid", "devid",
    "lid"}}, "ports": {(guid, port): {"guid", "lid", "rate", "remote"}},
    "links": {frozenset of the two (guid, port) ends}}``.  A switch's ``lid``
    is its port 0's; a CA's is ``None`` (its ports carry theirs).
    """
    nodes: dict[int, dict[str, Any]] = {}
    ports: dict[tuple[int, int], dict[str, Any]] = {}
    ids: dict[str, int] = {}
    cur: int | None = None
    node_line, sw_tail = re.compile(_NODE_LINE), re.compile(_SW_TAIL)
    port_line = re.compile(_PORT_LINE)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, eq, val = line.partition("=")
        if eq and key in ("vendid", "devid", "sysimgguid"):
            ids[key] = int(val.split()[0].split("(")[0], 16)
            continue
        if eq and key.endswith("guid"):
            continue
        m = node_line.match(line)
        if m:
            cur = int(m.group(4), 16)
            sw = sw_tail.search(m.group(6))
            nodes[cur] = {
                "type": m.group(1), "ports": int(m.group(2)), "desc": m.group(5),
                "sysimgguid": ids.get("sysimgguid", 0), "vendid": ids.get("vendid"),
                "devid": ids.get("devid"), "lid": int(sw.group(2)) if sw else None,
            }  # fmt: skip
            ids = {}
            continue
        m = port_line.match(line)
        if m and cur is not None:
            num, far = int(m.group(1)), (int(m.group(4), 16), int(m.group(5)))
            ports[(cur, num)] = {
                "guid": int(m.group(2), 16) if m.group(2) else None,
                "lid": int(m.group(7)) if m.group(7) else None,
                "rate": m.group(11), "remote": far, "remote_lid": int(m.group(10)),
            }  # fmt: skip
            continue
        raise ValueError(f"not an ibnetdiscover topology line: {line!r}")
    links = {frozenset((end, p["remote"])) for end, p in ports.items()}
    return {"nodes": nodes, "ports": ports, "links": links}
