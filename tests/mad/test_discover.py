"""The directed-route sweep engine (ibal.mad.discover.Sweep) on synthetic fabrics.

A tiny SMA model answers the engine's queries by walking each DR path over a
graph (switches forward, CAs do not), and answers them in a shuffled order,
as a window of SMPs in flight would: loops, parallel links and multi-port
CAs must give every node once, every link once, and the same topology
whatever the order.  ibnetdiscover's text is read back by the parser.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ibal.mad.discover import Query, Sweep, ibnetdiscover_text, parse_ibnetdiscover
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr


@dataclass
class FakeNode:
    guid: int
    kind: int  # smp.NodeType
    nports: int
    desc: str
    links: dict[int, tuple[int, int]] = field(default_factory=dict)  # port -> (guid, port)
    lid: int = 0


class FakeFabric:
    """Nodes and links; answers SubnGet along a DR path from ``root`` (its port ``root_port``)."""

    def __init__(self) -> None:
        self.nodes: dict[int, FakeNode] = {}
        self.asked: list[Query] = []

    def add(self, guid: int, kind: int, nports: int, desc: str) -> None:
        self.nodes[guid] = FakeNode(guid, kind, nports, desc, lid=len(self.nodes) + 1)

    def link(self, a: int, pa: int, b: int, pb: int) -> None:
        self.nodes[a].links[pa] = (b, pb)
        self.nodes[b].links[pb] = (a, pa)

    def links(self) -> set[frozenset[tuple[int, int]]]:
        return {frozenset(((n.guid, p), far)) for n in self.nodes.values()
                for p, far in n.links.items()}  # fmt: skip

    def walk(self, root: int, path: tuple[int, ...]) -> tuple[FakeNode, int] | None:
        node, in_port = self.nodes[root], 0
        for i, out in enumerate(path):
            if i and node.kind != smp.NodeType.SWITCH:
                return None  # a CA does not forward
            far = node.links.get(out)
            if far is None:
                return None
            node, in_port = self.nodes[far[0]], far[1]
        return node, in_port

    def answer(self, root: int, root_port: int, q: Query) -> bytes | None:
        self.asked.append(q)
        hit = self.walk(root, q.path)
        if hit is None:
            return None
        node, in_port = hit
        if not q.path:
            in_port = root_port
        sw = node.kind == smp.NodeType.SWITCH
        port_guid = node.guid if sw else node.guid + in_port
        if q.attr == SmpAttr.NODE_INFO:
            return smp.NODE_INFO.encode(
                base_version=1, class_version=1, node_type=node.kind, num_ports=node.nports,
                system_image_guid=node.guid, node_guid=node.guid, port_guid=port_guid,
                partition_cap=1, local_port_num=in_port, vendor_id=0x2C9,
            )  # fmt: skip
        if q.attr == SmpAttr.NODE_DESC:
            return node.desc.encode().ljust(64, b"\0")
        if q.attr == SmpAttr.SWITCH_INFO:
            return smp.SWITCH_INFO.encode(enhanced_port0=0)
        if q.attr == SmpAttr.PORT_INFO:
            p = q.mod
            up = p == 0 or p in node.links
            return smp.PORT_INFO.encode(
                lid=node.lid if (sw and p == 0) or not sw else 0, local_port_num=p,
                port_state=4 if up else 1, port_phys_state=5 if up else 2,
                link_width_active=2, link_speed_active=1,
            )  # fmt: skip
        return None


def run(fab: FakeFabric, root: int, root_port: int = 1, seed: int = 0) -> Sweep:
    """The sweep with every query in flight at once, answered in a random order."""
    rng = random.Random(seed)
    eng = Sweep()
    todo = eng.start()
    while todo:
        q = todo.pop(rng.randrange(len(todo)))
        todo.extend(eng.answer(q, fab.answer(root, root_port, q)))
    assert eng.done
    return eng


def fat_tree(spines: int, leaves: int, hosts: int) -> FakeFabric:
    fab = FakeFabric()
    for i in range(spines):
        fab.add(0x100 + i, smp.NodeType.SWITCH, leaves, f"spine{i}")
    for j in range(leaves):
        fab.add(0x200 + j, smp.NodeType.SWITCH, hosts + spines, f"leaf{j}")
        for i in range(spines):
            fab.link(0x200 + j, hosts + 1 + i, 0x100 + i, j + 1)
        for k in range(hosts):
            g = 0x10000 + j * 0x100 + k * 4
            fab.add(g, smp.NodeType.CA, 1, f"host{j}-{k}")
            fab.link(g, 1, 0x200 + j, k + 1)
    return fab


def _check(fab: FakeFabric, eng: Sweep) -> None:
    topo = eng.topology
    assert set(topo.nodes) == set(fab.nodes)
    assert topo.links() == fab.links()
    # each node once: one NodeDescription query per node
    descs = [q.node for q in fab.asked if q.attr == SmpAttr.NODE_DESC]
    assert sorted(descs) == sorted(fab.nodes)
    for n in topo.nodes.values():
        assert n.desc == fab.nodes[n.guid].desc


@pytest.mark.parametrize("seed", range(5))
def test_fat_tree_any_answer_order(seed: int) -> None:
    fab = fat_tree(3, 4, 3)
    eng = run(fab, 0x10000, seed=seed)
    _check(fab, eng)
    assert not eng.failed


def test_switch_ring_with_parallel_links_and_a_dual_port_ca() -> None:
    fab = FakeFabric()
    for i in range(5):
        fab.add(0x50 + i, smp.NodeType.SWITCH, 8, f"ring{i}")
    for i in range(5):  # a ring, and every neighbour pair linked twice
        fab.link(0x50 + i, 1, 0x50 + (i + 1) % 5, 2)
        fab.link(0x50 + i, 3, 0x50 + (i + 1) % 5, 4)
    fab.add(0x900, smp.NodeType.CA, 2, "dual")  # one CA on two switches
    fab.link(0x900, 1, 0x50, 5)
    fab.link(0x900, 2, 0x52, 5)
    fab.add(0x910, smp.NodeType.CA, 1, "me")
    fab.link(0x910, 1, 0x53, 6)
    for seed in range(5):
        fab.asked.clear()
        eng = run(fab, 0x910, seed=seed)
        _check(fab, eng)
        dual = eng.topology.nodes[0x900]
        assert {p: dual.ports[p].remote for p in (1, 2)} == {1: (0x50, 5), 2: (0x52, 5)}
        # NodeInfo is asked once per link end reached, not again for known far ends
        ni = [q for q in fab.asked if q.attr == SmpAttr.NODE_INFO]
        assert len(ni) <= 1 + 2 * len(fab.links())


def test_lost_answers_are_reported_and_the_sweep_still_ends() -> None:
    fab = fat_tree(2, 2, 2)
    eng = Sweep()
    todo = eng.start()
    dropped = 0
    while todo:
        q = todo.pop(0)
        data = fab.answer(0x10000, 1, q)
        if q.attr == SmpAttr.NODE_DESC and dropped == 0:
            data, dropped = None, 1
        todo.extend(eng.answer(q, data))
    assert eng.done and len(eng.failed) == 1
    assert set(eng.topology.nodes) == set(fab.nodes)


def test_max_hops_bounds_the_sweep() -> None:
    fab = FakeFabric()
    for i in range(6):  # a line of switches
        fab.add(0x70 + i, smp.NodeType.SWITCH, 2, f"s{i}")
        if i:
            fab.link(0x70 + i - 1, 2, 0x70 + i, 1)
    fab.add(0x7F0, smp.NodeType.CA, 1, "me")
    fab.link(0x7F0, 1, 0x70, 1)
    eng = Sweep(max_hops=3)
    todo = eng.start()
    while todo:
        q = todo.pop()
        todo.extend(eng.answer(q, fab.answer(0x7F0, 1, q)))
    assert set(eng.topology.nodes) == {0x7F0, 0x70, 0x71, 0x72}


def test_text_reads_back_as_the_same_topology() -> None:
    fab = fat_tree(2, 3, 2)
    eng = run(fab, 0x10000)
    text = ibnetdiscover_text(eng.topology, "Mon Nov 23 00:00:00 2026")
    got = parse_ibnetdiscover(text)
    assert set(got["nodes"]) == set(fab.nodes)
    assert got["links"] == fab.links()
    assert got["nodes"][0x200]["lid"] == fab.nodes[0x200].lid
    assert got["ports"][(0x10000, 1)]["rate"] == "4xSDR"
    assert text.startswith("#\n# Topology file: generated on Mon Nov 23 00:00:00 2026\n#\n")
    with pytest.raises(ValueError):
        parse_ibnetdiscover(text + "garbage line\n")


def test_progress_line_is_throttled_and_cleared() -> None:
    import io

    from ibal.tools.diags import Progress

    out = io.StringIO()
    show = Progress(out)
    eng = run(fat_tree(1, 1, 2), 0x10000)
    show(eng, 5)
    show(eng, 4)  # within 0.1 s of the last: not shown
    assert out.getvalue() == "\rdiscovered 4 nodes, 5 SMPs in flight "
    show.end()
    assert out.getvalue().endswith("\r\033[K")
    quiet = io.StringIO()
    Progress(quiet).end()  # nothing shown, nothing to clear
    assert quiet.getvalue() == ""
