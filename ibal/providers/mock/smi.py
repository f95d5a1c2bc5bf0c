"""The mock fabric's subnet management interface: how an SMP travels (IBA vol. 1 14.2.2).

:func:`send` takes an SMP leaving a CA port's QP0 and returns the response as
it arrives back at that port (``None``: dropped, and counted in
``fabric.counters.smp_dropped``):

* LID-routed (class 0x01): switch by switch through the LFTs the SM filled,
  to the CA port or switch (port 0) owning the DLID, and back to the SLID;
* directed route (class 0x81): hop by hop along the initial path; each node
  records the port it was entered by in the return path at the hop pointer,
  the last one answers (D bit set) and the response walks the return path
  back, the hop pointer counting down to 0 at the requester.

Only the fully directed form is modelled (DrSLID and DrDLID both the
permissive LID 0xFFFF); an SMP with a LID-routed part, a hop count over 63,
a hop pointer that is not 0 when sent, a D bit set on a request, or a path
through a port with no live link is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.mad.consts import MgmtClass
from ibal.providers.mock import sma
from ibal.providers.mock.sm import link_peer
from ibal.providers.mock.topology import MockPort, Switch

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric

PERMISSIVE_LID = 0xFFFF
MAX_HOPS = 63
_INITIAL = 128  # initial path: bytes 128..191 of a DR SMP
_RETURN = 192  # return path: bytes 192..255
_HOP_PTR = 6
_HOP_CNT = 7

Hop = tuple[MockPort | Switch, int]  # a node and the port an SMP entered it by


def send(fabric: MockFabric, src: MockPort, mad: bytes, dlid: int | None = None) -> bytes | None:
    """The response to SMP ``mad`` sent from ``src`` (LID-routed ones to ``dlid``)."""
    if len(mad) != 256:
        return _dropped(fabric)
    if mad[1] == MgmtClass.SUBN_DR:
        return _directed(fabric, src, bytearray(mad))
    if mad[1] != MgmtClass.SUBN_LID:
        return bytes(sma.answer(fabric, src, src.num, mad))
    if dlid is None or src.lid <= dlid < src.lid + (1 << src.lmc):
        return bytes(sma.answer(fabric, src, src.num, mad))
    fabric.sm.refresh()
    there = _lid_walk(src, src.num, dlid)
    if there is None:
        return _dropped(fabric)
    node, in_port = there
    resp = sma.answer(fabric, node, in_port, mad)
    back = _lid_walk(node, 0 if isinstance(node, Switch) else node.num, src.lid)
    if back is None or back[0] is not src:
        return _dropped(fabric)
    return bytes(resp)


def _dropped(fabric: MockFabric) -> bytes | None:
    fabric.counters.smp_dropped += 1
    return None


def _out_link(node: MockPort | Switch, port: int) -> Hop | None:
    """Where leaving ``node`` by ``port`` leads (``None``: no such port or no live link)."""
    if isinstance(node, MockPort):
        return link_peer(node.link, node) if port == node.num else None
    if not 1 <= port <= node.num_ports:
        return None
    return link_peer(node.port_links[port], node)


def _lid_walk(node: MockPort | Switch, out: int, dlid: int) -> Hop | None:
    """Follow the LFTs from ``node`` (leaving by ``out``) to the owner of ``dlid``."""
    if isinstance(node, Switch):
        out = node.lft.get(dlid, 0)
        if out == 0:
            return None
    hop = _out_link(node, out)
    for _ in range(MAX_HOPS + 1):
        if hop is None:
            return None
        here = hop[0]
        if isinstance(here, MockPort):
            return hop if here.lid <= dlid < here.lid + (1 << here.lmc) else None
        if here.lid == dlid:
            return hop
        hop = _out_link(here, here.lft.get(dlid, 0))
    return None  # a forwarding loop


def _directed(fabric: MockFabric, src: MockPort, m: bytearray) -> bytes | None:
    hop_cnt, hop_ptr = m[_HOP_CNT], m[_HOP_PTR]
    dr_slid = int.from_bytes(m[32:34], "big")
    dr_dlid = int.from_bytes(m[34:36], "big")
    if hop_cnt > MAX_HOPS or hop_ptr != 0 or m[4] & 0x80:
        return _dropped(fabric)
    if hop_cnt == 0:  # the requester's own SMA: no path, the DR LIDs do not matter
        m[_HOP_PTR] = 1
        resp = sma.answer(fabric, src, src.num, m)
        resp[_HOP_PTR] = 0
        return bytes(resp)
    if dr_slid != PERMISSIVE_LID or dr_dlid != PERMISSIVE_LID:
        return _dropped(fabric)
    # Outgoing: the hop pointer moves to 1, a CA sends by the port it names.
    hop: Hop | None = _out_link(src, m[_INITIAL + 1])
    hop_ptr = 1
    while True:
        if hop is None:
            return _dropped(fabric)
        node, in_port = hop
        m[_RETURN + hop_ptr] = in_port
        if hop_ptr == hop_cnt:
            break
        if not isinstance(node, Switch):  # a CA does not forward
            return _dropped(fabric)
        hop_ptr += 1
        hop = _out_link(node, m[_INITIAL + hop_ptr])
    # The end of the path: delivered with the hop pointer one past the count.
    m[_HOP_PTR] = hop_cnt + 1
    resp = sma.answer(fabric, node, in_port, m)
    # Back along the return path; each node leaves by return_path[hop pointer].
    here: MockPort | Switch = node
    for ptr in range(hop_cnt, 0, -1):
        back = _out_link(here, resp[_RETURN + ptr])
        if back is None:
            return _dropped(fabric)
        here = back[0]
        if ptr > 1 and not isinstance(here, Switch):
            return _dropped(fabric)
    if here is not src:
        return _dropped(fabric)
    resp[_HOP_PTR] = 0
    return bytes(resp)
