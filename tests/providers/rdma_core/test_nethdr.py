"""Telling the network header of a RoCE UD receive from its 40-byte GRH area (no device)."""

from __future__ import annotations

import ctypes
from ipaddress import IPv6Address
from types import SimpleNamespace

from ibal.providers.rdma_core.nethdr import ReceiveAreas, classify
from ibal.types import NetworkHeader, RecvWr, Sge

V2 = IPv6Address("::ffff:10.0.0.1").packed
V1 = IPv6Address("fe80::1").packed


def ipv6_area(dgid: bytes) -> bytes:
    return bytes([0x60]) + bytes(23) + dgid


def ipv4_area() -> bytes:
    return bytes(20) + bytes([0x45]) + bytes(19)


def test_classify() -> None:
    v2 = frozenset({V2})
    assert classify(ipv4_area(), v2, True) is NetworkHeader.IPV4
    assert classify(ipv6_area(V2), v2, True) is NetworkHeader.IPV6
    assert classify(ipv6_area(V1), v2, True) is NetworkHeader.IB_GRH  # a v1 GID: a GRH
    mcast = IPv6Address("ff0e::1").packed
    assert classify(ipv6_area(mcast), v2, True) is NetworkHeader.IPV6
    assert classify(ipv6_area(mcast), frozenset(), False) is NetworkHeader.IB_GRH
    assert classify(bytes(40), v2, True) is None  # neither header: no claim
    assert classify(ipv4_area()[:39], v2, True) is None


def region(buf: bytearray, alive: bool = True) -> SimpleNamespace:
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return SimpleNamespace(alive=alive, buffer=memoryview(buf), vaddr=addr, length=len(buf))


def test_receive_areas_follow_posting_order_and_live_regions() -> None:
    buf = bytearray(256)
    buf[64:104] = ipv4_area()
    mr = region(buf)
    areas = ReceiveAreas()
    areas.add_qp(7)
    areas.regions[0x11] = mr
    areas.posted(7, [
        RecvWr(1, [Sge(mr.vaddr + 64, 100, 0x11)]),
        RecvWr(2, [Sge(mr.vaddr, 16, 0x11)]),  # too short for a GRH area
        RecvWr(3, [Sge(mr.vaddr + 230, 40, 0x11)]),  # runs past the region
        RecvWr(4, [Sge(mr.vaddr, 64, 0x22)]),  # unknown lkey
    ])  # fmt: skip
    assert areas.completed(7, 1) == ipv4_area()
    assert areas.completed(7, 2) is None
    assert areas.completed(7, 3) is None
    assert areas.completed(7, 4) is None
    assert areas.completed(7, 5) is None  # nothing posted any more
    areas.posted(7, [RecvWr(8, [Sge(mr.vaddr, 64, 0x11)]), RecvWr(9, [Sge(mr.vaddr, 64, 0x11)])])
    assert areas.completed(7, 9) is None  # out of step (a RESET in between): forget, never guess
    assert areas.completed(7, 9) is None
    areas.posted(7, [RecvWr(10, [Sge(mr.vaddr + 64, 64, 0x11)])])
    mr.alive = False
    assert areas.completed(7, 10) is None  # a deregistered region is never read
    areas.posted(99, [RecvWr(1, [])])  # an untracked QP is ignored
    assert areas.completed(99, 1) is None
