"""The mock's ``MemoryAccess`` over its key tables, and the data path through it.

Physical regions are separate page buffers contiguous only at their I/O VA, so
a range across pages is a ``Scatter`` of page views: every direction the data
path moves bytes (gather for SEND/WRITE, a receive's scatter, READ and atomic
results landing locally, remote WRITE/READ/atomic) is driven across a page
boundary and checked in the pages themselves.
"""

from __future__ import annotations

import pytest
from mockenv import Node, connect

from ibal.ci import Handle
from ibal.providers.mock.memory import QpMemory
from ibal.transport.scatter import Scatter
from ibal.types import (
    AccessFlags,
    MrKeys,
    PdType,
    PhysCreate,
    RecvWr,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)

OK = WcStatus.SUCCESS
RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ | AccessFlags.ATOMIC
PAGE = 4096


def phys(node: Node, npages: int = 3, offset: int = 100,
         access: AccessFlags = RW) -> tuple[list[bytearray], MrKeys]:
    pages = [bytearray(PAGE) for _ in range(npages)]
    keys = node.ca.register_pmr(node.pd, PhysCreate([memoryview(p) for p in pages], PAGE,
                                                     npages * PAGE - offset, access,
                                                     buf_offset=offset), 0)
    return pages, keys


def joined(pages: list[bytearray], offset: int) -> bytes:
    return b"".join(pages)[offset:]


def mem_of(node: Node, qp: Handle) -> QpMemory:
    return node.ca.qps[qp.num].mem


def test_a_range_across_pages_is_a_scatter_of_the_pages(a: Node, b: Node) -> None:
    pages, keys = phys(b)
    _qa, qb = connect(a, b)
    mem = mem_of(b, qb)
    # region offsets 3000..6000 are page offsets 3100..6100: pages 0 and 1
    got = mem.remote(keys.rkey, keys.vaddr + 3000, 3000, int(AccessFlags.RDMA_WRITE))
    assert isinstance(got, Scatter) and len(got) == 3000
    assert [len(p) for p in got.parts] == [PAGE - 3100, 3000 - (PAGE - 3100)]
    got[0:3000] = bytes(range(250)) * 12
    assert joined(pages, 100)[3000:6000] == bytes(range(250)) * 12
    # inside one page: a plain view of that page
    inside = mem.local(keys.lkey, keys.vaddr + 10, 100, True)
    assert isinstance(inside, memoryview)
    inside[:] = b"\xab" * 100
    assert bytes(pages[0][110:210]) == b"\xab" * 100
    # a virtual region: a view of the consumer's buffer
    assert isinstance(mem.local(b.mr.lkey, b.mr.vaddr, 5000, False), memoryview)


def test_key_checks_answer_none(a: Node, b: Node) -> None:
    _pages, keys = phys(b, access=AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ)
    _qa, qb = connect(a, b)
    mem = mem_of(b, qb)
    end = keys.vaddr + keys.length
    assert mem.local(keys.lkey, end - 8, 9, False) is None  # one byte past the end
    assert mem.local(keys.lkey, keys.vaddr - 1, 2, False) is None
    assert mem.local(keys.lkey ^ 0xFF, keys.vaddr, 8, False) is None  # stale key byte
    assert mem.local(keys.rkey if keys.rkey != keys.lkey else 0, keys.vaddr, 8, False) is None
    assert mem.remote(keys.rkey, keys.vaddr, 8, int(AccessFlags.RDMA_WRITE)) is None  # no right
    assert mem.remote(keys.rkey, keys.vaddr, 8, int(AccessFlags.RDMA_READ)) is not None
    # a region of another PD is not reached through this QP
    other_pd = b.ca.allocate_pd(b.h, PdType.NORMAL)
    other = b.ca.register_pmr(other_pd, PhysCreate([memoryview(bytearray(PAGE))], PAGE, PAGE,
                                                   RW), 0)
    assert mem.local(other.lkey, other.vaddr, 8, False) is None
    assert mem.remote(other.rkey, other.vaddr, 8, int(AccessFlags.RDMA_READ)) is None
    # a zero-length range needs no key
    empty = mem.local(0, 0, 0, False)
    assert empty is not None and len(empty) == 0


def test_send_gathered_from_pages_lands_in_pages_of_a_receive(a: Node, b: Node) -> None:
    src_pages, src = phys(a)
    dst_pages, dst = phys(b, offset=300)
    qa, qb = connect(a, b)
    data = bytes(range(256)) * 12  # 3072 bytes
    # the sender's bytes straddle its page 0 / page 1 boundary, two SGEs (one plain)
    region = bytearray(b"".join(src_pages))
    region[100 + 3500 : 100 + 3500 + 2000] = data[:2000]
    for i, p in enumerate(src_pages):
        p[:] = region[i * PAGE : (i + 1) * PAGE]
    a.buf[0:1072] = data[2000:]
    b.ca.post_recv(qb, [RecvWr(7, [Sge(dst.vaddr + 3700, 3072, dst.lkey)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [Sge(src.vaddr + 3500, 2000, src.lkey),
                                                a.sge(0, 1072)])])
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK)]
    (wc,) = b.poll()
    assert (wc.wr_id, wc.status, wc.length) == (7, OK, 3072)
    assert joined(dst_pages, 300)[3700 : 3700 + 3072] == data


def test_read_and_atomic_results_land_in_pages(a: Node, b: Node) -> None:
    pages, local = phys(a)
    qa, _qb = connect(a, b)
    data = bytes(range(200)) * 30  # 6000 bytes
    b.buf[0:6000] = data
    b.buf[8000:8008] = (41).to_bytes(8, "little")
    a.ca.post_send(qa, [
        SendWr(1, WrType.RDMA_READ, [Sge(local.vaddr + 2000, 6000, local.lkey)],
               remote_addr=b.addr(0), rkey=b.mr.rkey),
        # the old value lands across the page 0 / page 1 boundary (region offset 3992+8)
        SendWr(2, WrType.FETCH_ADD, [Sge(local.vaddr + 3992, 8, local.lkey)],
               remote_addr=b.addr(8000), rkey=b.mr.rkey, compare_add=1),
    ])
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK), (2, OK)]
    region = joined(pages, 100)
    assert region[3992:4000] == (41).to_bytes(8, "little")
    assert region[2000:3992] == data[:1992] and region[4000:8000] == data[2000:]
    assert int.from_bytes(b.buf[8000:8008], "little") == 42


def test_remote_atomic_at_the_end_of_a_page_of_a_region(a: Node, b: Node) -> None:
    # an aligned atomic never crosses a page (the VA keeps the in-page offset)
    pages, keys = phys(b, offset=0)
    qa, _qb = connect(a, b)
    region = bytearray(b"".join(pages))
    region[4088:4096] = (5).to_bytes(8, "little")
    for i, p in enumerate(pages):
        p[:] = region[i * PAGE : (i + 1) * PAGE]
    a.ca.post_send(qa, [SendWr(1, WrType.COMPARE_SWAP, [a.sge(0, 8)],
                               remote_addr=keys.vaddr + 4088, rkey=keys.rkey,
                               compare_add=5, swap=0x1122334455667788)])
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK)]
    assert int.from_bytes(a.buf[0:8], "little") == 5
    assert bytes(pages[0][4088:]) == (0x1122334455667788).to_bytes(8, "little")


@pytest.mark.parametrize("length", [1, 4096, 8000])
def test_write_then_read_back_through_pages(a: Node, b: Node, length: int) -> None:
    pages, keys = phys(b)
    qa, _qb = connect(a, b)
    data = bytes((i * 7) & 0xFF for i in range(length))
    a.buf[0:length] = data
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, length)],
                               remote_addr=keys.vaddr + keys.length - length, rkey=keys.rkey),
                        SendWr(2, WrType.RDMA_READ, [a.sge(8192, length)],
                               remote_addr=keys.vaddr + keys.length - length, rkey=keys.rkey)])
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK), (2, OK)]
    assert joined(pages, 100)[-length:] == data
    assert bytes(a.buf[8192 : 8192 + length]) == data


def test_receive_sge_past_a_physical_region_fails_and_loses_nothing(a: Node, b: Node) -> None:
    pages, keys = phys(b)
    qa, qb = connect(a, b)
    before = b"".join(pages)
    b.ca.post_recv(qb, [RecvWr(7, [Sge(keys.vaddr + keys.length - 10, 20, keys.lkey)])])
    a.buf[0:16] = b"x" * 16
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 16)])])
    (wc,) = b.poll()
    assert (wc.wr_id, wc.status) == (7, WcStatus.LOCAL_PROTECTION_ERR)
    assert b"".join(pages) == before
    assert a.poll()[0].status is WcStatus.REM_OP_ERR
