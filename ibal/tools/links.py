"""``ibal iblinkinfo``: every link of the fabric, both ends, as infiniband-diags prints it.

A directed-route sweep (:func:`ibal.mad.discover.sweep`), then each port's
whole PortInfo (widths and speeds supported, HOQ life, VL stall count), many
in flight: :func:`read_links`.  :func:`iblinkinfo_text` is the C tool's layout
(nodes newest first, as libibnetdisc lists them; "Could be" when both ends
support more than the link runs at).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import click

from ibal.mad.discover import DiscNode, Topology, sweep
from ibal.mad.rpc import MadClient, MadError, PortId, smp_request
from ibal.records import record
from ibal.tools.cliopts import node_name_map_option
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["DIFF_CHECKS", "Fabric", "diff_checks", "iblinkinfo_cmd", "iblinkinfo_diff",
           "iblinkinfo_json", "iblinkinfo_text", "link_text", "load_fabric", "port_lid",
           "read_links", "remote_text"]  # fmt: skip

_CAP_EXT_SPEEDS: Final = int(smp.CapabilityMask.IS_EXTENDED_SPEEDS_SUPPORTED)
_DOWN: Final = 1
_TYPE: Final = {1: "CA", 2: "Switch", 3: "Router"}


@record
class Fabric:
    """A topology and every discovered port's PortInfo, by (node GUID, port)."""

    topology: Topology
    info: dict[tuple[int, int], dict[str, Any]]

    def nodes(self) -> list[DiscNode]:
        """libibnetdisc's order: the last found first."""
        return list(reversed(self.topology.nodes.values()))

    def port0(self, node: DiscNode) -> dict[str, Any] | None:
        return self.info.get((node.guid, 0)) if node.is_switch else None

    def capmask(self, node: DiscNode, port: int) -> int:
        """A switch's ports carry their node's port-0 CapabilityMask."""
        pi = self.port0(node) if node.is_switch else self.info.get((node.guid, port))
        return int(pi["capability_mask"]) if pi else 0


def load_fabric(path: Path, why: str = "loading cached fabric failed") -> Fabric:
    """A cache file's fabric: its topology and the PortInfo it keeps of every port."""
    from ibal.tools.cache import CacheError, load, to_topology

    try:
        cache = load(path)
    except CacheError as exc:
        raise click.ClickException(f"{why}: {exc}") from exc
    info = {(n.guid, p.num): dict(smp.PORT_INFO.decode(p.info)) for n in cache.nodes
            for p in n.ports}  # fmt: skip
    return Fabric(to_topology(cache), info)


def read_links(client: MadClient, *, window: int = 64) -> Fabric:
    """Sweep the fabric, then read the PortInfo of every port found."""
    engine = sweep(client, window=window)
    topo = engine.topology
    if topo.root is None:
        raise MadError("discover failed: the local port did not answer NodeInfo")
    keys = [(n.guid, p) for n in topo.nodes.values() for p in sorted(n.ports)]
    reqs = [smp_request(SmpAttr.PORT_INFO, PortId(dr_path=topo.nodes[g].path), p)
            for g, p in keys]  # fmt: skip
    info = {}
    for key, rep in zip(keys, client.call_many(reqs, window=window), strict=True):
        if rep.ok:
            info[key] = dict(smp.PORT_INFO.decode(rep.data))
    return Fabric(topo, info)


def _style(name: str, value: int) -> str:
    from ibal.wire.mad import dump

    return dump.STYLES[name](value)


def _max_width(v: int) -> int:
    """The widest width of a LinkWidthSupported mask (12X, 8X, 4X, 2X, else 1X)."""
    for bit in (8, 4, 2, 16):
        if v & bit:
            return bit
    return 1


def _top_bit(v: int) -> int:
    return 1 << (v.bit_length() - 1) if v else 1


def _could_be(fab: Fabric, node: DiscNode, pn: int, far: DiscNode, fpn: int) -> tuple[str, str]:
    """The "Could be" width and speed of a link, from both ends' PortInfo."""
    me, them = fab.info.get((node.guid, pn)), fab.info.get((far.guid, fpn))
    if me is None or them is None:
        return "", ""
    width = speed = ""
    mw = _max_width(int(me["link_width_supported"]) & int(them["link_width_supported"]))
    if not mw & int(me["link_width_active"]):
        width = f"Could be {_style('linkwidth', mw)}"
    ext = (fab.capmask(node, pn) & fab.capmask(far, fpn) & _CAP_EXT_SPEEDS
           and me["link_speed_ext_supported"] and them["link_speed_ext_supported"])  # fmt: skip
    if ext:
        ms = _top_bit(int(me["link_speed_ext_supported"]) & int(them["link_speed_ext_supported"]))
        if not ms & int(me["link_speed_ext_active"]):
            speed = f"Could be {_style('linkspeedext', ms)}"
        return width, speed
    ms = _top_bit(int(me["link_speed_supported"]) & int(them["link_speed_supported"]))
    if not ms & int(me["link_speed_active"]):
        speed = f"Could be {_style('linkspeed', ms)}"
    return width, speed


def link_text(fab: Fabric, node: DiscNode, pn: int, pi: dict[str, Any], extra: bool) -> str:
    """The ``(4X 2.5 Gbps Active/  LinkUp)`` part of a port's line."""
    state, phys = int(pi["port_state"]), int(pi["port_phys_state"])
    st, ph = _style("portstate", state), _style("physportstate", phys)
    if state == _DOWN:  # C14-24.2.1: only the states are valid on a down port
        return f"(              {st:>6s}/{ph:>8s})"
    esp = int(pi["link_speed_ext_active"]) if fab.capmask(node, pn) & _CAP_EXT_SPEEDS else 0
    speed = _style("linkspeedext", esp) if esp else _style("linkspeed",
                                                           int(pi["link_speed_active"]))
    width = _style("linkwidth", int(pi["link_width_active"]))
    text = f"({width:>3s} {speed:>18s} {st:>6s}/{ph:>8s})"
    if extra:
        text += f" (HOQ:{int(pi['hoq_life'])} VL_Stall:{int(pi['vl_stall_count'])})"
    return text


def port_lid(node: DiscNode, pn: int) -> int:
    """A port's LID as the tools show it: a switch's ports show the switch's."""
    if node.is_switch:
        return node.lid
    p = node.ports.get(pn)
    return p.lid if p else 0


def remote_text(fab: Fabric, node: DiscNode, pn: int, *, with_guid: bool) -> str:
    """What is at the far end of a port's link (``with_guid``: its port GUID first)."""
    port = node.ports[pn]
    pi = fab.info[(node.guid, pn)]
    if port.remote is not None:
        far = fab.topology.nodes[port.remote[0]]
        fpn = port.remote[1]
        fport = far.ports.get(fpn)
        width, speed = _could_be(fab, node, pn, far, fpn)
        rguid = f"0x{fport.guid if fport else 0:016x} " if with_guid else ""
        return (f"{rguid}{port_lid(far, fpn):6d} {fpn:4d}[  ] \"{far.desc}\" "
                f"({width} {speed})")  # fmt: skip
    if int(pi["port_state"]) == _DOWN:
        return '           [  ] "" ( )'
    return '    "Port not available"'


def _port_line(fab: Fabric, node: DiscNode, pn: int, *, line_mode: bool, extra: bool,
               prefix: str = "", filter_down: Fabric | None = None) -> str:  # fmt: skip
    port = node.ports[pn]
    pi = fab.info.get((node.guid, pn))
    if pi is None:
        return ""
    if filter_down is not None and int(pi["port_state"]) == _DOWN and _was_down(filter_down,
                                                                               node, pn):
        return ""
    link = link_text(fab, node, pn, pi, extra)
    remote = remote_text(fab, node, pn, with_guid=line_mode)
    if line_mode:
        head = f"{prefix}0x{port.guid:016x} \"{node.desc:>30s}\" "
    else:
        head = f"{prefix}      " + ("" if node.is_switch else f"0x{port.guid:016x} ")
    return f"{head}{port_lid(node, pn):6d} {pn:4d}[  ] =={link}==>  {remote}\n"


def _was_down(cached: Fabric, node: DiscNode, pn: int) -> bool:
    """``--filterdownports``: the cache has this node's port ``pn``, and it was down."""
    other = cached.topology.nodes.get(node.guid)
    if other is None or pn > other.num_ports or pn not in other.ports:
        return False
    pi = cached.info.get((node.guid, pn))
    return pi is not None and int(pi["port_state"]) == _DOWN


def _ports(node: DiscNode) -> Iterator[int]:
    return (p for p in range(1, node.num_ports + 1) if p in node.ports)


def _header(node: DiscNode, prefix: str = "") -> str:
    if node.is_switch:
        p0 = node.ports.get(0)
        pg = p0.guid if p0 and p0.guid else node.port_guid
        return f"{prefix}Switch: 0x{pg:016x} {node.desc}:\n"
    return f"{prefix}{_TYPE.get(node.node_type, '??')}: {node.desc}:\n"


def _node_text(fab: Fabric, node: DiscNode, *, down_only: bool, line_mode: bool, extra: bool,
               prefix: str = "", filter_down: Fabric | None = None) -> str:  # fmt: skip
    out = []
    head = False
    for pn in _ports(node):
        pi = fab.info.get((node.guid, pn))
        if down_only and (pi is None or int(pi["port_state"]) != _DOWN):
            continue
        if not head and not line_mode:
            out.append(_header(node, prefix))
            head = True
        out.append(_port_line(fab, node, pn, line_mode=line_mode, extra=extra, prefix=prefix,
                              filter_down=filter_down))  # fmt: skip
    return "".join(out)


def iblinkinfo_text(fab: Fabric, nodes: Iterable[DiscNode], *, down_only: bool = False,
                    line_mode: bool = False, extra: bool = False,
                    filter_down: Fabric | None = None) -> str:  # fmt: skip
    """iblinkinfo's text for ``nodes`` (``-d``: down ports only; ``-l``: one line each;
    ``-p``: HOQ life and VL stall count; ``filter_down``: ``--filterdownports``' cached
    fabric, whose down ports are left out while they stay down)."""
    return "".join(_node_text(fab, n, down_only=down_only, line_mode=line_mode, extra=extra,
                              filter_down=filter_down) for n in nodes)  # fmt: skip


DIFF_CHECKS: Final = {"port": 1, "state": 2, "lid": 4, "nodedesc": 8}
_DIFF_DEFAULT: Final = 3  # port connections and port states


def diff_checks(text: str | None) -> int:
    """``--diffcheck``'s keys (any case, comma separated) as flags; ``ValueError(key)``."""
    if text is None:
        return _DIFF_DEFAULT
    flags = 0
    for key in (k for k in text.split(",") if k):
        if key.lower() not in DIFF_CHECKS:
            raise ValueError(key)
        flags |= DIFF_CHECKS[key.lower()]
    return flags


def _remote_port(fab: Fabric, node: DiscNode, pn: int) -> tuple[DiscNode, int, int] | None:
    """The far end of a port's link: its node, port number and port GUID."""
    p = node.ports.get(pn)
    if p is None or p.remote is None:
        return None
    far = fab.topology.nodes[p.remote[0]]
    fp = far.ports.get(p.remote[1])
    return far, p.remote[1], fp.guid if fp else 0


def _diff_one(n1: DiscNode, f1: Fabric, f2: Fabric, flags: int, p1: str, p2: str,
              opts: dict[str, Any]) -> str:  # fmt: skip
    """iblinkinfo's ``diff_node_iter``: node ``n1`` of ``f1`` against the same GUID in ``f2``."""
    n2 = f2.topology.nodes.get(n1.guid)
    if n2 is None:
        return _node_text(f1, n1, prefix=p1, **opts)
    if not flags:
        return ""
    out = []
    head = False
    if ((n1.is_switch and flags & 4 and n1.lid != n2.lid)
            or (flags & 8 and n1.desc != n2.desc)):  # fmt: skip
        # both headers, each with its side's mark (the C tool's print_node_header is
        # handed no header flag here, which it then writes through: not reproduced)
        if not opts["line_mode"]:
            out += [_header(n1, p1), _header(n2, p2)]
        head = True
    if n1.num_ports != n2.num_ports:
        if not head and not opts["line_mode"]:
            out.append(_header(n1))
        return "".join(out) + f"{p1}numports = {n1.num_ports}\n{p2}numports = {n2.num_ports}\n"
    line = {k: v for k, v in opts.items() if k != "down_only"}
    for pn in range(1, n1.num_ports + 1):
        a, b = pn in n1.ports, pn in n2.ports
        if not a and not b:
            continue
        diff = 0
        r1 = _remote_port(f1, n1, pn) if a else None
        r2 = _remote_port(f2, n2, pn) if b else None
        if flags & 1 and (a != b or (r1 is None) != (r2 is None)
                          or (r1 and r2 and r1[2] != r2[2])):  # fmt: skip
            diff += 1
        if flags & 2 and a and b:
            s1, s2 = (f.info.get((n.guid, pn), {}).get("port_state") for f, n in ((f1, n1),
                                                                               (f2, n2)))
            diff += s1 != s2
        if flags & 1 and r1 and r2:
            far1, far2 = r1[0], r2[0]
            if flags & 4 and far1.ports[r1[1]].lid != far2.ports[r2[1]].lid:
                diff += 1
            if flags & 8 and far1.desc != far2.desc:
                diff += 1
        if not diff:
            continue
        for n, f, pfx, there in ((n1, f1, p1, a), (n2, f2, p2, b)):
            if not there:
                continue
            if not head and not line["line_mode"]:
                out.append(_header(n1))
                head = True
            out.append(_port_line(f, n, pn, prefix=pfx, **line))
    return "".join(out)


def iblinkinfo_diff(orig: Fabric, new: Fabric, nodes: Iterable[DiscNode] | None, *,
                    flags: int = _DIFF_DEFAULT, only_type: int = 0, down_only: bool = False,
                    line_mode: bool = False, extra: bool = False,
                    filter_down: Fabric | None = None) -> str:  # fmt: skip
    """``iblinkinfo --diff``: what changed from the cached fabric ``orig`` to ``new``, ``<``
    the cache's lines, ``>`` the fabric's (``nodes``: the one node of ``-S``/``-D``, else
    every node, ``only_type`` of them).  As the C tool: each of ``orig``'s nodes is
    checked against ``new``, then each of ``new``'s only for being in ``orig``."""
    opts: dict[str, Any] = {"down_only": down_only, "line_mode": line_mode, "extra": extra,
                            "filter_down": filter_down}

    def every(fab: Fabric) -> list[DiscNode]:
        return [n for n in fab.nodes() if not only_type or n.node_type == only_type]

    # a -S/-D node is the new fabric's, and the C tool hands it to both passes
    first = list(nodes) if nodes is not None else every(orig)
    second = list(nodes) if nodes is not None else every(new)
    out = [_diff_one(n, orig if nodes is None else new, new, flags, "< ", "> ", opts)
           for n in first]  # fmt: skip
    out += [_diff_one(n, new, orig, 0, "> ", "< ", opts) for n in second]
    return "".join(out)


def iblinkinfo_json(fab: Fabric, nodes: Iterable[DiscNode]) -> dict[str, Any]:
    """The same ports as data (schema ``iblinkinfo.schema.json``)."""
    out = []
    for node in nodes:
        ports = []
        for pn in _ports(node):
            pi = fab.info.get((node.guid, pn))
            if pi is None:
                continue
            port = node.ports[pn]
            entry: dict[str, Any] = {
                "PortNum": pn, "PortGUID": guid(port.guid), "LID": port_lid(node, pn),
                "PortState": _style("portstate", int(pi["port_state"])),
                "PortPhysicalState": _style("physportstate", int(pi["port_phys_state"])),
                "LinkWidthActive": _style("linkwidth", int(pi["link_width_active"])),
                "LinkSpeedActive": _style("linkspeed", int(pi["link_speed_active"])),
                "LinkSpeedExtActive": _style("linkspeedext", int(pi["link_speed_ext_active"])),
                "LinkWidthSupported": int(pi["link_width_supported"]),
                "LinkSpeedSupported": int(pi["link_speed_supported"]),
                "HOQLife": int(pi["hoq_life"]), "VLStallCount": int(pi["vl_stall_count"]),
                "remote": None,
            }  # fmt: skip
            if port.remote is not None:
                far = fab.topology.nodes[port.remote[0]]
                fport = far.ports.get(port.remote[1])
                entry["remote"] = {"NodeGUID": guid(far.guid), "NodeDescription": far.desc,
                                   "PortNum": port.remote[1],
                                   "PortGUID": guid(fport.guid if fport else 0),
                                   "LID": port_lid(far, port.remote[1])}  # fmt: skip
            ports.append(entry)
        out.append({"NodeType": _TYPE.get(node.node_type, "??"), "NodeGUID": guid(node.guid),
                    "NodeDescription": node.desc, "NumPorts": node.num_ports,
                    "ports": ports})  # fmt: skip
    return {"nodes": out}


@click.command("iblinkinfo")
@click.option("-S", "--switch", "by_guid", metavar="GUID", help="Only the node of this port GUID.")
@click.option("-G", "--port-guid", "port_guid", metavar="GUID", help="Same as -S.")
@click.option("-D", "--Direct", "dr_path", metavar="DR_PATH", help="Only the node at DR_PATH.")
@click.option("-a", "--all", "all_nodes", is_flag=True,
              help="With -D: every node the partial scan found; with -S: every node.")
@click.option("-n", "--hops", "hops", type=click.IntRange(min=0), default=0,
              help="Hops to scan away from the -D node (default 1), or from here.")
@click.option("-d", "--down", "down_only", is_flag=True, help="Only down links.")
@click.option("-l", "--line", "line_mode", is_flag=True, help="One line per link.")
@click.option("-p", "--additional", is_flag=True, help="HOQ life and VL stall count too.")
@click.option("--switches-only", is_flag=True, help="Only switches.")
@click.option("--cas-only", is_flag=True, help="Only CAs.")
@click.option("--outstanding_smps", "window", type=int, default=64, show_default=True,
              help="SMPs in flight.")  # fmt: skip
@click.option("-R", "nop", is_flag=True, hidden=True)
@click.option("--load-cache", "load_cache", type=click.Path(path_type=Path),
              help="The fabric of this ibnetdiscover cache file (no sweep).")  # fmt: skip
@click.option("--diff", "diff_cache", type=click.Path(path_type=Path),
              help="Only what differs from this ibnetdiscover cache file (<: it, >: now).")
@click.option("--diffcheck", metavar="KEY,...",
              help="What --diff compares: port, state, lid, nodedesc [default: port,state].")
@click.option("--filterdownports", "filter_cache", type=click.Path(path_type=Path),
              help="Leave out the ports down in this ibnetdiscover cache and still down.")
@node_name_map_option
@fabric_options(via="agent")
def iblinkinfo_cmd(by_guid: str | None, port_guid: str | None, dr_path: str | None,
                   all_nodes: bool, hops: int, down_only: bool, line_mode: bool, additional: bool,
                   switches_only: bool, cas_only: bool, window: int, nop: bool,
                   load_cache: Path | None, diff_cache: Path | None, diffcheck: str | None,
                   filter_cache: Path | None, node_name_map: Path | None, as_json: bool,
                   **kw: Any) -> None:  # fmt: skip
    """iblinkinfo: every port of the fabric, its link and what is at the other end."""
    from ibal.tools import nodemap

    try:
        flags = diff_checks(diffcheck)
    except ValueError as exc:
        raise click.ClickException(f"invalid diff check key: {exc}") from None
    names = nodemap.load(node_name_map)
    diff = load_fabric(diff_cache, "loading cached fabric for diff failed") if diff_cache else None
    down = (load_fabric(filter_cache, "loading cached fabric for filterdownports failed")
            if filter_cache else None)  # fmt: skip
    label = by_guid or port_guid
    target = None
    if load_cache is not None:
        if dr_path is not None:
            raise click.ClickException("Cannot specify cache and direct route path")
        fab = load_fabric(load_cache)
    else:
        with fabric_client("iblinkinfo", kw) as client:
            if dr_path is not None or (hops and label is None):
                from ibal.mad.rpc import parse_dr_path
                from ibal.tools.hopscan import hop_scan

                start = parse_dr_path(dr_path) if dr_path is not None else ()
                # as the C tool: a -D scan goes one hop unless told
                fab = hop_scan(client, start, hops or (1 if dr_path is not None else 0),
                               window=window)  # fmt: skip
            else:
                fab = read_links(client, window=window)
            if dr_path is not None and not all_nodes:
                ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO,
                                                         PortId(dr_path=start)))
                target = int(ni["port_guid"])
    if label is not None and not all_nodes:
        target = int(label, 0)
    for f in (fab, diff, down):
        if f is not None:
            nodemap.apply(f.topology, names)
    nodes = fab.nodes()
    want = 2 if switches_only else 1 if cas_only else 0
    if target is not None:
        nodes = [n for n in nodes if n.port_guid == target or
                 any(p.guid == target for p in n.ports.values())][:1]  # fmt: skip
        if not nodes:
            raise click.ClickException(f"Failed to find port: {label or dr_path}")
    if want:
        nodes = [n for n in nodes if n.node_type == want]
    if as_json:
        emit_json(iblinkinfo_json(fab, nodes))
        return
    if diff is not None:
        click.echo(iblinkinfo_diff(diff, fab, nodes if target is not None else None,
                                   flags=flags, only_type=want, down_only=down_only,
                                   line_mode=line_mode, extra=additional, filter_down=down),
                   nl=False)  # fmt: skip
        return
    click.echo(iblinkinfo_text(fab, nodes, down_only=down_only, line_mode=line_mode,
                               extra=additional, filter_down=down), nl=False)  # fmt: skip
