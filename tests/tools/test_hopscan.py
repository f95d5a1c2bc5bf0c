"""``ibal.tools.hopscan.HopScan``, the sans-IO partial scan, on a fabric made of answers.

A host on a three-port switch with two more CAs: the engine's queries are
answered in the order given out, as the driver does; the nodes found are
what libibnetdisc's hop counter lets through (the ibsim comparison with the
C tool is ``test_admin_last_options_ibsim.py``).
"""

from __future__ import annotations

from collections import deque

from ibal.mad.discover import Query
from ibal.tools.hopscan import HopScan
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

# node GUID: (type, ports, {port: (far node, far port)})
_NET = {
    1: (1, 1, {1: (9, 2)}),  # Host, the local node
    9: (2, 3, {1: (2, 1), 2: (1, 1), 3: (3, 1)}),  # the switch
    2: (1, 1, {1: (9, 1)}),
    3: (1, 1, {1: (9, 3)}),
}


def _walk(path: tuple[int, ...]) -> tuple[int, int]:
    """The node a DR path reaches from Host and the port it entered by (0: Host)."""
    node, entered = 1, 0
    for out in path:
        node, entered = _NET[node][2][out]
    return node, entered


def _answer(q: Query) -> bytes:
    node, entered = _walk(q.path)
    ntype, nports, links = _NET[node]
    if q.attr == SmpAttr.NODE_INFO:
        local = entered or 1
        pguid = node if ntype == 2 else node * 100 + local
        return smp.NODE_INFO.encode(node_type=ntype, num_ports=nports, node_guid=node,
                                    port_guid=pguid, local_port_num=local)  # fmt: skip
    if q.attr == SmpAttr.PORT_INFO:
        up = q.mod in links
        return smp.PORT_INFO.encode(lid=node, port_state=4 if up else 1,
                                    port_phys_state=5 if up else 2,
                                    local_port_num=entered or 1)  # fmt: skip
    return f"node {node}".encode().ljust(64, b"\0")


def _scan(start: tuple[int, ...], hops: int) -> HopScan:
    engine = HopScan(start, hops)
    queue = deque(engine.start())
    while queue:
        q = queue.popleft()
        queue.extend(engine.answer(q, _answer(q)))
    return engine


def test_one_hop_lets_the_first_path_past_it_through() -> None:
    topo = _scan((), 1).topology
    # Host, its switch, and of the switch's two other CAs the first one asked (port 1)
    assert list(topo.nodes) == [1, 9, 2]
    sw = topo.nodes[9]
    assert sw.ports[1].remote == (2, 1) and sw.ports[3].remote is None
    assert topo.nodes[9].desc == "node 9" and topo.root == 1


def test_no_limit_and_two_hops_find_every_node() -> None:
    assert list(_scan((), 0).topology.nodes) == [1, 9, 2, 3]
    assert list(_scan((), 2).topology.nodes) == [1, 9, 2, 3]


def test_a_ca_two_hops_away_is_left_backwards_and_that_is_a_hop() -> None:
    # from CA 3 (path 1,3): back to the switch is the one hop, then the first path on
    eng = _scan((1, 3), 1)
    assert list(eng.topology.nodes) == [3, 9, 2]
    assert eng.deepest == 2 and (9, 0) in eng.info


def test_a_failed_answer_ends_that_branch_only() -> None:
    engine = HopScan((), 0)
    queue = deque(engine.start())
    while queue:
        q = queue.popleft()
        lost = q.attr == SmpAttr.NODE_INFO and q.path == (1, 1)
        queue.extend(engine.answer(q, None if lost else _answer(q)))
    assert list(engine.topology.nodes) == [1, 9, 3]
    assert engine.topology.nodes[9].ports[1].remote is None
