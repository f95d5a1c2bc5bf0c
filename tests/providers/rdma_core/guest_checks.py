"""Checks of the rdma_core provider against kernel rxe, run INSIDE the lab guest.

Not collected on the host (the file name does not match ``test_*.py``);
``test_lab_rdma_core.py`` runs it in the guest together with the conformance
suite, in one boot::

    ibal lab run -- python -m pytest -p no:cacheprovider tests/providers/rdma_core/guest_checks.py

Every check runs through the full access layer (``ibal.al``) on ``rxe0``, once
per data path (the ctypes one over libibverbs' dispatch table, and the
pyverbs one).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Any

import pytest

import ibal
from ibal.al import AccessLayer, AlManager, Ca, Cq, Mr, Pd, Qp, QpCreate
from ibal.providers.rdma_core.fastpath import DATAPATH_ENV
from ibal.status import InvalidQpState, NotFound, PostError, ResourceBusy
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AsyncEventRec,
    AvAttr,
    BindWr,
    GidType,
    Grh,
    LinkLayer,
    Mtu,
    NetworkHeader,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    UdDest,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

DEVICE = "rxe0"
ALL = (
    AccessFlags.LOCAL_WRITE
    | AccessFlags.RDMA_WRITE
    | AccessFlags.RDMA_READ
    | AccessFlags.ATOMIC
    | AccessFlags.MW_BIND
)
SIG = SendOpt.SIGNALED
QKEY = 0x11110000


@dataclass
class Env:
    mgr: AlManager
    al: AccessLayer
    ca: Ca
    port: PortAttr
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr
    events: list[AsyncEventRec]
    datapath: str


@pytest.fixture(params=["ctypes", "pyverbs"])
def env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    monkeypatch.setenv(DATAPATH_ENV, request.param)
    mgr = AlManager()
    provider = mgr.start_provider("rdma_core", {"devices": [DEVICE]})
    assert provider.unavailable_reason is None, provider.unavailable_reason
    al = mgr.open_al()
    events: list[AsyncEventRec] = []
    ca = al.open_ca(al.get_ca_guids()[0], event_cb=events.append)
    port = ca.query().ports[0]
    pd = ca.alloc_pd()
    cq = ca.create_cq(256)
    buf = bytearray(16384)
    mr = pd.reg_mem(buf, ALL)
    try:
        yield Env(mgr, al, ca, port, pd, cq, buf, mr, events, request.param)
    finally:
        al.close()
        mgr.close()


def poll(cq: Cq, n: int, timeout: float = 10.0) -> list[Wc]:
    out: list[Wc] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        out += cq.poll(16)
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(out)} of {n} completions within {timeout} s: {out}")
    return out


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def av(e: Env) -> AvAttr:
    return AvAttr(e.port.port_num, grh=Grh(e.port.gids[0]))


def rc_pair(e: Env, qp_type: QpType = QpType.RC, **create: Any) -> tuple[Qp, Qp]:
    qps = [e.pd.create_qp(QpCreate(qp_type, e.cq, e.cq, sq_depth=64, rq_depth=64, **create))
           for _ in range(2)]  # fmt: skip
    for qp, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=e.port.port_num, access=ALL))
        if qp_type is QpType.RC:
            qp.modify(
                QpMod(
                    QpState.RTR,
                    primary_av=av(e),
                    path_mtu=Mtu.MTU_1024,
                    dest_qp=peer.num,
                    rq_psn=0,
                    resp_res=4,
                    rnr_nak_timeout=12,
                )
            )
            qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                            rnr_retry_cnt=7, init_depth=4))  # fmt: skip
        else:
            qp.modify(
                QpMod(
                    QpState.RTR, primary_av=av(e), path_mtu=Mtu.MTU_1024, dest_qp=peer.num, rq_psn=0
                )
            )
            qp.modify(QpMod(QpState.RTS, sq_psn=0))  # fmt: skip
    return qps[0], qps[1]


def ud_qp(e: Env, **create: Any) -> Qp:
    qp = e.pd.create_qp(QpCreate(QpType.UD, e.cq, e.cq, **create))
    qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=e.port.port_num, qkey=QKEY))
    qp.modify(QpMod(QpState.RTR))
    qp.modify(QpMod(QpState.RTS, sq_psn=0))
    return qp


# ------------------------------------------------------------------ checks


def test_provider_opens_rxe0(env: Env) -> None:
    e = env
    assert e.ca.name == DEVICE
    attr = e.ca.query()
    assert attr.ca_guid == e.ca.guid != 0
    p = e.port
    assert p.link_layer is LinkLayer.ETHERNET and p.lid == 0
    assert any(g.ipv4_mapped is not None for g in p.gids), p.gids
    assert p.pkeys == (0xFFFF,)
    caps = e.ca.capabilities
    assert caps.special_qps == frozenset() and "kernel" in caps.reason("special_qps")
    assert e.mgr.unavailable == {}


def test_rc_rdma_write_lands_bytes(env: Env) -> None:
    e = env
    a, _ = rc_pair(e)
    payload = bytes(range(1, 201))
    e.buf[0:200] = payload
    a.post_send(SendWr(1, WrType.RDMA_WRITE, [e.mr.sge(0, 200)], SIG,
                       remote_addr=e.mr.vaddr + 4096, rkey=e.mr.rkey))  # fmt: skip
    (wc,) = poll(e.cq, 1)
    assert (wc.wr_id, wc.wc_type, wc.status, wc.qp_num) == (
        1, WcType.RDMA_WRITE, WcStatus.SUCCESS, a.num
    )  # fmt: skip
    assert bytes(e.buf[4096:4296]) == payload


def test_port_counters_are_the_kernels_hw_counters(env: Env) -> None:
    """ca.query_port_counters reads rxe0's sysfs hw_counters; a loopback WRITE moves them."""
    e = env
    assert e.ca.capabilities.port_counters
    before = e.ca.query_port_counters(e.port.port_num)
    assert {"sent_pkts", "rcvd_pkts", "duplicate_request"} <= set(before)
    a, _ = rc_pair(e)
    a.post_send(SendWr(9, WrType.RDMA_WRITE, [e.mr.sge(0, 64)], SIG,
                       remote_addr=e.mr.vaddr + 8192, rkey=e.mr.rkey))  # fmt: skip
    (wc,) = poll(e.cq, 1)
    assert wc.status is WcStatus.SUCCESS
    after = e.ca.query_port_counters(e.port.port_num)
    assert after["sent_pkts"] > before["sent_pkts"]
    assert after["rcvd_pkts"] > before["rcvd_pkts"]


def test_batched_writes_read_and_atomics(env: Env) -> None:
    e = env
    a, _ = rc_pair(e)
    n = 150  # more than one 64-WR chain
    a.post_send([SendWr(i, WrType.RDMA_WRITE, [e.mr.sge(i, 1)], SIG,
                        remote_addr=e.mr.vaddr + 8192 + i, rkey=e.mr.rkey)
                 for i in range(min(n, 60))])  # fmt: skip
    assert [w.wr_id for w in poll(e.cq, 60)] == list(range(60))
    e.buf[1000:1008] = (41).to_bytes(8, "little")
    a.post_send([
        SendWr(100, WrType.RDMA_READ, [e.mr.sge(2000, 8)], SIG, remote_addr=e.mr.vaddr + 1000,
               rkey=e.mr.rkey),
        SendWr(101, WrType.FETCH_ADD, [e.mr.sge(2008, 8)], SIG, remote_addr=e.mr.vaddr + 1000,
               rkey=e.mr.rkey, compare_add=1),
        SendWr(102, WrType.COMPARE_SWAP, [e.mr.sge(2016, 8)], SIG,
               remote_addr=e.mr.vaddr + 1000, rkey=e.mr.rkey, compare_add=42, swap=7),
    ])  # fmt: skip
    wcs = poll(e.cq, 3)
    assert [(w.wc_type, w.status) for w in wcs] == [
        (WcType.RDMA_READ, WcStatus.SUCCESS), (WcType.FETCH_ADD, WcStatus.SUCCESS),
        (WcType.COMPARE_SWAP, WcStatus.SUCCESS),
    ]  # fmt: skip
    assert int.from_bytes(e.buf[2000:2008], "little") == 41
    assert int.from_bytes(e.buf[2008:2016], "little") == 41
    assert int.from_bytes(e.buf[2016:2024], "little") == 42
    assert int.from_bytes(e.buf[1000:1008], "little") == 7


def test_send_with_immediate_and_completion_callback(env: Env) -> None:
    e = env
    fired = threading.Event()
    cq = e.ca.create_cq(16, comp_cb=lambda cq, ctx: fired.set())
    a = e.pd.create_qp(QpCreate(QpType.RC, e.cq, cq))
    b = e.pd.create_qp(QpCreate(QpType.RC, e.cq, cq))
    for qp, peer in ((a, b), (b, a)):
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=ALL))
        qp.modify(
            QpMod(
                QpState.RTR,
                primary_av=av(e),
                path_mtu=Mtu.MTU_1024,
                dest_qp=peer.num,
                rq_psn=0,
                resp_res=1,
                rnr_nak_timeout=12,
            )
        )
        qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                        rnr_retry_cnt=7, init_depth=1))  # fmt: skip
    b.post_recv(RecvWr(7, [e.mr.sge(3000, 64)]))
    cq.rearm()
    e.buf[0:5] = b"hello"
    a.post_send(SendWr(8, WrType.SEND, [e.mr.sge(0, 5)], SIG | SendOpt.IMMEDIATE, imm=0xCAFE0001))
    assert fired.wait(10), "completion callback did not fire"
    (wc,) = poll(cq, 1)
    assert (wc.wr_id, wc.wc_type, wc.length, wc.imm) == (7, WcType.RECV, 5, 0xCAFE0001)
    assert wc.recv_opt == RecvOpt.IMMEDIATE  # no GRH flag on RC
    assert bytes(e.buf[3000:3005]) == b"hello"
    poll(e.cq, 1)
    for qp in (a, b):
        qp.destroy(wait=True)
    cq.destroy(wait=True)


def test_ud_send_through_an_av(env: Env) -> None:
    e = env
    a, b = ud_qp(e), ud_qp(e)
    av_h = e.pd.create_av(av(e))
    b.post_recv(RecvWr(9, [e.mr.sge(4000, 128)]))
    e.buf[100:104] = b"ping"
    a.post_send(SendWr(10, WrType.SEND, [e.mr.sge(100, 4)], SIG, ud=UdDest(av_h, b.num, QKEY)))
    wcs = {w.wr_id: w for w in poll(e.cq, 2)}
    r = wcs[9]
    assert r.wc_type is WcType.RECV and r.length == 40 + 4 and r.src_qp == a.num
    assert r.recv_opt & RecvOpt.GRH_VALID
    assert bytes(e.buf[4040:4044]) == b"ping"


def test_flushed_receives_are_receives(env: Env) -> None:
    e = env
    _, b = rc_pair(e)
    b.post_recv([RecvWr(20, [e.mr.sge(0, 8)]), RecvWr(21, [])])
    b.modify(QpMod(QpState.ERROR))
    wcs = poll(e.cq, 2)
    assert [(w.wr_id, w.wc_type, w.status) for w in wcs] == [
        (20, WcType.RECV, WcStatus.WR_FLUSHED_ERR), (21, WcType.RECV, WcStatus.WR_FLUSHED_ERR),
    ]  # fmt: skip


def test_post_send_outside_rts_is_refused(env: Env) -> None:
    e = env
    qp = e.pd.create_qp(QpCreate(QpType.RC, e.cq, e.cq))
    with pytest.raises(InvalidQpState) as info:
        qp.post_send(SendWr(1, WrType.SEND, [e.mr.sge(0, 1)], SIG))
    assert isinstance(info.value, PostError) and info.value.failed_index == 0


def test_srq_limit_event_reaches_the_consumer(env: Env) -> None:
    e = env
    got: list[AsyncEventRec] = []
    srq = e.pd.create_srq(SrqAttr(16, 1, 0), event_cb=got.append)
    srq.post_recv([RecvWr(i, [e.mr.sge(5000 + 64 * i, 64)]) for i in range(4)])
    srq.modify(SrqAttr(16, 1, 3), SrqAttrMask.LIMIT)
    s = e.pd.create_qp(QpCreate(QpType.UD, e.cq, e.cq, srq=srq))
    s.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, qkey=QKEY))
    s.modify(QpMod(QpState.RTR))
    s.modify(QpMod(QpState.RTS, sq_psn=0))
    a = ud_qp(e)
    av_h = e.pd.create_av(av(e))
    a.post_send([SendWr(30 + i, WrType.SEND, [e.mr.sge(0, 8)], SIG, ud=UdDest(av_h, s.num, QKEY))
                 for i in range(2)])  # fmt: skip
    poll(e.cq, 4)
    wait_for(lambda: bool(got))
    assert got[0].code is AsyncEvent.SRQ_LIMIT_REACHED
    assert srq.query().srq_limit == 0  # the limit disarms when it fires


def test_sqd_drained_event(env: Env) -> None:
    e = env
    got: list[AsyncEventRec] = []
    a = e.pd.create_qp(QpCreate(QpType.RC, e.cq, e.cq), event_cb=got.append)
    b = e.pd.create_qp(QpCreate(QpType.RC, e.cq, e.cq))
    for qp, peer in ((a, b), (b, a)):
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=ALL))
        qp.modify(
            QpMod(
                QpState.RTR,
                primary_av=av(e),
                path_mtu=Mtu.MTU_1024,
                dest_qp=peer.num,
                rq_psn=0,
                resp_res=1,
                rnr_nak_timeout=12,
            )
        )
        qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                        rnr_retry_cnt=7, init_depth=1))  # fmt: skip
    a.modify(QpMod(QpState.SQD, sqd_event=True))
    wait_for(lambda: bool(got))
    assert got[0].code is AsyncEvent.SQ_DRAINED
    assert a.query().state is QpState.SQD
    a.modify(QpMod(QpState.RTS))


def test_memory_window_bind_and_busy_region(env: Env) -> None:
    e = env
    a, b = rc_pair(e)
    mw = e.pd.create_mw()
    rkey = mw.bind(a, BindWr(e.mr, e.mr.vaddr + 8192, 4096, AccessFlags.RDMA_WRITE,
                             mw.rkey, wr_id=55))  # fmt: skip
    (wc,) = poll(e.cq, 1)
    assert (wc.wr_id, wc.wc_type, wc.status) == (55, WcType.MW_BIND, WcStatus.SUCCESS)
    e.buf[0:4] = b"mw!!"
    b.post_send(SendWr(56, WrType.RDMA_WRITE, [e.mr.sge(0, 4)], SIG,
                       remote_addr=e.mr.vaddr + 8192, rkey=rkey))  # fmt: skip
    (wc,) = poll(e.cq, 1)
    assert wc.status is WcStatus.SUCCESS and bytes(e.buf[8192:8196]) == b"mw!!"
    with pytest.raises(ResourceBusy):
        e.mr.dereg()
    mw.destroy()


def test_reregistration_gives_new_keys(env: Env) -> None:
    e = env
    other = bytearray(4096)
    mr = e.pd.reg_mem(other, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
    old = (mr.lkey, mr.rkey)
    from ibal.types import MrModMask

    mr.rereg(MrModMask.ACCESS, access=AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ)
    assert (mr.lkey, mr.rkey) != old
    assert mr.query().access == AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ
    mr.dereg()


def test_multicast_attach_detach(env: Env) -> None:
    e = env
    qp = ud_qp(e)
    m = qp.attach_mcast("ff0e::ffff:e000:101", 0)
    m.detach()


ON_LO_REASON = "kernel rxe on lo does not deliver IPv6 multicast datagrams"


def test_multicast_datagram_reaches_attached_qps(env: Env) -> None:
    e = env
    if any(str(g) == "::ffff:7f00:1" for g in e.port.gids):
        pytest.skip(ON_LO_REASON)
    group = "ff12:401b:ffff::c0de"
    r1, r2, sender = ud_qp(e), ud_qp(e), ud_qp(e)
    attached = [r.attach_mcast(group, 0) for r in (r1, r2)]
    for i, r in enumerate((r1, r2)):
        r.post_recv(RecvWr(70 + i, [e.mr.sge(6000 + 256 * i, 256)]))
    av_h = e.pd.create_av(AvAttr(1, grh=Grh(IPv6Address(group))))
    e.buf[0:5] = b"group"
    sender.post_send(SendWr(72, WrType.SEND, [e.mr.sge(0, 5)], SIG,
                            ud=UdDest(av_h, 0xFFFFFF, QKEY)))  # fmt: skip
    wcs = {w.wr_id: w for w in poll(e.cq, 3)}
    assert wcs[72].status is WcStatus.SUCCESS
    for i in range(2):
        assert wcs[70 + i].status is WcStatus.SUCCESS and wcs[70 + i].src_qp == sender.num
        assert bytes(e.buf[6040 + 256 * i : 6045 + 256 * i]) == b"group"
    for m in attached:
        m.detach()


# ------------------------------------------------- connection helpers, GIDs, headers


def test_gid_table_has_types_and_netdevs(env: Env) -> None:
    e = env
    table = e.ca.query_port(e.port.port_num).gid_table
    v4 = [g for g in table if g.is_ipv4]
    assert v4, table  # rxe lists the netdev's IPv4 address as an IPv4-mapped GID
    entry = v4[0]
    assert entry.gid_type is GidType.ROCE_V2
    assert entry.network_header is NetworkHeader.IPV4
    assert entry.netdev in ("lo", "eth0") and socket.if_nametoindex(entry.netdev) > 0
    assert all(g.netdev == entry.netdev for g in table)
    assert e.ca.find_gid(e.port.port_num, entry.gid) == entry.index
    assert e.ca.gid_entry(e.port.port_num, entry.index) == entry
    with pytest.raises(NotFound):
        e.ca.find_gid(e.port.port_num, "2001:db8::dead")
    assert e.ca.find_pkey(e.port.port_num, 0xFFFF) == 0


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_connect_helper_moves_data(env: Env, qp_type: QpType) -> None:
    e = env
    a, b = (e.pd.create_qp(QpCreate(qp_type, e.cq, e.cq)) for _ in range(2))
    ea, eb = ibal.endpoint(a, e.port.port_num), ibal.endpoint(b, e.port.port_num)
    assert ea.gid is not None and ea.gid.ipv4_mapped is not None and ea.lid == 0
    path = ibal.connect_qp(a, ea, eb)
    ibal.connect_qp(b, eb, ea)
    assert path.grh is not None and path.grh.dgid == eb.gid
    assert a.state is QpState.RTS and b.state is QpState.RTS
    b.post_recv(RecvWr(80, [e.mr.sge(5000, 64)]))
    e.buf[0:9] = b"connected"
    a.post_send(SendWr(81, WrType.SEND, [e.mr.sge(0, 9)], SIG))
    e.buf[64:70] = b"write!"
    a.post_send(SendWr(82, WrType.RDMA_WRITE, [e.mr.sge(64, 6)], SIG,
                       remote_addr=e.mr.vaddr + 5200, rkey=e.mr.rkey))  # fmt: skip
    wcs = {w.wr_id: w for w in e.cq.wait(10.0, min_entries=3)}
    assert sorted(wcs) == [80, 81, 82]
    assert all(w.status is WcStatus.SUCCESS for w in wcs.values()), wcs
    assert bytes(e.buf[5000:5009]) == b"connected" and bytes(e.buf[5200:5206]) == b"write!"


def test_ud_receive_says_ipv4_header(env: Env) -> None:
    e = env
    a, b = (e.pd.create_qp(QpCreate(QpType.UD, e.cq, e.cq)) for _ in range(2))
    ea, eb = ibal.endpoint(a, e.port.port_num), ibal.endpoint(b, e.port.port_num)
    av_h = e.pd.create_av(ibal.connect_qp(a, ea, eb))
    ibal.connect_qp(b, eb, ea)
    e.buf[7000:7040] = bytes(40)
    b.post_recv(RecvWr(90, [e.mr.sge(7000, 40 + 64)]))
    e.buf[0:4] = b"v4v4"
    a.post_send(SendWr(91, WrType.SEND, [e.mr.sge(0, 4)], SIG, ud=eb.ud_dest(av_h)))
    wcs = {w.wr_id: w for w in e.cq.wait(10.0, min_entries=2)}
    r = wcs[90]
    assert r.status is WcStatus.SUCCESS and r.recv_opt & RecvOpt.GRH_VALID
    assert r.network_header is NetworkHeader.IPV4
    area = bytes(e.buf[7000:7040])
    assert area[:20] == bytes(20) and area[20] >> 4 == 4  # 20 zero bytes + an IPv4 header
    assert bytes(e.buf[7040:7044]) == b"v4v4"


def test_cq_wait_with_and_without_completions(env: Env) -> None:
    e = env
    assert e.cq.wait(0.05) == []
    a, b = rc_pair(e)
    b.post_recv(RecvWr(95, [e.mr.sge(0, 16)]))
    a.post_send(SendWr(96, WrType.SEND, [e.mr.sge(100, 4)], SIG))
    got = e.cq.wait(10.0, min_entries=2)
    assert sorted(w.wr_id for w in got) == [95, 96]


# ------------------------------------------------------------------ one QP state


def test_posts_in_error_flush_signaled_and_unsignaled(env: Env) -> None:
    """IBA 10.8.3: sends and receives posted to a QP in ERROR complete WR_FLUSHED_ERR."""
    e = env
    a, _ = rc_pair(e, sq_signaled=False)
    a.modify(QpMod(QpState.ERROR))
    a.post_send([SendWr(60 + i, WrType.SEND, [e.mr.sge(0, 8)], SIG if i % 2 else SendOpt.NONE)
                 for i in range(4)])  # fmt: skip
    a.post_recv(RecvWr(70, [e.mr.sge(64, 8)]))
    wcs = sorted(poll(e.cq, 5), key=lambda w: w.wr_id)
    assert [(w.wr_id, w.status, w.qp_num) for w in wcs] == [
        (i, WcStatus.WR_FLUSHED_ERR, a.num) for i in (60, 61, 62, 63, 70)
    ]
    assert a.state is QpState.ERROR and a.query().state is QpState.ERROR


def test_rc_error_completion_moves_the_al_state(env: Env) -> None:
    """A polled RC error completion moves qp.state to ERROR; posts then flush."""
    e = env
    a, _ = rc_pair(e)
    bad = e.mr.sge(0, 8)
    bad = type(bad)(bad.addr, bad.length, bad.lkey ^ 0x00FF_FF00)
    a.post_send(SendWr(80, WrType.SEND, [bad], SIG))
    (wc,) = poll(e.cq, 1)
    assert wc.wr_id == 80 and wc.status not in (WcStatus.SUCCESS, WcStatus.WR_FLUSHED_ERR)
    assert a.state is QpState.ERROR
    wait_for(lambda: a.query().state is QpState.ERROR)
    a.post_send(SendWr(81, WrType.RDMA_WRITE, [e.mr.sge(0, 8)], SendOpt.NONE))
    assert [(w.wr_id, w.status) for w in poll(e.cq, 1)] == [(81, WcStatus.WR_FLUSHED_ERR)]
    # A receive too: rxe flushes it only if the provider knows the kernel moved the QP.
    a.post_recv(RecvWr(82, [e.mr.sge(0, 8)]))
    assert [(w.wr_id, w.status) for w in poll(e.cq, 1)] == [(82, WcStatus.WR_FLUSHED_ERR)]


def test_drain_returns_when_everything_has_completed(env: Env) -> None:
    """qp.drain(): ERROR, marker send and receive, wait for their flushes."""
    e = env
    a, _ = rc_pair(e)
    a.post_recv([RecvWr(90 + i, [e.mr.sge(128, 8)]) for i in range(3)])
    wcs = a.drain(timeout=30)
    assert [(w.wr_id, w.status, w.wc_type) for w in wcs] == [
        (90 + i, WcStatus.WR_FLUSHED_ERR, WcType.RECV) for i in range(3)
    ]
    assert a.state is QpState.ERROR
    assert e.cq.poll() == []
    u = ud_qp(e)
    u.post_recv(RecvWr(95, [e.mr.sge(256, 128)]))
    assert [(w.wr_id, w.status) for w in u.drain(timeout=30)] == [(95, WcStatus.WR_FLUSHED_ERR)]
