"""A partial fabric scan limited in hops, as libibnetdisc's (``iblinkinfo -n``, ``-D``).

libibnetdisc limits a scan with one counter for the whole fabric: the
deepest DR path extended so far, relative to the start.  A path is
extended only while that counter is not past the limit, so the first path
to go one hop beyond it is still followed and every later one is not.
Which node that is depends on the order the answers are handled in:
libibnetdisc queues its SMPs first in, first out, and a simulator or a
quiet fabric answers them in order, so :class:`HopScan` handles them in
that order and asks what libibnetdisc asks (NodeDescription, SwitchInfo and
port 0's PortInfo of a new switch, then its other ports; a CA's PortInfo at
each arrival).  A CA the scan starts at by a DR path of two hops or more is
left by stepping back along that path, which counts as a hop too.

:class:`HopScan` is the sans-IO engine (queries out, answers in, in queue
order); :func:`hop_scan` drives it over a :class:`~ibal.mad.rpc.MadClient`.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from ibal.mad.discover import DiscNode, DiscPort, Query, Topology
from ibal.mad.rpc import MadClient, MadError, PortId, smp_request
from ibal.tools.links import Fabric
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["HopScan", "hop_scan"]

_LINK_UP: Final = 5


class HopScan:
    """libibnetdisc's scan from the node at ``start`` (a DR path), ``max_hops`` deep (0: no
    limit); answers must be handed in the order the queries were given out."""

    def __init__(self, start: tuple[int, ...] = (), max_hops: int = 0) -> None:
        self.topology = Topology()
        self.info: dict[tuple[int, int], dict[str, Any]] = {}
        self.start_path = start
        self.max_hops = max_hops
        self.deepest = 0  # libibnetdisc's maxhops_discovered
        self._from: tuple[int, int] | None = None  # the start node's GUID and port

    def start(self) -> list[Query]:
        return [Query(SmpAttr.NODE_INFO, 0, self.start_path)]

    def fabric(self) -> Fabric:
        return Fabric(self.topology, self.info)

    def answer(self, q: Query, data: bytes | None) -> list[Query]:
        """The queries ``q``'s answer (``None``: it failed) leads to."""
        if data is None:
            return []
        if q.attr == SmpAttr.NODE_INFO:
            return self._node_info(q, data)
        node = self.topology.nodes.get(q.node)
        if node is None:
            return []
        if q.attr == SmpAttr.NODE_DESC:
            node.desc = data[:64].split(b"\0", 1)[0].decode("utf-8", "replace")
        elif q.attr == SmpAttr.SWITCH_INFO:
            node.enhanced_port0 = bool(smp.SWITCH_INFO.decode(data)["enhanced_port0"])
        elif q.attr == SmpAttr.PORT_INFO:
            out = self._port_info(q, node, data)
            if q.mod == 0 and node.is_switch:
                out += [Query(SmpAttr.PORT_INFO, p, q.path, node.guid)
                        for p in range(1, node.num_ports + 1)]  # fmt: skip
            return out
        return []

    def _node_info(self, q: Query, data: bytes) -> list[Query]:
        ni = smp.NODE_INFO.decode(data)
        guid, pnum = int(ni["node_guid"]), int(ni["local_port_num"])
        nodes = self.topology.nodes
        node = nodes.get(guid)
        out: list[Query] = []
        if node is None:
            node = DiscNode(guid, int(ni["node_type"]), int(ni["num_ports"]),
                            int(ni["system_image_guid"]), int(ni["port_guid"]),
                            int(ni["vendor_id"]), int(ni["device_id"]), int(ni["revision"]),
                            q.path)  # fmt: skip
            nodes[guid] = node
            out.append(Query(SmpAttr.NODE_DESC, 0, q.path, guid))
            if node.is_switch:
                out += [Query(SmpAttr.SWITCH_INFO, 0, q.path, guid),
                        Query(SmpAttr.PORT_INFO, 0, q.path, guid)]  # fmt: skip
        port = node.ports.setdefault(pnum, DiscPort(pnum))
        port.guid = int(ni["port_guid"])
        if q.via is None:
            self.topology.root = guid
            self._from = (guid, pnum)
        else:
            far = nodes[q.via[0]].ports.get(q.via[1])
            # a link found again replaces what either end was linked to
            for end in (port, far):
                if end is not None and end.remote is not None:
                    old = nodes[end.remote[0]].ports.get(end.remote[1])
                    if old is not None:
                        old.remote = None
            port.remote = q.via
            if far is not None:
                far.remote = (guid, pnum)
        if not node.is_switch:
            out.append(Query(SmpAttr.PORT_INFO, pnum, q.path, guid))
        return out

    def _port_info(self, q: Query, node: DiscNode, data: bytes) -> list[Query]:
        pi = dict(smp.PORT_INFO.decode(data))
        pn = q.mod
        port = node.ports.setdefault(pn, DiscPort(pn, node.port_guid))
        self.info[(node.guid, pn)] = pi
        port.lid, port.lmc = int(pi["lid"]), int(pi["lmc"])
        if node.is_switch and pn:
            p0 = node.ports.get(0)
            port.lid, port.lmc = (p0.lid, p0.lmc) if p0 is not None else (0, 0)
        port.capmask, port.state = int(pi["capability_mask"]), int(pi["port_state"])
        port.phys_state = int(pi["port_phys_state"])
        port.width, port.speed = int(pi["link_width_active"]), int(pi["link_speed_active"])
        port.ext_speed = int(pi["link_speed_ext_active"])
        from_here = self._from == (node.guid, pn)
        if not pn or port.phys_state != _LINK_UP:
            return []
        if not ((node.is_switch and pn != int(pi["local_port_num"])) or from_here):
            return []
        if not node.is_switch and from_here and len(q.path) > 1:
            path = self._retract(q.path)
        else:
            path = self._extend(q.path, pn)
        if path is None:
            return []
        return [Query(SmpAttr.NODE_INFO, 0, path, 0, (node.guid, pn))]

    def _over(self) -> bool:
        return bool(self.max_hops) and self.deepest > self.max_hops

    def _retract(self, path: tuple[int, ...]) -> tuple[int, ...] | None:
        if self._over():
            return None
        self.deepest += 1
        return path[:-1]

    def _extend(self, path: tuple[int, ...], port: int) -> tuple[int, ...] | None:
        if self._over():
            return None
        out = (*path, port)
        if len(out) - len(self.start_path) > self.deepest:
            self.deepest += 1
        return out


def hop_scan(client: MadClient, start: tuple[int, ...] = (), max_hops: int = 0, *,
             window: int = 64) -> Fabric:  # fmt: skip
    """The fabric :class:`HopScan` finds through ``client``: each round sends what is
    queued (``window`` in flight) and handles the answers in queue order."""
    engine = HopScan(start, max_hops)
    queue = deque(engine.start())
    while queue:
        batch = list(queue)
        queue.clear()
        reqs = [smp_request(q.attr, PortId(dr_path=q.path), q.mod) for q in batch]
        for q, rep in zip(batch, client.call_many(reqs, window=window), strict=True):
            queue.extend(engine.answer(q, bytes(rep.data) if rep.ok else None))
    if engine.topology.root is None:
        raise MadError("discover failed: the node to start at did not answer NodeInfo")
    return engine.fabric()
