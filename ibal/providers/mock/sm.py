"""The mock fabric's subnet manager: LIDs, the SM's identity, switch forwarding tables.

The fabric plays the SM that a real subnet runs on one of its ports: CA
ports get LIDs from 1 as they are added (``MockFabric._alloc_lid``), the
first CA port is the SM's port (its LID is every port's master SM LID),
switches get LIDs from the top of the unicast range down (so adding a
switch never moves a CA's LID), and each switch's linear forwarding table
is recomputed, shortest path first, whenever the topology changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock.topology import Link, MockPort, Switch
from ibal.types import LinkState
from ibal.wire.mad.smp import SmState

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric

SM_PRIORITY = 0
FIRST_SWITCH_LID = 0xBFFF


class SubnetManager:
    """What the master SM knows and hands out; the fabric owns one."""

    def __init__(self, fabric: MockFabric, sm_key: int = 0) -> None:
        self.fabric = fabric
        self.sm_key = sm_key
        self.priority = SM_PRIORITY
        self.state = SmState.MASTER
        self.act_count = 0
        self._lft_gen = -1

    @property
    def port(self) -> MockPort | None:
        """The port the SM runs on (the one whose LID is the SM LID)."""
        fab = self.fabric
        for p in fab.ports():
            if p.lid == fab.sm_lid:
                return p
        return None

    def switch_lid(self) -> int:
        """The next switch LID, counting down from the top of the unicast range."""
        used = self.fabric.used_lids()
        lid = FIRST_SWITCH_LID
        while lid in used:
            lid -= 1
        return lid

    def node_by_lid(self, lid: int) -> MockPort | Switch | None:
        """The CA port (its LMC range) or switch (port 0) that owns ``lid``."""
        for sw in self.fabric.switches:
            if sw.lid == lid:
                return sw
        for p in self.fabric.ports():
            if not p.removed and p.lid <= lid < p.lid + (1 << p.lmc):
                return p
        return None

    # ============================================================ routing
    def refresh(self) -> None:
        """Fill every switch's LFT for the current topology (if it changed)."""
        gen = self.fabric.engine.topo_gen
        if gen == self._lft_gen:
            return
        self._lft_gen = gen
        self.act_count += 1
        for sw in self.fabric.switches:
            sw.lft = self._lft_of(sw)

    def _lft_of(self, sw: Switch) -> dict[int, int]:
        """LID -> out port of ``sw``: breadth first, the first port that reaches a LID wins."""
        lft = {sw.lid: 0} if sw.lid else {}
        seen: set[int] = {id(sw)}
        frontier: list[tuple[MockPort | Switch, int]] = []
        for num, ln in enumerate(sw.port_links):
            if ln is not None and ln.up:
                frontier.append((ln.other(sw), num))
        while frontier:
            nxt: list[tuple[MockPort | Switch, int]] = []
            for node, out in frontier:
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if isinstance(node, MockPort):
                    if not node.removed and node.state is LinkState.ACTIVE:
                        for lid in range(node.lid, node.lid + (1 << node.lmc)):
                            lft.setdefault(lid, out)
                    continue
                if node.lid:
                    lft.setdefault(node.lid, out)
                for ln in node.links:
                    if ln.up:
                        nxt.append((ln.other(node), out))
            frontier = nxt
        return lft


def link_peer(link: Link | None, end: MockPort | Switch) -> tuple[MockPort | Switch, int] | None:
    """What is on the other side of ``link`` from ``end`` and the port it enters by."""
    if link is None or not link.up:
        return None
    peer = link.other(end)
    if isinstance(peer, MockPort):
        return peer, peer.num
    return peer, peer.port_of(link)
