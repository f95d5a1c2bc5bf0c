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

A directed-route SMP may have LID-routed ends (IBA 14.2.2): with DrSLID
not 0xFFFF (the requester's LID) it is LID-routed to the switch owning the
LRH DLID, where the directed part starts, and the response goes back from
there LID-routed to DrSLID; with DrDLID not 0xFFFF the switch at the end of
the directed part LID-routes it on to DrDLID, whose node answers back to
that switch.  Dropped: a hop count over 63, a hop pointer that is not 0
when sent, a D bit set on a request, a path through a port with no live
link or through a CA, a LID-routed end that starts or ends at a CA or does
not lead back to the requester.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock import sma
from ibal.providers.mock.pma import VL15_DROPPED
from ibal.providers.mock.sm import link_peer
from ibal.providers.mock.topology import MockPort, Switch
from ibal.wire.mad.consts import MgmtClass

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
        return _dropped(fabric, src, src.num)
    if mad[1] == MgmtClass.SUBN_DR:
        return _directed(fabric, src, bytearray(mad), dlid)
    if mad[1] != MgmtClass.SUBN_LID:
        return bytes(sma.answer(fabric, src, src.num, mad))
    if dlid is None or src.lid <= dlid < src.lid + (1 << src.lmc):
        return bytes(sma.answer(fabric, src, src.num, mad))
    fabric.sm.refresh()
    there = _lid_walk(src, src.num, dlid)
    if there is None:
        return _dropped(fabric, src, src.num)
    node, in_port = there
    resp = sma.answer(fabric, node, in_port, mad)
    back = _lid_walk(node, 0 if isinstance(node, Switch) else node.num, src.lid)
    if back is None or back[0] is not src:
        return _dropped(fabric, node, in_port)
    return bytes(resp)


def reaches(fabric: MockFabric, src: MockPort, sw: Switch) -> bool:
    """Whether a LID-routed packet from ``src`` reaches switch ``sw`` and comes back."""
    fabric.sm.refresh()
    there = _lid_walk(src, src.num, sw.lid)
    if there is None or there[0] is not sw:
        return False
    back = _lid_walk(sw, 0, src.lid)
    return back is not None and back[0] is src


def _dropped(fabric: MockFabric, at: MockPort | Switch, port: int) -> bytes | None:
    """Drop an SMP where it stopped: ``at``'s port ``port`` counts it (VL15Dropped)."""
    fabric.counters.smp_dropped += 1
    pm = at.pm if isinstance(at, MockPort) else at.pm[port if 0 <= port < len(at.pm) else 0]
    pm[VL15_DROPPED] += 1
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


def _directed(
    fabric: MockFabric, src: MockPort, m: bytearray, dlid: int | None
) -> bytes | None:
    hop_cnt, hop_ptr = m[_HOP_CNT], m[_HOP_PTR]
    dr_slid = int.from_bytes(m[32:34], "big")
    dr_dlid = int.from_bytes(m[34:36], "big")
    if hop_cnt > MAX_HOPS or hop_ptr != 0 or m[4] & 0x80:
        return _dropped(fabric, src, src.num)
    head, tail = dr_slid != PERMISSIVE_LID, dr_dlid != PERMISSIVE_LID
    if hop_cnt == 0 and (not head or dlid is None):  # the requester's own SMA: no path
        m[_HOP_PTR] = 1
        resp = sma.answer(fabric, src, src.num, m)
        resp[_HOP_PTR] = 0
        return bytes(resp)
    if head or tail:
        fabric.sm.refresh()
    # The directed part starts at the requester, or (a LID-routed head: DrSLID is the
    # requester's LID) at the switch the request was LID-routed to (IBA 14.2.2.2, C14-9:1).
    start: MockPort | Switch = src
    if head:
        if dlid is None or dlid == PERMISSIVE_LID or not _owns(src, dr_slid):
            return _dropped(fabric, src, src.num)
        there = _lid_walk(src, src.num, dlid)
        if there is None or not isinstance(there[0], Switch):
            return _dropped(fabric, src, src.num)
        start, in_port = there
    else:
        in_port = src.num
    end = start
    for hop_ptr in range(1, hop_cnt + 1):
        if hop_ptr > 1 and not isinstance(end, Switch):  # a CA does not forward
            return _dropped(fabric, end, in_port)
        hop = _out_link(end, m[_INITIAL + hop_ptr])
        if hop is None:
            return _dropped(fabric, end, in_port)
        end, in_port = hop
        m[_RETURN + hop_ptr] = in_port
    # The end of the directed part: with a LID-routed tail, a switch sends the SMP on to
    # DrDLID (C14-9:3) and the response comes back to it LID-routed.
    m[_HOP_PTR] = hop_cnt + 1
    target, target_in = end, in_port
    if tail:
        if not isinstance(end, Switch):
            return _dropped(fabric, end, in_port)
        there = _lid_walk(end, 0, dr_dlid)
        if there is None:
            return _dropped(fabric, end, in_port)
        target, target_in = there
    elif head and hop_cnt == 0 and not isinstance(target, Switch):
        # C14-13:3: only a switch starts a LID-routed return
        return _dropped(fabric, target, target_in)
    resp = sma.answer(fabric, target, target_in, m)
    if tail:
        back = _lid_walk(target, _lid_out(target), end.lid) if isinstance(end, Switch) else None
        if back is None or back[0] is not end:
            return _dropped(fabric, target, target_in)
    # Back along the return path; each node leaves by return_path[hop pointer].
    here: MockPort | Switch = end
    for ptr in range(hop_cnt, 0, -1):
        back = _out_link(here, resp[_RETURN + ptr])
        if back is None:
            return _dropped(fabric, here, resp[_RETURN + ptr])
        here, entered = back
        if ptr > 1 and not isinstance(here, Switch):
            return _dropped(fabric, here, entered)
    if here is not start:
        return _dropped(fabric, here, 0)
    if head:  # LID-routed from the start of the directed part back to DrSLID
        assert isinstance(start, Switch)
        back = _lid_walk(start, 0, dr_slid)
        if back is None or back[0] is not src:
            return _dropped(fabric, start, 0)
    resp[_HOP_PTR] = 0
    return bytes(resp)


def _owns(port: MockPort, lid: int) -> bool:
    return port.lid <= lid < port.lid + (1 << port.lmc)


def _lid_out(node: MockPort | Switch) -> int:
    """The port a LID-routed packet leaves ``node`` by before any forwarding table."""
    return 0 if isinstance(node, Switch) else node.num
