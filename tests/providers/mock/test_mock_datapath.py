"""Data lands where it should, for every opcode and transport, between CAs and in loopback."""

from __future__ import annotations

import struct
from ipaddress import IPv6Address

import pytest
from mockenv import UD_QKEY, Node, connect, open_node, special_ready, to_rts, ud_ready

from ibal.ci import Handle
from ibal.providers.mock import MockFabric
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AvAttr,
    BindWr,
    Grh,
    PhysCreate,
    QpCaps,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    SrqAttr,
    UdDest,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

OK = WcStatus.SUCCESS
SIG = SendOpt.SIGNALED


def send_recv(
    a: Node, qa: Handle, b: Node, qb: Handle, payload: bytes, opt: SendOpt = SIG, imm: int = 0
) -> tuple[Wc, Wc]:
    b.ca.post_recv(qb, [RecvWr(50, [b.sge(4096, 256)])])
    a.buf[0 : len(payload)] = payload
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, len(payload))], send_opt=opt, imm=imm)])
    (sent,) = a.poll()
    (got,) = b.poll()
    return sent, got


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_send_lands_in_the_receive_buffer(a: Node, b: Node, qp_type: QpType) -> None:
    qa, qb = connect(a, b, qp_type)
    sent, got = send_recv(a, qa, b, qb, b"hello, fabric")
    assert (sent.wc_type, sent.status, sent.wr_id) == (WcType.SEND, OK, 1)
    assert (got.wc_type, got.status, got.wr_id, got.length) == (WcType.RECV, OK, 50, 13)
    assert got.qp_num == qb.num and got.imm is None
    assert bytes(b.buf[4096 : 4096 + 13]) == b"hello, fabric"


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_send_with_immediate(a: Node, b: Node, qp_type: QpType) -> None:
    qa, qb = connect(a, b, qp_type)
    _, got = send_recv(a, qa, b, qb, b"imm", SIG | SendOpt.IMMEDIATE, 0xC0FFEE)
    assert got.imm == 0xC0FFEE and got.recv_opt & RecvOpt.IMMEDIATE


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_rdma_write(a: Node, b: Node, qp_type: QpType) -> None:
    qa, _ = connect(a, b, qp_type)
    a.buf[0:16] = b"written remotely"
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 16)],
                               remote_addr=b.addr(2048), rkey=b.mr.rkey)])
    (wc,) = a.poll()
    assert (wc.wc_type, wc.status) == (WcType.RDMA_WRITE, OK)
    assert bytes(b.buf[2048:2064]) == b"written remotely"
    assert b.poll() == []  # a plain write consumes no receive


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_rdma_write_with_immediate_consumes_a_receive(a: Node, b: Node, qp_type: QpType) -> None:
    qa, qb = connect(a, b, qp_type)
    b.ca.post_recv(qb, [RecvWr(101, [])])
    a.buf[0:8] = b"imm-wrt!"
    a.ca.post_send(qa, [SendWr(3, WrType.RDMA_WRITE, [a.sge(0, 8)],
                               send_opt=SIG | SendOpt.IMMEDIATE, imm=0x1234,
                               remote_addr=b.addr(2100), rkey=b.mr.rkey)])
    (sent,) = a.poll()
    (got,) = b.poll()
    assert sent.status is OK
    assert (got.wc_type, got.imm, got.length, got.wr_id) == (WcType.RECV_RDMA_WRITE, 0x1234, 8, 101)
    assert bytes(b.buf[2100:2108]) == b"imm-wrt!"


def test_rdma_read(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    b.buf[3000:3012] = b"read back me"
    a.ca.post_send(qa, [SendWr(4, WrType.RDMA_READ, [a.sge(512, 12)],
                               remote_addr=b.addr(3000), rkey=b.mr.rkey)])
    (wc,) = a.poll()
    assert (wc.wc_type, wc.status, wc.length) == (WcType.RDMA_READ, OK, 12)
    assert bytes(a.buf[512:524]) == b"read back me"


def test_atomics_fetch_add_and_compare_swap(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    struct.pack_into("<Q", b.buf, 3584, 41)
    a.ca.post_send(qa, [SendWr(5, WrType.FETCH_ADD, [a.sge(1536, 8)],
                               remote_addr=b.addr(3584), rkey=b.mr.rkey, compare_add=1)])
    (wc,) = a.poll()
    assert (wc.wc_type, wc.status) == (WcType.FETCH_ADD, OK)
    assert struct.unpack_from("<Q", a.buf, 1536) == (41,)
    assert struct.unpack_from("<Q", b.buf, 3584) == (42,)
    # compare fails: memory unchanged, old value returned
    a.ca.post_send(qa, [SendWr(6, WrType.COMPARE_SWAP, [a.sge(1544, 8)],
                               remote_addr=b.addr(3584), rkey=b.mr.rkey, compare_add=7, swap=9)])
    a.ca.post_send(qa, [SendWr(7, WrType.COMPARE_SWAP, [a.sge(1552, 8)],
                               remote_addr=b.addr(3584), rkey=b.mr.rkey, compare_add=42, swap=7)])
    assert [(w.wr_id, w.wc_type, w.status) for w in a.poll()] == [
        (6, WcType.COMPARE_SWAP, OK), (7, WcType.COMPARE_SWAP, OK)]
    assert struct.unpack_from("<Q", a.buf, 1544) == (42,)
    assert struct.unpack_from("<Q", a.buf, 1552) == (42,)
    assert struct.unpack_from("<Q", b.buf, 3584) == (7,)


def test_fetch_add_wraps_at_64_bits(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    struct.pack_into("<Q", b.buf, 0, 0xFFFF_FFFF_FFFF_FFFF)
    a.ca.post_send(qa, [SendWr(1, WrType.FETCH_ADD, [a.sge(8, 8)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey, compare_add=2)])
    assert a.poll()[0].status is OK
    assert struct.unpack_from("<Q", b.buf, 0) == (1,)


def test_loopback_between_two_qps_of_one_ca(fabric: MockFabric) -> None:
    node = open_node(fabric.cas[0])
    qa, qb = connect(node, node)
    node.ca.post_recv(qb, [RecvWr(9, [node.sge(8192, 64)])])
    node.buf[0:4] = b"self"
    node.ca.post_send(qa, [SendWr(1, WrType.SEND, [node.sge(0, 4)])])
    node.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [node.sge(0, 4)],
                                  remote_addr=node.addr(9000), rkey=node.mr.rkey)])
    wcs = node.poll()
    assert sorted((w.wr_id, w.status) for w in wcs) == [(1, OK), (2, OK), (9, OK)]
    assert bytes(node.buf[8192:8196]) == b"self" and bytes(node.buf[9000:9004]) == b"self"


def test_scatter_gather_lists(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    a.buf[0:4] = b"abcd"
    a.buf[100:103] = b"efg"
    a.buf[200:205] = b"hijkl"
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(1000, 2), b.sge(2000, 5), b.sge(3000, 10)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4), a.sge(100, 3), a.sge(200, 5)])])
    (got,) = b.poll()
    assert got.length == 12
    assert bytes(b.buf[1000:1002]) == b"ab"
    assert bytes(b.buf[2000:2005]) == b"cdefg"
    assert bytes(b.buf[3000:3005]) == b"hijkl"
    # RDMA READ scattered over two local SGEs
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_READ, [a.sge(5000, 3), a.sge(6000, 4)],
                               remote_addr=b.addr(2000), rkey=b.mr.rkey)])
    assert a.poll()[-1].status is OK
    assert bytes(a.buf[5000:5003]) + bytes(a.buf[6000:6004]) == b"cdefg\0\0"


def test_inline_data_is_copied_at_post_time(fabric: MockFabric) -> None:
    fabric.manual_clock(inline=False)  # hold delivery until run_until_idle
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, qb = connect(a, b, caps=QpCaps(8, 8, 1, 1, 64))
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 64)])])
    a.buf[0:6] = b"inline"
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 6)], send_opt=SIG | SendOpt.INLINE)])
    a.buf[0:6] = b"CHANGE"  # after the post: must not be what arrives
    fabric.run_until_idle()
    assert bytes(b.buf[0:6]) == b"inline"
    assert a.poll()[0].status is OK


def test_inline_above_the_granted_size_is_refused(a: Node, b: Node) -> None:
    from ibal.status import InvalidParameter, PostError

    qa, _ = connect(a, b, caps=QpCaps(8, 8, 1, 1, 16))
    with pytest.raises(InvalidParameter) as err:
        a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 17)], send_opt=SIG | SendOpt.INLINE)])
    assert isinstance(err.value, PostError) and err.value.failed_index == 0


def test_message_larger_than_the_path_mtu(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)  # MTU 1024: 10000 bytes is ten packets' worth of PSNs
    a.buf[0:10000] = bytes(range(256)) * 39 + bytes(16)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 12000)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 10000)])])
    assert b.poll()[0].length == 10000
    assert bytes(b.buf[0:10000]) == bytes(a.buf[0:10000])
    assert a.ca.query_qp(qa).sq_psn == 10  # PSNs advance per MTU-sized packet
    assert b.ca.query_qp(qb).rq_psn == 10


def test_selective_signaling(a: Node, b: Node) -> None:
    qa, _ = connect(a, b, sq_signaled=False)
    writes = [
        SendWr(i, WrType.RDMA_WRITE, [a.sge(0, 4)], send_opt=SIG if i == 3 else SendOpt.NONE,
               remote_addr=b.addr(0), rkey=b.mr.rkey)
        for i in range(1, 5)
    ]
    a.ca.post_send(qa, writes)
    assert [w.wr_id for w in a.poll()] == [3]


def test_unsignaled_error_still_completes(a: Node, b: Node) -> None:
    qa, _ = connect(a, b, sq_signaled=False)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)], send_opt=SendOpt.NONE,
                               remote_addr=b.addr(0), rkey=0xDEAD00)])
    (wc,) = a.poll()
    assert (wc.wr_id, wc.status) == (1, WcStatus.REM_ACCESS_ERR)


def test_solicited_event_notification(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    b.ca.post_recv(qb, [RecvWr(i, [b.sge(0, 16)]) for i in range(3)])
    b.ca.enable_cq_notify(b.cq, True)
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert b.notified == []  # not solicited
    a.ca.post_send(qa, [SendWr(2, WrType.SEND, [a.sge(0, 4)], send_opt=SIG | SendOpt.SOLICITED)])
    assert b.notified == [b.ca.ports[0].ca.name + "-cq"]
    a.ca.post_send(qa, [SendWr(3, WrType.SEND, [a.sge(0, 4)], send_opt=SIG | SendOpt.SOLICITED)])
    assert len(b.notified) == 1  # one-shot: not re-armed


def test_srq_receives_for_two_qps(a: Node, b: Node) -> None:
    created = b.ca.create_srq(b.pd, SrqAttr(16, 2, 0), "srq")
    srq = created.handle
    assert created.attr == SrqAttr(16, 2, 0)
    qa1, qa2 = a.qp(), a.qp()
    qb1, qb2 = b.qp(srq=srq), b.qp(srq=srq)
    for x, qx, y, qy in ((a, qa1, b, qb1), (a, qa2, b, qb2), (b, qb1, a, qa1), (b, qb2, a, qa2)):
        to_rts(x, qx, y, qy.num)
    b.ca.post_srq_recv(srq, [RecvWr(10, [b.sge(0, 32)]), RecvWr(11, [b.sge(32, 32)])])
    a.buf[0:3] = b"one"
    a.ca.post_send(qa1, [SendWr(1, WrType.SEND, [a.sge(0, 3)])])
    a.buf[0:3] = b"two"
    a.ca.post_send(qa2, [SendWr(2, WrType.SEND, [a.sge(0, 3)])])
    got = b.poll()
    assert [(w.wr_id, w.qp_num) for w in got] == [(10, qb1.num), (11, qb2.num)]
    assert bytes(b.buf[0:3]) == b"one" and bytes(b.buf[32:35]) == b"two"


def test_ud_send_with_and_without_grh(a: Node, b: Node) -> None:
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid, sl=3))
    b.ca.post_recv(ub, [RecvWr(1, [b.sge(0, 40 + 64)]), RecvWr(2, [b.sge(200, 40 + 64)])])
    a.buf[0:9] = b"datagram!"
    a.ca.post_send(ua, [SendWr(7, WrType.SEND, [a.sge(0, 9)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    (sent,) = a.poll()
    (got,) = b.poll()
    assert sent.status is OK
    assert (got.length, got.src_qp, got.slid, got.sl) == (49, ua.num, a.lid, 3)
    assert not got.recv_opt & RecvOpt.GRH_VALID and got.grh is None
    assert bytes(b.buf[40:49]) == b"datagram!"
    # with a GRH: the first 40 bytes of the buffer hold it
    gid = b.ca.ports[0].gid
    av2 = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid, grh=Grh(dgid=gid)))
    a.ca.post_send(ua, [SendWr(8, WrType.SEND, [a.sge(0, 9)], send_opt=SIG | SendOpt.IMMEDIATE,
                               imm=5, ud=UdDest(av=av2, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    (got,) = b.poll()
    assert got.recv_opt & RecvOpt.GRH_VALID and got.recv_opt & RecvOpt.IMMEDIATE
    grh = bytes(b.buf[200:240])
    assert grh == got.grh
    assert grh[0] >> 4 == 6 and grh[6] == 0x1B
    assert IPv6Address(grh[8:24]) == a.ca.ports[0].gid and IPv6Address(grh[24:40]) == gid
    assert bytes(b.buf[240:249]) == b"datagram!"


def test_ud_qkey_with_high_bit_uses_the_qp_qkey(a: Node, b: Node) -> None:
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua, qkey=0x80000042)
    ud_ready(b, ub, qkey=0x80000042)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    b.ca.post_recv(ub, [RecvWr(1, [b.sge(0, 100)])])
    a.ca.post_send(ua, [SendWr(1, WrType.SEND, [a.sge(0, 4)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=0x80000000))])
    assert b.poll()[0].status is OK


def test_multicast_reaches_every_attached_qp(fabric: MockFabric) -> None:
    fabric.add_ca()
    nodes = [open_node(c) for c in fabric.cas]
    qps = [n.qp(QpType.UD) for n in nodes]
    for n, q in zip(nodes, qps, strict=True):
        ud_ready(n, q)
    mgid, mlid = IPv6Address("ff12:401b::1"), 0xC001
    attach = [n.ca.attach_mcast(q, mgid, mlid) for n, q in zip(nodes[1:], qps[1:], strict=True)]
    extra = nodes[1].qp(QpType.UD)
    ud_ready(nodes[1], extra)
    attach.append(nodes[1].ca.attach_mcast(extra, mgid, mlid))
    for n, q in ((nodes[1], qps[1]), (nodes[2], qps[2]), (nodes[1], extra)):
        n.ca.post_recv(q, [RecvWr(q.num, [n.sge(0, 128)])])
    sender = nodes[0]
    av = sender.ca.create_av(sender.pd, AvAttr(1, dlid=mlid, grh=Grh(dgid=mgid)))
    sender.buf[0:5] = b"group"
    sender.ca.post_send(qps[0], [SendWr(1, WrType.SEND, [sender.sge(0, 5)],
                                        ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY))])
    got = {w.wr_id for n in nodes[1:] for w in n.poll()}
    assert got == {qps[1].num, qps[2].num, extra.num}
    assert bytes(nodes[2].buf[40:45]) == b"group"
    # after detaching, the group no longer reaches that QP
    nodes[2].ca.detach_mcast(attach[1])
    nodes[2].ca.post_recv(qps[2], [RecvWr(99, [nodes[2].sge(0, 128)])])
    sender.ca.post_send(qps[0], [SendWr(2, WrType.SEND, [sender.sge(0, 5)],
                                        ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY))])
    assert nodes[2].poll() == []


def test_mad_exchange_over_qp1(a: Node, b: Node) -> None:
    qa = a.ca.create_spl_qp(a.pd, 1, QpType.QP1, QpCaps(8, 8, 1, 1, 0), a.cq, a.cq, "gsi-a")
    qb = b.ca.create_spl_qp(b.pd, 1, QpType.QP1, QpCaps(8, 8, 1, 1, 0), b.cq, b.cq, "gsi-b")
    assert (qa.attr.qp_num, qb.attr.qp_num) == (1, 1)
    special_ready(a, qa.handle)
    special_ready(b, qb.handle)
    b.ca.post_recv(qb.handle, [RecvWr(1, [b.sge(0, 40 + 256)])])
    mad = bytes([1, 0x07, 2, 0x03]) + bytes(252)  # a CM-class MAD
    a.buf[0:256] = mad
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(qa.handle, [SendWr(5, WrType.SEND, [a.sge(0, 256)], ud=UdDest(
        av=av, remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, pkey_index=0))])
    assert a.poll()[0].status is OK
    (got,) = b.poll()
    assert (got.src_qp, got.slid, got.length, got.pkey_index) == (1, a.lid, 296, 0)
    assert bytes(b.buf[40:296]) == mad


def test_smp_over_qp0(a: Node, b: Node) -> None:
    qa = a.ca.create_spl_qp(a.pd, 1, QpType.QP0, QpCaps(8, 8, 1, 1, 0), a.cq, a.cq, "smi-a")
    qb = b.ca.create_spl_qp(b.pd, 1, QpType.QP0, QpCaps(8, 8, 1, 1, 0), b.cq, b.cq, "smi-b")
    special_ready(a, qa.handle)
    special_ready(b, qb.handle)
    b.ca.post_recv(qb.handle, [RecvWr(1, [b.sge(0, 296)])])
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(qa.handle, [SendWr(5, WrType.SEND, [a.sge(0, 256)],
                                      ud=UdDest(av=av, remote_qp=0, remote_qkey=0))])
    (got,) = b.poll()
    assert (got.src_qp, got.status) == (0, OK)


def test_physical_region_spans_separate_pages(a: Node, b: Node) -> None:
    pages = [bytearray(4096) for _ in range(3)]
    keys = b.ca.register_pmr(b.pd, PhysCreate([memoryview(p) for p in pages], 4096, 9000,
                                              AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE
                                              | AccessFlags.RDMA_READ, buf_offset=100), 0)
    assert keys.vaddr % 4096 == 100 and keys.length == 9000
    qa, _ = connect(a, b)
    data = bytes(range(256)) * 20
    a.buf[0:5000] = data[:5000]
    # 5000 bytes starting 3900 bytes in: crosses from page 0 into page 1 and page 2
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 5000)],
                               remote_addr=keys.vaddr + 3900, rkey=keys.rkey)])
    assert a.poll()[0].status is OK
    assert bytes(pages[0][4000:4096]) == data[:96]
    assert bytes(pages[1]) == data[96 : 96 + 4096]
    assert bytes(pages[2][:808]) == data[96 + 4096 : 5000]
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_READ, [a.sge(8000, 5000)],
                               remote_addr=keys.vaddr + 3900, rkey=keys.rkey)])
    assert a.poll()[0].status is OK
    assert bytes(a.buf[8000:13000]) == data[:5000]


def test_physical_region_keeps_a_matching_requested_address(b: Node) -> None:
    pages = [memoryview(bytearray(8192))]
    keys = b.ca.register_pmr(b.pd, PhysCreate(pages, 8192, 100, AccessFlags.LOCAL_WRITE, 16),
                             0x4000_0010)
    assert keys.vaddr == 0x4000_0010
    other = b.ca.register_pmr(b.pd, PhysCreate(pages, 8192, 100, AccessFlags.LOCAL_WRITE, 16),
                              0x4000_0020)
    assert other.vaddr != 0x4000_0020 and other.vaddr % 8192 == 16


def test_shared_region_reaches_the_same_bytes(a: Node, b: Node) -> None:
    shared = b.ca.register_smr(b.mr.handle, b.pd, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE,
                               0x9000_0000)
    assert shared.rkey not in (0, b.mr.rkey) and shared.vaddr == 0x9000_0000
    qa, _ = connect(a, b)
    a.buf[0:6] = b"shared"
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 6)],
                               remote_addr=shared.vaddr + 10, rkey=shared.rkey)])
    assert a.poll()[0].status is OK
    assert bytes(b.buf[10:16]) == b"shared"


def test_reregistration_changes_keys_and_buffer(a: Node, b: Node) -> None:
    from ibal.types import MrModMask

    qa, _ = connect(a, b)
    old = b.mr
    other = bytearray(256)
    new = b.ca.modify_mr(old.handle, MrModMask.ADDR, memoryview(other), 0x5000, None, None)
    assert new.lkey != old.lkey and new.rkey != old.rkey and new.vaddr == 0x5000
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)],
                               remote_addr=0x5000, rkey=new.rkey)])
    assert a.poll()[0].status is OK
    a.buf[0:4] = b"last"
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)],
                               remote_addr=0x5004, rkey=new.rkey)])
    assert a.poll()[0].status is OK and bytes(other[4:8]) == b"last"
    # the old rkey is dead
    a.ca.post_send(qa, [SendWr(3, WrType.RDMA_WRITE, [a.sge(0, 4)],
                               remote_addr=old.vaddr, rkey=old.rkey)])
    assert a.poll()[0].status is WcStatus.REM_ACCESS_ERR


def test_unbound_window_gives_no_access(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    mw, rkey0 = b.ca.create_mw(b.pd)
    assert b.ca.query_mw(mw) == rkey0
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)],
                               remote_addr=b.addr(0), rkey=rkey0)])
    assert a.poll()[0].status is WcStatus.REM_ACCESS_ERR


def test_memory_window_bind_rebind_unbind(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    mw, rkey0 = b.ca.create_mw(b.pd)
    rw = AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
    rkey1 = b.ca.bind_mw(mw, qb, BindWr(b.mr.handle, b.addr(1024), 64, rw, rkey0, wr_id=77))
    assert rkey1 != rkey0 and b.ca.query_mw(mw) == rkey1
    (bind_wc,) = b.poll()
    assert (bind_wc.wc_type, bind_wc.wr_id, bind_wc.status) == (WcType.MW_BIND, 77, OK)
    a.buf[0:4] = b"mwin"
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)],
                               remote_addr=b.addr(1024 + 60), rkey=rkey1)])
    assert a.poll()[0].status is OK and bytes(b.buf[1084:1088]) == b"mwin"
    # rebinding changes the rkey again (all WRs of qb are signaled)
    rkey2 = b.ca.bind_mw(mw, qb, BindWr(b.mr.handle, b.addr(2048), 16, AccessFlags.RDMA_READ,
                                        rkey1, send_opt=SendOpt.NONE))
    assert len({rkey0, rkey1, rkey2}) == 3
    assert [w.wc_type for w in b.poll()] == [WcType.MW_BIND]
    b.buf[2048:2056] = b"readable"
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_READ, [a.sge(100, 8)],
                               remote_addr=b.addr(2048), rkey=rkey2)])
    assert a.poll()[0].status is OK and bytes(a.buf[100:108]) == b"readable"
    # unbind (length 0): a new rkey, in the unbound state
    rkey3 = b.ca.bind_mw(mw, qb, BindWr(None, 0, 0, AccessFlags.NONE, rkey2))
    assert rkey3 not in (rkey0, rkey1, rkey2)
    b.poll()
    b.ca.deregister_mr(b.ca.register_mr(b.pd, memoryview(bytearray(8)), 0, AccessFlags.NONE).handle)
    a.ca.post_send(qa, [SendWr(3, WrType.RDMA_READ, [a.sge(100, 8)],
                               remote_addr=b.addr(2048), rkey=rkey2)])
    assert a.poll()[0].status is WcStatus.REM_ACCESS_ERR
    b.ca.destroy_mw(mw)
