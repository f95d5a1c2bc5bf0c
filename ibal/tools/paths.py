"""``ibal ibtracert``: the route from one port to another, hop by hop (``-m``: multicast).

As infiniband-diags' ``ibtracert``: from the source port, each switch's
LinearForwardingTable entry for the destination LID names the next out port;
each hop is reached by directed route from the source (LID routed to the
source, then directed: a path that starts anywhere in the subnet), and asked
its NodeInfo, NodeDescription and PortInfo.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import click

from ibal.mad.rpc import MadClient, MadError, PortId
from ibal.records import record
from ibal.tools.cliopts import node_name_map_option
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["Hop", "McHop", "ibtracert_cmd", "mcast_text", "partial_text", "port_pairs", "trace",
           "trace_mcast", "trace_text"]

MAX_HOPS: Final = 63
_TYPES: Final = {1: "ca", 2: "switch", 3: "router"}


@record
class Hop:
    """A node on the route, as reached: what its NodeInfo and PortInfo said."""

    node_guid: int
    node_type: int
    num_ports: int
    port_guid: int
    port_num: int
    lid: int
    lmc: int
    state: int
    desc: str
    out_port: int = 0  # the port of the previous hop that led here


def _printable(raw: bytes) -> str:
    text = raw.split(b"\0", 1)[0].decode("latin-1")
    return "".join(c if c.isprintable() else " " for c in text)


def _node(client: MadClient, to: PortId) -> Hop:
    ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO, to))
    nd = bytes(client.smp_get(SmpAttr.NODE_DESC, to))
    pi = smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, to, 0))
    return Hop(int(ni["node_guid"]), int(ni["node_type"]), int(ni["num_ports"]),
               int(ni["port_guid"]), int(ni["local_port_num"]), int(pi["lid"]), int(pi["lmc"]),
               int(pi["port_state"]), _printable(nd))  # fmt: skip


def _lookup(client: MadClient, to: PortId, hop: Hop, lid: int) -> int:
    """The switch's out port for ``lid`` (its LFT entry); ``MadError`` if it has none."""
    si = smp.SWITCH_INFO.decode(client.smp_get(SmpAttr.SWITCH_INFO, to))
    cap, top = int(si["linear_fdb_cap"]), int(si["linear_fdb_top"])
    out = -1
    if not (lid >= cap and lid > top):
        out = client.smp_get(SmpAttr.LINEAR_FT, to, lid // 64)[lid % 64]
    if out < 0 or out > hop.num_ports:
        raise MadError(f'Bad forwarding table entry found at: node "{hop.desc}" lid entry '
                       f"{lid} is {out} (top {top})")  # fmt: skip
    return out


def _inactive(hop: Hop) -> bool:
    # a switch's base port 0 counts as active
    return hop.state != 4 and hop.node_type != smp.NodeType.SWITCH


def _route(client: MadClient, base: tuple[int, ...], lid: int, target: Hop,
           force: bool = False,
           hops: list[Hop] | None = None) -> tuple[list[Hop], tuple[int, ...]]:  # fmt: skip
    """The hops from the node at DR path ``base`` to the port ``target`` (LID ``lid``),
    and the DR path of the last one (``force``: a port with the target's LID is it too).

    ``hops``: the list the hops go into as they are found (what was found before an
    error stays there)."""
    path = list(base)

    def same(h: Hop) -> bool:
        return h.port_guid == target.port_guid or (force and h.lid == target.lid)

    def at() -> PortId:
        return PortId(dr_path=tuple(path))

    first = hop = _node(client, at())
    if hops is None:
        hops = []
    hops.append(first)
    next_out = _lookup(client, at(), hop, lid) if hop.node_type == smp.NodeType.SWITCH else 0
    for _ in range(MAX_HOPS):
        if _inactive(hop):
            raise MadError(f'Bad port state found: node "{hop.desc}" port {hop.port_num} '
                           f"state {hop.state}")  # fmt: skip
        if same(hop):
            return hops, tuple(path)
        if hop.node_type == smp.NodeType.SWITCH:
            out = next_out
            path.append(out)
            nxt = _node(client, at())
            if out == 0:
                if not same(nxt):
                    raise MadError(f'Bad forwarding table entry found at: node "{hop.desc}" '
                                   f"lid entry {lid} is 0")  # fmt: skip
                return hops, tuple(path)
        else:
            out = hop.port_num
            if hop is not first:
                raise MadError(f"can't continue: reached CA or router port "
                               f"{hop.port_guid:x}, lid {hop.lid}")  # fmt: skip
            if path:  # a CA reached by directed route: back one hop, to its switch
                entered = path.pop()
                nxt = _node(client, at())
                nxt.port_num = entered
            else:
                path.append(out)
                nxt = _node(client, at())
        if nxt.node_type == smp.NodeType.SWITCH:
            next_out = _lookup(client, at(), nxt, lid)
        if _inactive(nxt):
            raise MadError(f'Bad out port state found: node "{hop.desc}" outport {out} '
                           f"state {nxt.state}")  # fmt: skip
        nxt.out_port = out
        hops.append(nxt)
        hop = nxt
    raise MadError(f"no route found after {MAX_HOPS} hops")


def trace(client: MadClient, src: PortId, dst: PortId, *, force: bool = False,
          hops: list[Hop] | None = None) -> list[Hop]:  # fmt: skip
    """The route from ``src`` to ``dst`` (LIDs or DR paths), source first.

    As ibtracert: a source given by LID is first found by following the route to it
    from the local port; every hop is then reached by directed route.  ``force``
    (``-f``): an end that does not answer is not the end of it: the route is followed
    to a port with the destination's LID.  ``hops``: as :func:`_route`'s, for the
    route from the source."""
    if src.directed:
        base = tuple(src.dr_path or ())
    else:
        _, base = _route(client, (), src.lid, _node(client, src))
    try:
        target = _node(client, dst)
    except MadError as exc:
        if not force:
            raise
        # as ibtracert -f: the destination stands for its LID alone
        print(f"ibtracert: can't reach the destination ({exc}); force: look for lid "
              f"{dst.lid}", file=sys.stderr)  # fmt: skip
        target = Hop(0, 0, 0, -1, 0, dst.lid, 0, 0, "")
    lid = target.lid if dst.directed else dst.lid
    return _route(client, base, lid, target, force, hops)[0]


def _end(prompt: str, h: Hop, brief: bool) -> str:
    port = 0 if h.node_type == smp.NodeType.SWITCH else h.port_num
    if brief:
        return f"{prompt} {{0x{h.node_guid:016x}}}[{port}]"
    return (f"{prompt} {_TYPES.get(h.node_type, '???')} {{0x{h.node_guid:016x}}} portnum {port} "
            f"lid {h.lid}-{h.lid + (1 << h.lmc) - 1} \"{h.desc}\"")  # fmt: skip


def trace_text(hops: list[Hop], *, brief: bool = False) -> str:
    """ibtracert's lines (``brief``: ``-n``, GUIDs and ports only)."""
    lines = [_end("From", hops[0], brief)]
    lines += _hop_lines(hops[1:], brief)
    lines.append(_end("To", hops[-1], brief))
    return "".join(line + "\n" for line in lines)


def _hop_lines(hops: list[Hop], brief: bool) -> list[str]:
    lines = []
    for h in hops:
        if brief:
            lines.append(f"[{h.out_port}] -> {{0x{h.port_guid:016x}}}[{h.port_num}]")
        else:
            lines.append(f"[{h.out_port}] -> {_TYPES.get(h.node_type, '???')} port "
                         f"{{0x{h.port_guid:016x}}}[{h.port_num}] lid "
                         f"{h.lid}-{h.lid + (1 << h.lmc) - 1} \"{h.desc}\"")  # fmt: skip
    return lines


def partial_text(hops: list[Hop], *, brief: bool = False) -> str:
    """What ibtracert has printed of a route when it fails: its start and the hops found
    (it prints each line as it goes)."""
    if not hops:
        return ""
    lines = [_end("From", hops[0], brief), *_hop_lines(hops[1:], brief)]
    return "".join(line + "\n" for line in lines)


@record
class McHop:
    """A node on a multicast route: how it was reached and where from."""

    hop: Hop
    path: tuple[int, ...]  # its DR path from the local port
    up: McHop | None = None  # the node it was reached from
    out_port: int = 0  # that node's port towards it
    up_port: int = 0  # its own port towards that node


def _mft_ports(client: MadClient, to: PortId, num_ports: int, mlid: int) -> set[int] | None:
    """The ports a switch forwards ``mlid`` to (its MulticastForwardingTable), None if the
    MLID is past its table."""
    si = smp.SWITCH_INFO.decode(client.smp_get(SmpAttr.SWITCH_INFO, to))
    off = mlid - 0xC000
    if off >= int(si["multicast_fdb_cap"]):
        return None
    ports = set()
    for pos in range((num_ports + 15) // 16):
        masks = smp.MULTICAST_FORWARDING_TABLE.unpack(
            client.smp_get(SmpAttr.MCAST_FT, to, (off // 32) | (pos << 28)))
        mask = int(masks[off % 32])
        ports |= {pos * 16 + bit for bit in range(16) if mask >> bit & 1}
    return ports


def trace_mcast(client: MadClient, src: PortId, dst: PortId, mlid: int) -> McHop:
    """``ibtracert -m MLID``: from the source (reached by its unicast route), breadth first
    over the switches' MulticastForwardingTable entries for ``mlid`` until the destination
    port; the destination's :class:`McHop` (``up`` leads back to the source)."""
    if src.directed:
        base = tuple(src.dr_path or ())
    else:
        _, base = _route(client, (), src.lid, _node(client, src))
    target = _node(client, dst).port_guid
    first = McHop(_node(client, PortId(dr_path=base)), base)
    if first.hop.port_guid == target:
        raise MadError("ibtracert from a port to itself is unsupported")
    seen = {first.hop.node_guid}
    level = [first]
    for _ in range(MAX_HOPS):
        nxt: list[McHop] = []
        for n in level:
            h = n.hop
            if h.node_type != smp.NodeType.SWITCH:
                if n is not first:
                    continue
                outs = {h.port_num}
            else:
                got = _mft_ports(client, PortId(dr_path=n.path), h.num_ports, mlid)
                if got is None:
                    continue
                outs = got
            for port in sorted(outs):
                if port == 0 or port == n.up_port:
                    continue
                if n.path and port == h.port_num and n is first:
                    # out of the port its DR path came in by: one step back along that path
                    path = n.path[:-1]
                else:
                    pi = smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO,
                                                             PortId(dr_path=n.path), port))
                    if int(pi["port_phys_state"]) != 5:  # LinkUp
                        continue
                    path = (*n.path, port)
                try:
                    far = _node(client, PortId(dr_path=path))
                except MadError:
                    continue
                up_port = n.path[-1] if len(path) < len(n.path) else far.port_num
                hop = McHop(far, path, n, port, up_port)
                if far.port_guid == target:
                    return hop
                if far.node_guid in seen:
                    continue
                seen.add(far.node_guid)
                nxt.append(hop)
        level = nxt
        if not level:
            break
    raise MadError("can't find a multicast route from src to dest")


def mcast_text(end: McHop, *, brief: bool = False) -> str:
    """ibtracert -m's lines, source first."""
    chain = []
    n: McHop | None = end
    while n is not None:
        chain.append(n)
        n = n.up
    chain.reverse()

    def ends(prompt: str, m: McHop) -> str:
        h = m.hop
        return (f"{prompt} {_TYPES.get(h.node_type, '???')} 0x{h.node_guid:x} port "
                f"{h.port_num} lid {h.lid}-{h.lid + (1 << h.lmc) - 1} \"{h.desc}\"")  # fmt: skip

    lines = [ends("From", chain[0])]
    for m in chain[1:]:
        h, kind = m.hop, _TYPES.get(m.hop.node_type, "???")
        if brief:
            lines.append(f"[{m.out_port}] -> {kind} {{0x{h.node_guid:016x}}}[{m.up_port}]")
        else:
            lines.append(f"[{m.out_port}] -> {kind} 0x{h.node_guid:x}[{m.up_port}] lid "
                         f"{h.lid} \"{h.desc}\"")  # fmt: skip
    lines.append(ends("To", end))
    return "".join(line + "\n" for line in lines)


def _json(hops: list[Hop]) -> dict[str, Any]:
    return {"hops": [{"NodeType": {1: "CA", 2: "Switch", 3: "Router"}.get(h.node_type, "??"),
                      "NodeGUID": guid(h.node_guid), "PortGUID": guid(h.port_guid),
                      "PortNum": h.port_num, "LID": h.lid, "LMC": h.lmc,
                      "NodeDescription": h.desc, "OutPort": h.out_port or None}
                     for h in hops]}  # fmt: skip


def _named(hops: list[Hop], names: dict[int, str] | None) -> list[Hop]:
    from ibal.tools import nodemap

    for h in hops:
        h.desc = nodemap.remap(names, h.node_guid, h.desc)
    return hops


_SPACE: Final = " \t\n\v\f\r"
_FGETS: Final = 79  # ibtracert reads the file through an 80-byte fgets buffer
_TOKEN: Final = 20  # and each end with sscanf's %20s


def _tokens(text: str) -> list[str]:
    """What ``sscanf("%20s %20s")`` takes of a line: at most two words of 20 characters
    (a longer word goes on as the next one)."""
    out: list[str] = []
    i = 0
    while len(out) < 2:
        while i < len(text) and text[i] in _SPACE:
            i += 1
        if i == len(text):
            break
        j = i
        while j < len(text) and j - i < _TOKEN and text[j] not in _SPACE:
            j += 1
        out.append(text[i:j])
        i = j
    return out


def port_pairs(text: str) -> Iterator[tuple[int, tuple[str, str] | None]]:
    """``--ports-file``'s pairs as ibtracert reads them: (line number, (src, dst)), or
    ``None`` for a line that is no pair; blank, all-space and ``#`` lines are skipped.
    A line is each fgets read, so a line longer than 79 characters counts as more."""
    pos = line = 0
    while pos < len(text):
        nl = text.find("\n", pos)
        end = min(len(text) if nl < 0 else nl + 1, pos + _FGETS)
        chunk, pos = text[pos:end], end
        line += 1
        body = chunk.split("\n", 1)[0]
        lead = body.lstrip(_SPACE)
        if not lead or lead.startswith("#"):
            continue
        words = _tokens(body)
        yield line, (words[0], words[1]) if len(words) == 2 else None


@click.command("ibtracert")
@click.argument("src", required=False)
@click.argument("dst", required=False)
@click.option("-n", "--no_info", "brief", is_flag=True, help="GUIDs and ports only.")
@click.option("-m", "mlid", metavar="MLID", help="The multicast route of this MLID.")
@click.option("-f", "--force", is_flag=True,
              help="Force the route: a port with the destination's LID ends it too.")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="SRC and DST are port GUIDs.")
@click.option("--ports-file", "ports_file", type=click.Path(path_type=Path),
              help="Trace each SRC DST pair of this file's lines (SRC and DST are ignored).")
@node_name_map_option
@fabric_options()
def ibtracert_cmd(src: str | None, dst: str | None, brief: bool, mlid: str | None, force: bool,
                  by_guid: bool, ports_file: Path | None, node_name_map: Path | None,
                  as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibtracert: the route from port SRC to port DST (LIDs, or -G port GUIDs); -m MLID:
    the multicast route; --ports-file: the route of each pair a file lists."""
    from ibal.tools import nodemap

    if ports_file is None and dst is None:
        raise click.UsageError("SRC and DST are needed (or --ports-file)")
    names = nodemap.load(node_name_map)
    group = None
    if mlid is not None:
        try:
            group = int(mlid, 0)
        except ValueError:
            raise click.ClickException(f"bad MLID {mlid}") from None
    if ports_file is None:
        assert src is not None and dst is not None
        with fabric_client("ibtracert", kw) as client:
            text, data = _one(client, src, dst, brief=brief, mlid=group, force=force,
                              by_guid=by_guid, names=names, as_json=as_json)  # fmt: skip
        if as_json:
            emit_json(data)
        else:
            click.echo(text, nl=False)
        return
    try:
        raw = ports_file.read_bytes().decode("latin-1")
    except OSError:
        raise click.ClickException(f"cannot open ports-file {ports_file}") from None
    routes = []
    count = 0
    with fabric_client("ibtracert", kw) as client:
        for line, pair in port_pairs(raw):
            if pair is None:
                raise click.ClickException(f"ports-file, {ports_file}, at line {line} "
                                           "contains bad data")  # fmt: skip
            count += 1
            try:
                text, data = _one(client, *pair, brief=brief, mlid=group, force=force,
                                  by_guid=by_guid, names=names, as_json=as_json)  # fmt: skip
            except click.ClickException as exc:
                # a new exception: click 8.4 types ``message`` as final
                raise click.ClickException(f"{exc.message} at line {line}") from None
            if as_json:
                routes.append({"Source": pair[0], "Destination": pair[1], **data})
            else:
                # each route as it is found, as the C tool prints it
                click.echo(text, nl=False)
    if as_json:
        emit_json({"routes": routes})
    else:
        click.echo(f"{count} lid/guid pairs processed from {ports_file}")


def _one(client: MadClient, src: str, dst: str, *, brief: bool, mlid: int | None, force: bool,
         by_guid: bool, names: dict[int, str] | None,
         as_json: bool) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """One route's text and ``--json`` data (an error: ``ClickException``, the route found
    so far echoed first)."""
    from ibal.tools import cliopts

    ends = [cliopts.resolve_target(client, t, False, by_guid) for t in (src, dst)]
    if mlid is not None:
        return _mcast(client, ends[0], ends[1], mlid, brief, names)
    found: list[Hop] = []
    try:
        hops = trace(client, *ends, force=force, hops=found)
    except MadError as exc:
        if not as_json:
            click.echo(partial_text(_named(found, names), brief=brief), nl=False)
        raise click.ClickException(f"{exc}; failed to find route") from exc
    hops = _named(hops, names)
    return trace_text(hops, brief=brief), _json(hops)


def _mcast(client: MadClient, src: PortId, dst: PortId, mlid: int, brief: bool,
           names: dict[int, str] | None) -> tuple[str, dict[str, Any]]:  # fmt: skip
    from ibal.tools import nodemap

    if mlid < 0xC000:
        click.echo("ibtracert: invalid MLID; must be 0xc000 or larger", err=True)
    try:
        end = trace_mcast(client, src, dst, mlid)
    except MadError as exc:
        raise click.ClickException(f"{exc}; failed to find route") from exc
    n: McHop | None = end
    hops = []
    while n is not None:
        n.hop.desc = nodemap.remap(names, n.hop.node_guid, n.hop.desc)
        hops.append(n)
        n = n.up
    data = {"hops": [{"NodeType": {1: "CA", 2: "Switch", 3: "Router"}.get(
        m.hop.node_type, "??"), "NodeGUID": guid(m.hop.node_guid),
        "PortGUID": guid(m.hop.port_guid), "PortNum": m.up_port or m.hop.port_num,
        "LID": m.hop.lid, "LMC": m.hop.lmc, "NodeDescription": m.hop.desc,
        "OutPort": m.out_port or None} for m in reversed(hops)]}  # fmt: skip
    return mcast_text(end, brief=brief), data
