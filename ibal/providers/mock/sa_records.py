"""What the mock SA reads off the topology: node, port, link, GUID and path records.

The SA knows the subnet as its SM swept it: the end ports and switches
reachable from the SM port over live links (:func:`sweep`).  Records are
built as the field tables of :mod:`ibal.wire.mad.sa` encode them, from the same
attribute builders the SMAs answer with (:mod:`ibal.providers.mock.sma`), so
a NodeRecord holds exactly the NodeInfo an SMP would read.

Path records follow OpenSM (``osm_sa_path_record.c``, read for facts): every
reachable end-port pair (switch port 0 included), one path per pair (LMC 0),
hop limit 0 inside the subnet, reversible, NumbPath 0 in the answer; MTU and
rate the smallest along the path, packet life the subnet timeout; each with
selector 2 ("exactly") in the record.  A query's MTU, rate and packet-life
components apply with their selectors (0 greater than, 1 less than, 2
exactly, 3 the best available), P_Key must be in both ports' tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from ibal.providers.mock import sma
from ibal.providers.mock.topology import MockPort, Switch
from ibal.types import LinkState, Mtu
from ibal.wire.fields import Table, Value
from ibal.wire.mad import sa, smp
from ibal.wire.mad.sa import component_bits

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric

Node = MockPort | Switch
Values = dict[str, Value]

SWITCH_MTU = Mtu.MTU_4096
LINK_RATE = 7  # 4X QDR: 40 Gb/s, as the SMAs' PortInfo says
SELECT_GT, SELECT_LT, SELECT_EQ, SELECT_BEST = 0, 1, 2, 3
# IBA rate encoding -> Gb/s (the code is not monotonic in speed)
RATE_GBPS = {2: 2.5, 5: 5, 3: 10, 6: 20, 4: 30, 7: 40, 8: 60, 9: 80, 10: 120,
             11: 14, 12: 56, 13: 112, 14: 168, 15: 25, 16: 100, 17: 200, 18: 300}  # fmt: skip


@dataclass
class Subnet:
    """The SM's view: reachable CA ports (by LID) and switches with the port the sweep
    entered by (what NodeInfo.LocalPortNum says to the SM)."""

    ports: list[MockPort] = field(default_factory=list)
    switches: list[tuple[Switch, int]] = field(default_factory=list)

    def endpoints(self) -> list[Node]:
        out: list[Node] = [*self.ports, *(sw for sw, _ in self.switches)]
        out.sort(key=lambda n: n.lid)
        return out

    def entry(self, sw: Switch) -> int:
        for s, port in self.switches:
            if s is sw:
                return port
        return 0


def sweep(fabric: MockFabric) -> Subnet:
    """Breadth first from the SM port over live links (CA ports are leaves)."""
    out = Subnet()
    sm_port = fabric.sm.port
    if sm_port is None or sm_port.removed or sm_port.state is not LinkState.ACTIVE:
        return out
    out.ports.append(sm_port)
    seen: set[int] = {id(sm_port)}
    link = sm_port.link
    frontier: list[tuple[Node, int]] = []
    if link is not None and link.up:
        peer = link.other(sm_port)
        frontier.append((peer, peer.num if isinstance(peer, MockPort) else peer.port_of(link)))
    while frontier:
        nxt: list[tuple[Node, int]] = []
        for node, entry in frontier:
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, MockPort):
                if not node.removed and node.state is LinkState.ACTIVE:
                    out.ports.append(node)
                continue
            out.switches.append((node, entry))
            for ln in node.links:
                if ln.up:
                    peer = ln.other(node)
                    nxt.append((peer, peer.num if isinstance(peer, MockPort) else peer.port_of(ln)))
        frontier = nxt
    out.ports.sort(key=lambda p: p.lid)
    return out


def gid_of(fabric: MockFabric, node: Node) -> bytes:
    if isinstance(node, MockPort):
        return node.gid.packed
    return ((fabric.subnet_prefix << 64) | node.guid).to_bytes(16, "big")


def _pad(record: bytes) -> bytes:
    return record + bytes(-len(record) % 8)


def record_size(table: Table) -> int:
    """A record's size on the wire: the table rounded up to 8 bytes (AttributeOffset unit)."""
    return table.size + (-table.size % 8)


# ================================================================ records
def node_records(fabric: MockFabric, net: Subnet) -> list[bytes]:
    out = []
    for node in net.endpoints():
        if isinstance(node, Switch):
            info = sma.node_info(fabric, node, net.entry(node))
            desc = node.description.encode()[:64]
        else:
            info = sma.node_info(fabric, node, node.num)
            desc = node.ca.description.encode()[:64]
        rec = node.lid.to_bytes(2, "big") + bytes(2) + info + desc.ljust(64, b"\0")
        out.append(_pad(rec))
    return out


def port_info_records(fabric: MockFabric, net: Subnet) -> list[bytes]:
    out = []
    for node in net.endpoints():
        if isinstance(node, MockPort):
            pi = [(node.num, sma.port_info(fabric, node))]
        else:
            entry = net.entry(node)
            nums = [0, *(n for n in range(1, node.num_ports + 1) if node.port_links[n] is not None)]
            pi = [(n, sma.switch_port_info(fabric, node, n, entry)) for n in nums]
        for num, info in pi:
            rec = node.lid.to_bytes(2, "big") + bytes([num, 0]) + info
            out.append(_pad(rec))
    return out


def link_records(fabric: MockFabric, net: Subnet) -> list[bytes]:
    """Both directions of every live link between swept nodes."""
    known = {id(n) for n in net.endpoints()}
    out = []
    for link in fabric.links:
        if not link.up or id(link.a) not in known or id(link.b) not in known:
            continue
        ends = [(e, e.num if isinstance(e, MockPort) else e.port_of(link))
                for e in (link.a, link.b)]  # fmt: skip
        for (a, pa), (b, pb) in (ends, ends[::-1]):
            out.append(sa.LINK_RECORD.encode(from_lid=a.lid, from_port=pa, to_port=pb,
                                             to_lid=b.lid))  # fmt: skip
    out.sort()
    return out


def guid_info_records(fabric: MockFabric, net: Subnet) -> list[bytes]:
    """Block 0 of each end port's GUIDInfo: the port GUID at index 0 (GuidCap 1)."""
    out = []
    for node in net.endpoints():
        guids = smp.GUID_INFO.encode(guid0=node.guid)
        block = smp.GUID_INFO.decode(guids)
        out.append(sa.GUID_INFO_RECORD.encode(lid=node.lid, block_num=0, **block))
    return out


# ================================================================ paths
def _mtu(node: Node) -> int:
    return int(node.max_mtu) if isinstance(node, MockPort) else int(SWITCH_MTU)


def _pkeys(node: Node) -> list[int]:
    return node.pkeys if isinstance(node, MockPort) else sma.SWITCH_PKEYS


def shared_pkey(a: Node, b: Node, want: int | None) -> int | None:
    """The P_Key a path between ``a`` and ``b`` uses: ``want`` (or the default partition)
    when both ports hold it and one of them as a full member."""
    for key in [want] if want is not None else [0xFFFF, *_pkeys(a)]:
        base = key & 0x7FFF
        ka = [k for k in _pkeys(a) if k & 0x7FFF == base]
        kb = [k for k in _pkeys(b) if k & 0x7FFF == base]
        if ka and kb and (any(k & 0x8000 for k in ka) or any(k & 0x8000 for k in kb)):
            return key if want is not None else max(ka)
    return None


def select(have: int, sel: int, want: int, order: dict[int, float] | None = None) -> int | None:
    """The value a selector gives on a path offering ``have`` at best (None: no path).

    ``order`` maps codes to magnitudes where the code is not monotonic (rates).
    """
    scale = order if order is not None else {c: float(c) for c in range(1, max(have, want) + 1)}

    def rank(code: int) -> float:
        return scale.get(code, 0.0)

    if sel == SELECT_GT:
        return have if rank(have) > rank(want) else None
    if sel == SELECT_LT:
        if rank(have) < rank(want):
            return have
        below = [c for c in scale if rank(c) < rank(want)]
        return max(below, key=rank) if below else None
    if sel == SELECT_EQ:
        return want if rank(want) <= rank(have) else None
    return have


def path_record(fabric: MockFabric, src: Node, dst: Node, query: Values, mask: int
                ) -> bytes | None:
    """The PathRecord from ``src`` to ``dst`` under ``query``'s components (None: no path)."""
    bit = mask_bits(sa.PATH_RECORD)
    want_pkey = int(query["p_key"]) if mask & bit["p_key"] else None
    pkey = shared_pkey(src, dst, want_pkey)
    if pkey is None:
        return None
    if mask & bit["sl"] and query["sl"] != 0:
        return None  # the mock runs SL 0 only
    mtu: int | None = min(_mtu(src), _mtu(dst))
    rate: int | None = LINK_RATE
    life: int | None = fabric.subnet_timeout & 0x3F
    if mask & bit["mtu"]:
        sel = int(query["mtu_selector"]) if mask & bit["mtu_selector"] else SELECT_EQ
        mtu = select(min(_mtu(src), _mtu(dst)), sel, int(query["mtu"]))
    if mask & bit["rate"] and rate is not None:
        sel = int(query["rate_selector"]) if mask & bit["rate_selector"] else SELECT_EQ
        rate = select(rate, sel, int(query["rate"]), RATE_GBPS)
    if mask & bit["packet_life_time"] and life is not None:
        sel = (int(query["packet_life_time_selector"])
               if mask & bit["packet_life_time_selector"] else SELECT_EQ)
        want = int(query["packet_life_time"])
        # a longer life is the worse one: "greater than" asks for more than ``want``
        life = {SELECT_GT: max(life, want + 1) if want < 63 else None,
                SELECT_LT: life if life < want else (want - 1 if want > 0 else None),
                SELECT_EQ: want if want >= life else None,
                SELECT_BEST: life}.get(sel)  # fmt: skip
    if mtu is None or rate is None or life is None or mtu < 1:
        return None
    return sa.PATH_RECORD.encode(
        service_id=int(query["service_id"]) if mask & 0b11 else 0,
        dgid=gid_of(fabric, dst), sgid=gid_of(fabric, src), dlid=dst.lid, slid=src.lid,
        reversible=1, numb_path=0, p_key=pkey, sl=0,
        mtu_selector=SELECT_EQ, mtu=mtu, rate_selector=SELECT_EQ, rate=rate,
        packet_life_time_selector=SELECT_EQ, packet_life_time=life,
    )  # fmt: skip


@cache
def mask_bits(table: Table) -> dict[str, int]:
    """Field name -> its component mask bits (every bit of a wide component)."""
    wide = sa.WIDE.get(table.name, {})
    return {name: ((1 << wide.get(name, 1)) - 1) << bit
            for name, bit in component_bits(table).items()}  # fmt: skip


def component_count(table: Table) -> int:
    """How many component mask bits ``table`` defines (higher bits are invalid)."""
    bits = mask_bits(table)
    return max(bits.values()).bit_length() if bits else 0


def matches(table: Table, query: Values, record: Values, mask: int,
            skip: Iterable[str] = (), bitwise: Iterable[str] = ()) -> bool:  # fmt: skip
    """Whether ``record`` equals ``query`` in every component ``mask`` selects; a
    ``bitwise`` component matches when the record has every bit the query sets."""
    skipped = set(skip)
    bits = set(bitwise)
    for p in table.fields:
        if p.field.reserved or p.name in skipped or not mask & mask_bits(table)[p.name]:
            continue
        want, have = query[p.name], record[p.name]
        if p.name in bits:
            assert isinstance(want, int) and isinstance(have, int)
            if want & have != want:
                return False
        elif want != have:
            return False
    return True
