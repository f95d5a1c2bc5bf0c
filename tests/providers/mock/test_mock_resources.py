"""Handle checks, ResourceBusy rules, limits and the other verb statuses (ci-contract §4)."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv6Address
from typing import Any

import pytest
from mockenv import ACCESS, UD_QKEY, Node, connect, open_node, to_rts, ud_ready

from ibal.providers.mock import MockFabric
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidApmState,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidCqSize,
    InvalidGid,
    InvalidLid,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidMcastHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPermission,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidQpState,
    InvalidRkey,
    InvalidServiceType,
    InvalidSetting,
    InvalidSrqHandle,
    InvalidState,
    InvalidWrType,
    MaxMcastQpsReached,
    Overflow,
    PostError,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    AccessFlags,
    ApmState,
    AsyncEvent,
    AvAttr,
    BindWr,
    EventRecord,
    MrModMask,
    Mtu,
    PdType,
    PhysCreate,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    UdDest,
    WcStatus,
    WrType,
)

MGID = IPv6Address("ff12:601b:ffff::1")


def raises_post(exc: type[IbError], index: int, fn: Callable[[], Any]) -> None:
    with pytest.raises(exc) as err:
        fn()
    assert isinstance(err.value, PostError)
    assert err.value.failed_index == index


# ===================================================================== CA


def test_open_ca_rules(fabric: MockFabric) -> None:
    ca = fabric.cas[0]
    with pytest.raises(InvalidParameter):
        ca.open_ca(None, lambda r: None, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        ca.open_ca(lambda c: None, None, None)  # type: ignore[arg-type]
    h = ca.open_ca(lambda c: None, lambda r: None, "ctx")
    with pytest.raises(ResourceBusy):
        ca.open_ca(lambda c: None, lambda r: None, "again")
    ca.close_ca(h)
    with pytest.raises(InvalidCaHandle):
        ca.close_ca(h)
    with pytest.raises(InvalidCaHandle):
        ca.query_ca(h)
    h2 = ca.open_ca(lambda c: None, lambda r: None, "reopened")
    assert ca.query_ca(h2).ca_guid == ca.guid
    ca.close_ca(h2)


def test_close_ca_while_resources_remain(a: Node) -> None:
    with pytest.raises(ResourceBusy):
        a.ca.close_ca(a.h)
    assert a.ca.query_ca(a.h)  # still open and usable


def test_close_ca_releases_once_everything_is_gone(a: Node) -> None:
    a.ca.deregister_mr(a.mr.handle)
    a.ca.destroy_cq(a.cq)
    a.ca.deallocate_pd(a.pd)
    a.ca.close_ca(a.h)
    assert all(v == 0 for v in a.ca.resource_counts().values())


def test_no_callback_after_close(fabric: MockFabric) -> None:
    ca = fabric.cas[0]
    seen: list[Any] = []
    h = ca.open_ca(seen.append, seen.append, "ctx")
    ca.close_ca(h)
    with pytest.raises(InvalidState):
        ca.inject_async_event(EventRecord(AsyncEvent.LOCAL_FATAL, None))
    fabric.set_link(ca.ports[0], up=False)
    assert seen == []


def test_destroys_from_inside_a_callback_are_refused(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    refused: list[str] = []

    def on_completion(ctx: Any) -> None:
        for name, call in (
            ("destroy_qp", lambda: b.ca.destroy_qp(qb)),
            ("destroy_cq", lambda: b.ca.destroy_cq(b.cq)),
            ("close_ca", lambda: b.ca.close_ca(b.h)),
        ):
            try:
                call()
            except InvalidState:
                refused.append(name)

    b.ca.opened.completion_cb = on_completion  # type: ignore[union-attr]
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)])])
    b.ca.enable_cq_notify(b.cq, False)
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert refused == ["destroy_qp", "destroy_cq", "close_ca"]
    assert b.ca.query_qp(qb).state is QpState.RTS


def test_query_ca_identity(fabric: MockFabric) -> None:
    fabric.add_ca(ports=2, pkeys=[0x7FFF])
    ca = fabric.cas[2]
    n = open_node(ca)
    attr = ca.query_ca(n.h)
    assert attr.ca_guid == ca.guid and ca.guid >> 40 == 0x021BA1  # EUI-64 under the OUI
    assert attr.num_ports == 2 and attr.max_qps > 0 and attr.max_mr_size > 0
    p1, p2 = attr.ports
    assert p1.port_guid == ca.guid | 1 and p2.port_guid == ca.guid | 2
    assert p1.lid != p2.lid and all(1 <= p.lid <= 0xBFFF for p in attr.ports)
    assert p1.gids[0] == IPv6Address((0xFE80 << 112) | p1.port_guid)
    assert p1.pkeys == (0xFFFF, 0x7FFF)
    assert p1.link_state.name == "ACTIVE" and p1.active_mtu is Mtu.MTU_4096
    assert p1.sm_lid == fabric.cas[0].ports[0].lid
    assert attr.atomicity.name == "GLOBAL"
    lids = [p.lid for c in fabric.cas for p in c.ports]
    assert len(set(lids)) == len(lids)


def test_modify_ca(a: Node) -> None:
    from ibal.types import CaMod, PortAttrMod, PortCap

    ca = a.ca
    with pytest.raises(InvalidPort):
        ca.modify_ca(a.h, 2, CaMod.IS_CM_SUPPORTED, PortAttrMod(cap=PortCap.IS_CM_SUPPORTED))
    with pytest.raises(InvalidParameter):
        ca.modify_ca(a.h, 1, CaMod(1 << 30), PortAttrMod())
    ca.modify_ca(a.h, 1, CaMod.IS_CM_SUPPORTED, PortAttrMod(cap=PortCap.IS_CM_SUPPORTED))
    assert ca.query_ca(a.h).ports[0].cap & PortCap.IS_CM_SUPPORTED
    ca.modify_ca(a.h, 1, CaMod.IS_CM_SUPPORTED, PortAttrMod())
    assert not ca.query_ca(a.h).ports[0].cap & PortCap.IS_CM_SUPPORTED
    ca.ports[0].qkey_violations = ca.ports[0].pkey_violations = 5
    ca.modify_ca(a.h, 1, CaMod.QKEY_CTR, PortAttrMod())
    port = ca.query_ca(a.h).ports[0]
    assert (port.qkey_violations, port.pkey_violations) == (0, 5)
    ca.modify_ca(a.h, 1, CaMod.PKEY_CTR, PortAttrMod())
    assert ca.query_ca(a.h).ports[0].pkey_violations == 0


def test_modify_ca_counters_unsupported(fabric: MockFabric) -> None:
    from ibal.types import CaMod, PortAttrMod

    n = open_node(fabric.add_ca(violation_counters=False))
    assert not n.ca.capabilities.violation_counters
    assert "violation_counters" in n.ca.capabilities.reasons
    with pytest.raises(Unsupported):
        n.ca.modify_ca(n.h, 1, CaMod.QKEY_CTR, PortAttrMod())


def test_vendor_call(a: Node, b: Node) -> None:
    import json

    from ibal.status import Error, InvalidHandle
    from ibal.types import CiOp

    out = a.ca.vendor_call(a.h, [], CiOp(1, b"ping"))
    assert out.out == b"ping" and out.status == 0
    qp = a.qp()
    desc = json.loads(a.ca.vendor_call(a.h, [qp, a.cq], CiOp(3)).out)
    assert desc[0]["qp_num"] == qp.num and desc[1]["kind"] == "cq"
    counters = json.loads(a.ca.vendor_call(a.h, [], CiOp(2)).out)
    assert "sent" in counters
    with pytest.raises(InvalidParameter):
        a.ca.vendor_call(a.h, [], None)  # type: ignore[arg-type]
    with pytest.raises(InvalidHandle):
        a.ca.vendor_call(a.h, [b.pd], CiOp(1))  # another CA's handle
    op = CiOp(0x77)
    with pytest.raises(Error):
        a.ca.vendor_call(a.h, [], op)
    assert op.status != 0


# ================================================================ PD / AV


def test_pd_rules(fabric: MockFabric) -> None:
    n = open_node(fabric.add_ca(max_pds=3))
    with pytest.raises(InvalidCaHandle):
        n.ca.allocate_pd(object(), PdType.NORMAL)
    pds = [n.ca.allocate_pd(n.h, t) for t in (PdType.UD, PdType.ALIAS)]
    with pytest.raises(InsufficientResources):
        n.ca.allocate_pd(n.h, PdType.SQP)
    with pytest.raises(ResourceBusy):
        n.ca.deallocate_pd(n.pd)  # the MR uses it
    n.ca.deallocate_pd(pds[0])
    with pytest.raises(InvalidPdHandle):
        n.ca.deallocate_pd(pds[0])
    n.ca.allocate_pd(n.h, PdType.SQP)
    with pytest.raises(InvalidParameter):
        n.ca.allocate_pd(n.h, 42)  # type: ignore[arg-type]


def test_pd_busy_for_every_kind_of_user(a: Node) -> None:
    pd = a.ca.allocate_pd(a.h, PdType.NORMAL)
    users = [
        (a.ca.create_av(pd, AvAttr(1, dlid=1)), a.ca.destroy_av),
        (a.ca.create_mw(pd).handle, a.ca.destroy_mw),
        (a.ca.create_srq(pd, SrqAttr(4, 1, 0), None).handle, a.ca.destroy_srq),
        (a.ca.register_mr(pd, memoryview(bytearray(8)), 0, AccessFlags.NONE).handle,
         a.ca.deregister_mr),
        (a.ca.create_qp(pd, QpType.UD, QpCaps(), a.cq, a.cq, None, True, None).handle,
         a.ca.destroy_qp),
    ]
    for handle, destroy in users:
        with pytest.raises(ResourceBusy):
            a.ca.deallocate_pd(pd)
        destroy(handle)
    a.ca.deallocate_pd(pd)


def test_av_rules(a: Node, b: Node) -> None:
    with pytest.raises(InvalidPdHandle):
        a.ca.create_av(b.pd, AvAttr(1, dlid=1))
    with pytest.raises(InvalidParameter):
        a.ca.create_av(a.pd, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidPort):
        a.ca.create_av(a.pd, AvAttr(3, dlid=1))
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=5, sl=2))
    assert a.ca.query_av(av) == AvAttr(1, dlid=5, sl=2)
    a.ca.modify_av(av, AvAttr(1, dlid=6))
    assert a.ca.query_av(av).dlid == 6
    with pytest.raises(InvalidPort):
        a.ca.modify_av(av, AvAttr(9, dlid=6))
    a.ca.destroy_av(av)
    for call in (a.ca.query_av, a.ca.destroy_av):
        with pytest.raises(InvalidAvHandle):
            call(av)


# ==================================================================== QP


def test_create_qp_statuses(fabric: MockFabric) -> None:
    n = open_node(fabric.add_ca(max_qps=2, max_wrs=64, max_sges=4))
    other = open_node(fabric.cas[0])
    ca = n.ca

    def create(**kw: Any) -> Any:
        args: dict[str, Any] = {
            "h_pd": n.pd, "qp_type": QpType.RC, "caps": QpCaps(), "send_cq": n.cq,
            "recv_cq": n.cq, "srq": None, "sq_signaled": True, "qp_context": None,
        }
        args.update(kw)
        return ca.create_qp(**args)

    for kw, exc in (
        ({"h_pd": other.pd}, InvalidPdHandle),
        ({"send_cq": other.cq}, InvalidCqHandle),
        ({"recv_cq": "junk"}, InvalidCqHandle),
        ({"srq": other.pd}, InvalidSrqHandle),
        ({"caps": QpCaps(sq_depth=65)}, InvalidMaxWrs),
        ({"caps": QpCaps(rq_depth=65)}, InvalidMaxWrs),
        ({"caps": QpCaps(sq_sge=5)}, InvalidMaxSge),
        ({"caps": QpCaps(max_inline=1 << 20)}, InvalidSetting),
        ({"qp_type": QpType.QP1}, InvalidServiceType),
        ({"qp_type": QpType.RD}, Unsupported),
    ):
        with pytest.raises(exc):
            create(**kw)
    created = create()
    assert created.attr.state is QpState.RESET and created.attr.qp_num >= 2
    assert created.attr.caps == QpCaps()
    create(qp_type=QpType.UD)
    with pytest.raises(InsufficientResources):
        create(qp_type=QpType.UC)
    assert ca.resource_counts()["qp"] == 2  # the failures left nothing behind
    pd2 = ca.allocate_pd(n.h, PdType.NORMAL)
    with pytest.raises(InvalidMaxWrs):
        create(h_pd=pd2, caps=QpCaps(sq_depth=1000))
    ca.deallocate_pd(pd2)  # nothing kept a reference


def test_special_qp_rules(a: Node) -> None:
    caps = QpCaps(8, 8, 1, 1, 0)
    a.ca.create_spl_qp(a.pd, 1, QpType.QP1, caps, a.cq, a.cq, None)
    with pytest.raises(ResourceBusy):
        a.ca.create_spl_qp(a.pd, 1, QpType.QP1, caps, a.cq, a.cq, None)
    with pytest.raises(InvalidPort):
        a.ca.create_spl_qp(a.pd, 2, QpType.QP0, caps, a.cq, a.cq, None)
    with pytest.raises(Unsupported):
        a.ca.create_spl_qp(a.pd, 1, QpType.RAW_ETHER, caps, a.cq, a.cq, None)
    with pytest.raises(InvalidServiceType):
        a.ca.create_spl_qp(a.pd, 1, QpType.RC, caps, a.cq, a.cq, None)
    qp0 = a.ca.create_spl_qp(a.pd, 1, QpType.QP0, caps, a.cq, a.cq, None)
    assert qp0.attr.qp_num == 0
    a.ca.destroy_qp(qp0.handle)
    a.ca.create_spl_qp(a.pd, 1, QpType.QP0, caps, a.cq, a.cq, None)  # free again


def test_modify_qp_statuses(a: Node, b: Node) -> None:
    qp = a.qp()
    with pytest.raises(InvalidQpState):
        a.ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0))
    with pytest.raises(InvalidPkey):
        a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=5, port_num=1, access=ACCESS))
    with pytest.raises(InvalidPort):
        a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=2, access=ACCESS))
    with pytest.raises(InvalidParameter):  # a required attribute missing (state table)
        a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0))
    assert a.ca.query_qp(qp).state is QpState.RESET  # failures change nothing
    a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=1, access=ACCESS))
    rtr: dict[str, Any] = {
        "primary_av": AvAttr(1, dlid=b.lid), "path_mtu": Mtu.MTU_1024, "dest_qp": 5,
        "rq_psn": 0, "resp_res": 1, "rnr_nak_timeout": 1,
    }
    with pytest.raises(InvalidPort):  # an alternate path (APM) on a port the CA lacks
        a.ca.modify_qp(qp, QpMod(QpState.RTR, alternate_av=AvAttr(2, dlid=b.lid), **rtr))
    with pytest.raises(InvalidSetting):
        a.ca.modify_qp(qp, QpMod(QpState.RTR, **{**rtr, "resp_res": 99}))
    attr = a.ca.modify_qp(qp, QpMod(QpState.RTR, **rtr))
    assert attr.state is QpState.RTR and attr.dest_qp == 5
    with pytest.raises(InvalidApmState):
        a.ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                                 rnr_retry_cnt=7, init_depth=1, apm_state=ApmState.ARMED))
    attr = a.ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0x123, local_ack_timeout=14,
                                    retry_cnt=7, rnr_retry_cnt=6, init_depth=1))
    q = a.ca.query_qp(qp)
    assert q == attr and (q.state, q.sq_psn, q.rnr_retry_cnt, q.port_num) == (
        QpState.RTS, 0x123, 6, 1)
    a.ca.destroy_qp(qp)
    for call in (a.ca.query_qp, a.ca.destroy_qp):
        with pytest.raises(InvalidQpHandle):
            call(qp)
    with pytest.raises(InvalidQpHandle):
        a.ca.modify_qp(qp, QpMod(QpState.ERROR))


def test_modify_qp_resizes_the_work_queues(a: Node, b: Node) -> None:
    qa, qb = connect(a, b, caps=QpCaps(sq_depth=4, rq_depth=4))
    assert a.ca.capabilities.resize_qp
    b.ca.modify_qp(qb, QpMod(QpState.RTS, rq_depth=2))
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)]), RecvWr(2, [b.sge(8, 8)])])
    raises_post(InsufficientResources, 0, lambda: b.ca.post_recv(qb, [RecvWr(3, [b.sge(0, 8)])]))
    with pytest.raises(InvalidMaxWrs):  # never below what the queue holds
        b.ca.modify_qp(qb, QpMod(QpState.RTS, rq_depth=1))
    attr = a.ca.modify_qp(qa, QpMod(QpState.RTS, sq_depth=8))
    assert attr.caps.sq_depth == a.ca.query_qp(qa).caps.sq_depth == 8
    a.ca.modify_qp(qa, QpMod(QpState.SQD))
    raises_post(InsufficientResources, 8, lambda: a.ca.post_send(
        qa, [SendWr(i, WrType.RDMA_WRITE, [a.sge(0, 8)], remote_addr=b.addr(64),
                    rkey=b.mr.rkey) for i in range(9)]))
    with pytest.raises(InvalidMaxWrs):
        a.ca.modify_qp(qa, QpMod(QpState.RTS, sq_depth=7))
    with pytest.raises(InvalidMaxWrs):
        a.ca.modify_qp(qa, QpMod(QpState.RTS, sq_depth=a.ca.limits.max_wrs + 1))
    a.ca.modify_qp(qa, QpMod(QpState.RTS, sq_depth=8))  # SQD -> RTS: the 8 go out
    assert [w.status for w in a.poll()] == [WcStatus.SUCCESS] * 8


def test_destroy_qp_attached_to_multicast_is_busy(a: Node) -> None:
    ud = a.qp(QpType.UD)
    m = a.ca.attach_mcast(ud, MGID, 0xC005)
    with pytest.raises(ResourceBusy):
        a.ca.destroy_qp(ud)
    a.ca.detach_mcast(m)
    a.ca.destroy_qp(ud)


# =================================================================== SRQ


def test_srq_rules(fabric: MockFabric) -> None:
    n = open_node(fabric.add_ca(max_srqs=1, max_srq_wrs=8, max_srq_sges=2))
    with pytest.raises(InvalidMaxWrs):
        n.ca.create_srq(n.pd, SrqAttr(9, 1, 0), None)
    with pytest.raises(InvalidMaxSge):
        n.ca.create_srq(n.pd, SrqAttr(4, 3, 0), None)
    with pytest.raises(InvalidSetting):
        n.ca.create_srq(n.pd, SrqAttr(4, 1, 5), None)
    srq = n.ca.create_srq(n.pd, SrqAttr(2, 2, 0), "s").handle
    with pytest.raises(InsufficientResources):
        n.ca.create_srq(n.pd, SrqAttr(2, 1, 0), None)
    raises_post(InvalidMaxSge, 0, lambda: n.ca.post_srq_recv(srq, [RecvWr(1, [n.sge(0, 1)] * 3)]))
    raises_post(InsufficientResources, 2,
                lambda: n.ca.post_srq_recv(srq, [RecvWr(i, []) for i in range(3)]))
    raises_post(InvalidSrqHandle, 0, lambda: n.ca.post_srq_recv(n.pd, [RecvWr(1, [])]))
    with pytest.raises(InvalidSetting):
        n.ca.modify_srq(srq, SrqAttr(max_wr=1), SrqAttrMask.MAX_WR)  # 2 are posted
    n.ca.modify_srq(srq, SrqAttr(max_wr=8), SrqAttrMask.MAX_WR)
    assert n.ca.query_srq(srq) == SrqAttr(8, 2, 0)
    with pytest.raises(InvalidParameter):
        n.ca.modify_srq(srq, SrqAttr(), SrqAttrMask(0))
    qp = n.qp(srq=srq)
    raises_post(InvalidParameter, 0, lambda: n.ca.post_recv(qp, [RecvWr(1, [])]))
    with pytest.raises(ResourceBusy):
        n.ca.destroy_srq(srq)
    n.ca.destroy_qp(qp)
    n.ca.destroy_srq(srq)
    with pytest.raises(InvalidSrqHandle):
        n.ca.query_srq(srq)


# ==================================================================== CQ


def test_cq_rules(fabric: MockFabric) -> None:
    n = open_node(fabric.add_ca(max_cqes=100, max_cqs=2), cq_size=64)
    with pytest.raises(InvalidCaHandle):
        n.ca.create_cq(object(), 4, None)
    with pytest.raises(InvalidCqSize):
        n.ca.create_cq(n.h, 101, None)
    with pytest.raises(InvalidCqSize):
        n.ca.create_cq(n.h, 0, None)
    cq, size = n.ca.create_cq(n.h, 10, "c")
    assert size >= 10 and n.ca.query_cq(cq) == size
    with pytest.raises(InsufficientResources):
        n.ca.create_cq(n.h, 4, None)
    qp = n.qp(QpType.UD, cq=cq)
    ud_ready(n, qp)
    n.ca.post_recv(qp, [RecvWr(i, []) for i in range(5)])
    n.ca.modify_qp(qp, QpMod(QpState.ERROR))  # five flush completions
    assert n.ca.peek_cq(cq) == 5
    with pytest.raises(Overflow):
        n.ca.resize_cq(cq, 4)
    assert n.ca.query_cq(cq) == size and n.ca.peek_cq(cq) == 5
    with pytest.raises(InvalidCqSize):
        n.ca.resize_cq(cq, 1000)
    assert n.ca.resize_cq(cq, 50) >= 50
    assert [w.wr_id for w in n.ca.poll_cq(cq, 2)] == [0, 1]  # in order, at most max
    assert [w.wr_id for w in n.ca.poll_cq(cq, 9)] == [2, 3, 4]
    assert n.ca.poll_cq(cq, 9) == []
    with pytest.raises(ResourceBusy):
        n.ca.destroy_cq(cq)
    n.ca.destroy_qp(qp)
    n.ca.destroy_cq(cq)
    for call in (n.ca.query_cq, n.ca.peek_cq, n.ca.destroy_cq):
        with pytest.raises(InvalidCqHandle):
            call(cq)
    with pytest.raises(InvalidCqHandle):
        n.ca.poll_cq(cq, 1)


def test_cq_notification_rules(a: Node) -> None:
    ud = a.qp(QpType.UD)
    ud_ready(a, ud)

    def flush(k: int) -> None:
        a.ca.modify_qp(ud, QpMod(QpState.ERROR))
        a.ca.post_recv(ud, [RecvWr(i, []) for i in range(k)])

    flush(2)
    assert a.notified == []  # not armed: no callback
    a.ca.enable_cq_notify(a.cq, False)
    assert a.notified == []  # entries present at arm time do not fire it
    flush(2)
    assert a.notified == [f"{a.ca.name}-cq"]  # once
    flush(1)
    assert len(a.notified) == 1
    with pytest.raises(InvalidParameter):
        a.ca.enable_ncomp_cq_notify(a.cq, 0)
    with pytest.raises(InvalidParameter):
        a.ca.enable_ncomp_cq_notify(a.cq, 257)
    a.ca.enable_ncomp_cq_notify(a.cq, 3)
    flush(2)
    assert len(a.notified) == 1
    flush(1)
    assert len(a.notified) == 2


def test_no_completion_callback_after_destroy_cq(a: Node) -> None:
    cq, _ = a.ca.create_cq(a.h, 8, "gone")
    a.ca.enable_cq_notify(cq, False)
    a.ca.destroy_cq(cq)
    assert a.notified == []


# ==================================================================== MR


def test_register_mr_rules(a: Node, b: Node) -> None:
    with pytest.raises(InvalidPdHandle):
        a.ca.register_mr(b.pd, memoryview(bytearray(8)), 0, AccessFlags.NONE)
    with pytest.raises(InvalidParameter):
        a.ca.register_mr(a.pd, None, 0, AccessFlags.NONE)  # type: ignore[arg-type]
    with pytest.raises(InvalidPermission):
        a.ca.register_mr(a.pd, memoryview(bytearray(8)), 0, AccessFlags.RDMA_WRITE)
    with pytest.raises(InvalidPermission):
        a.ca.register_mr(a.pd, memoryview(b"read only"), 0, AccessFlags.LOCAL_WRITE)
    local = a.ca.register_mr(a.pd, memoryview(bytearray(8)), 0x10, AccessFlags.LOCAL_WRITE)
    assert local.lkey and local.rkey == 0  # no remote access: no rkey
    remote = a.ca.register_mr(a.pd, memoryview(bytearray(8)), 0x10,
                              AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ)
    assert remote.rkey and remote.lkey != local.lkey
    attr = a.ca.query_mr(remote.handle)
    assert (attr.local_lb, attr.local_ub, attr.lkey, attr.rkey) == (
        0x10, 0x18, remote.lkey, remote.rkey)
    assert attr.access == AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ
    ro = a.ca.register_mr(a.pd, memoryview(b"constant"), 0, AccessFlags.RDMA_READ)
    assert ro.length == 8


def test_register_pmr_rules(a: Node) -> None:
    pages = [memoryview(bytearray(4096)) for _ in range(2)]
    for create in (
        PhysCreate(pages, 3000, 100, AccessFlags.LOCAL_WRITE),  # not a power of two
        PhysCreate(pages, 4096, 9000, AccessFlags.LOCAL_WRITE),  # does not fit
        PhysCreate(pages, 4096, 10, AccessFlags.LOCAL_WRITE, buf_offset=5000),
        PhysCreate([], 4096, 10, AccessFlags.LOCAL_WRITE),
        PhysCreate([memoryview(bytearray(100))], 4096, 10, AccessFlags.LOCAL_WRITE),
    ):
        with pytest.raises(InvalidParameter):
            a.ca.register_pmr(a.pd, create, 0)
    with pytest.raises(InvalidPermission):
        a.ca.register_pmr(a.pd, PhysCreate(pages, 4096, 100, AccessFlags.ATOMIC), 0)
    keys = a.ca.register_pmr(a.pd, PhysCreate(pages, 4096, 100, AccessFlags.LOCAL_WRITE), 0)
    attr = a.ca.query_mr(keys.handle)
    assert attr.local_lb == keys.vaddr and attr.local_ub == keys.vaddr + 100


def test_modify_mr_rules(a: Node, b: Node) -> None:
    mr = a.ca.register_mr(a.pd, memoryview(bytearray(64)), 0x40,
                          AccessFlags.LOCAL_WRITE | AccessFlags.MW_BIND)
    with pytest.raises(InvalidParameter):
        a.ca.modify_mr(mr.handle, MrModMask(0), None, None, None, None)
    with pytest.raises(InvalidParameter):
        a.ca.modify_mr(mr.handle, MrModMask.ADDR, None, None, None, None)
    with pytest.raises(InvalidPdHandle):
        a.ca.modify_mr(mr.handle, MrModMask.PD, None, None, None, b.pd)
    with pytest.raises(InvalidPermission):
        a.ca.modify_mr(mr.handle, MrModMask.ACCESS, None, None, AccessFlags.RDMA_WRITE, None)
    pd2 = a.ca.allocate_pd(a.h, PdType.NORMAL)
    moved = a.ca.modify_mr(mr.handle, MrModMask.PD, None, None, None, pd2)
    assert moved.lkey != mr.lkey and moved.vaddr == 0x40
    with pytest.raises(ResourceBusy):
        a.ca.deallocate_pd(pd2)
    a.ca.deallocate_pd(a.ca.allocate_pd(a.h, PdType.NORMAL))
    # bound windows make it busy
    qa, _ = connect(a, b)
    mw, rkey = a.ca.create_mw(a.pd)
    pd_mr = a.ca.modify_mr(mr.handle, MrModMask.PD | MrModMask.ACCESS, None, None,
                           AccessFlags.LOCAL_WRITE | AccessFlags.MW_BIND, a.pd)
    a.ca.bind_mw(mw, qa, BindWr(pd_mr.handle, 0x40, 8, AccessFlags.RDMA_READ, rkey))
    for call in (
        lambda: a.ca.modify_mr(mr.handle, MrModMask.ACCESS, None, None, AccessFlags.NONE, None),
        lambda: a.ca.deregister_mr(mr.handle),
    ):
        with pytest.raises(ResourceBusy):
            call()
    a.ca.destroy_mw(mw)  # destroying the window unbinds it
    a.ca.deregister_mr(mr.handle)
    with pytest.raises(InvalidMrHandle):
        a.ca.query_mr(mr.handle)


def test_shared_region_rules(a: Node, b: Node) -> None:
    with pytest.raises(InvalidMrHandle):
        a.ca.register_smr(b.mr.handle, a.pd, AccessFlags.NONE, 0)
    with pytest.raises(InvalidPdHandle):
        a.ca.register_smr(a.mr.handle, b.pd, AccessFlags.NONE, 0)
    with pytest.raises(InvalidPermission):
        a.ca.register_smr(a.mr.handle, a.pd, AccessFlags.ATOMIC, 0)
    smr = a.ca.register_smr(a.mr.handle, a.pd, AccessFlags.LOCAL_WRITE, 0x1234_5000)
    assert smr.handle is not a.mr.handle and smr.lkey != a.mr.lkey
    assert smr.vaddr % 4096 == a.mr.vaddr % 4096
    with pytest.raises(ResourceBusy):
        a.ca.deregister_mr(a.mr.handle)
    a.ca.deregister_mr(smr.handle)
    a.ca.deregister_mr(a.mr.handle)


# ==================================================================== MW


def test_memory_window_rules(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    mw, rkey = a.ca.create_mw(a.pd)
    bind = BindWr(a.mr.handle, a.addr(0), 16, AccessFlags.RDMA_READ, rkey)
    ud = a.qp(QpType.UD)
    ud_ready(a, ud)
    with pytest.raises(InvalidServiceType):
        a.ca.bind_mw(mw, ud, bind)
    with pytest.raises(InvalidRkey):
        a.ca.bind_mw(mw, qa, BindWr(a.mr.handle, a.addr(0), 16, AccessFlags.RDMA_READ, rkey + 1))
    with pytest.raises(InvalidMrHandle):
        a.ca.bind_mw(mw, qa, BindWr(b.mr.handle, a.addr(0), 16, AccessFlags.RDMA_READ, rkey))
    with pytest.raises(InvalidParameter):
        a.ca.bind_mw(mw, qa, BindWr(a.mr.handle, a.addr(len(a.buf)), 16, AccessFlags.RDMA_READ,
                                    rkey))
    plain = a.ca.register_mr(a.pd, memoryview(bytearray(64)), 0, AccessFlags.LOCAL_WRITE)
    with pytest.raises(InvalidPermission):
        a.ca.bind_mw(mw, qa, BindWr(plain.handle, 0, 16, AccessFlags.RDMA_READ, rkey))
    with pytest.raises(InvalidQpHandle):
        a.ca.bind_mw(mw, b.qp(), bind)
    fresh = a.qp()
    with pytest.raises(InvalidQpState):
        a.ca.bind_mw(mw, fresh, bind)
    assert a.ca.query_mw(mw) == rkey  # failures changed nothing
    a.ca.destroy_mw(mw)
    for call in (a.ca.query_mw, a.ca.destroy_mw):
        with pytest.raises(InvalidMwHandle):
            call(mw)


# ============================================================== post verbs


def test_post_send_state_and_queue_rules(a: Node, b: Node) -> None:
    qp = a.qp(caps=QpCaps(2, 2, 1, 1, 0))
    wr = SendWr(1, WrType.SEND, [a.sge(0, 4)])
    for target in (QpState.INIT, QpState.RTR, QpState.RTS):
        if target is not QpState.RTS:
            raises_post(InvalidQpState, 0, lambda: a.ca.post_send(qp, [wr]))
        if target is QpState.INIT:
            a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=1, access=ACCESS))
        elif target is QpState.RTR:
            qb = b.qp()
            a.ca.modify_qp(qp, QpMod(QpState.RTR, primary_av=AvAttr(1, dlid=b.lid),
                                     path_mtu=Mtu.MTU_1024, dest_qp=qb.num, rq_psn=0,
                                     resp_res=1, rnr_nak_timeout=1))
    raises_post(InvalidQpState, 0, lambda: a.ca.post_send(qp, [wr]))  # still RTR
    a.ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=0, retry_cnt=0,
                             rnr_retry_cnt=7, init_depth=1))
    # the peer never answers (RESET): three sends fill a two-deep queue
    raises_post(InsufficientResources, 2, lambda: a.ca.post_send(qp, [wr, wr, wr]))
    assert a.ca.query_qp(qp).sq_draining is False
    raises_post(InvalidQpHandle, 0, lambda: a.ca.post_send(b.qp(), [wr]))


def test_post_send_work_request_rules(a: Node, b: Node) -> None:
    qa, _ = connect(a, b, caps=QpCaps(8, 8, 1, 1, 0))
    uc, _ = connect(a, b, QpType.UC)
    ud = a.qp(QpType.UD)
    ud_ready(a, ud)
    raises_post(InvalidMaxSge, 1, lambda: a.ca.post_send(qa, [
        SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0), rkey=b.mr.rkey),
        SendWr(2, WrType.SEND, [a.sge(0, 4)] * 2)]))
    raises_post(InvalidWrType, 0, lambda: a.ca.post_send(uc, [
        SendWr(1, WrType.RDMA_READ, [a.sge(0, 4)])]))
    raises_post(InvalidWrType, 0, lambda: a.ca.post_send(ud, [
        SendWr(1, WrType.FETCH_ADD, [a.sge(0, 8)])]))
    raises_post(InvalidParameter, 0, lambda: a.ca.post_send(ud, [SendWr(1, WrType.SEND, [])]))
    bad_av = b.ca.create_av(b.pd, AvAttr(1, dlid=1))
    raises_post(InvalidAvHandle, 0, lambda: a.ca.post_send(ud, [
        SendWr(1, WrType.SEND, [], ud=UdDest(av=bad_av, remote_qp=2, remote_qkey=UD_QKEY))]))
    # the first WR of the failing list was posted and completes
    assert [w.wr_id for w in a.poll()] == [1]


def test_post_recv_rules(a: Node) -> None:
    qp = a.qp(caps=QpCaps(2, 2, 1, 1, 0))
    raises_post(InvalidQpState, 0, lambda: a.ca.post_recv(qp, [RecvWr(1, [])]))
    a.ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=1, access=ACCESS))
    a.ca.post_recv(qp, [RecvWr(1, [])])  # INIT is allowed
    raises_post(InvalidMaxSge, 0, lambda: a.ca.post_recv(qp, [RecvWr(2, [a.sge(0, 1)] * 2)]))
    raises_post(InsufficientResources, 1,
                lambda: a.ca.post_recv(qp, [RecvWr(2, []), RecvWr(3, [])]))
    raises_post(InvalidQpHandle, 0, lambda: a.ca.post_recv("nope", [RecvWr(2, [])]))


# ============================================================= multicast


def test_multicast_rules(fabric: MockFabric) -> None:
    n = open_node(fabric.add_ca(max_mcast_grps=1, max_qps_per_mcast_grp=1))
    ud, ud2 = n.qp(QpType.UD), n.qp(QpType.UD)
    with pytest.raises(InvalidServiceType):
        n.ca.attach_mcast(n.qp(), MGID, 0xC001)
    with pytest.raises(InvalidGid):
        n.ca.attach_mcast(ud, IPv6Address("fe80::1"), 0xC001)
    with pytest.raises(InvalidLid):
        n.ca.attach_mcast(ud, MGID, 0x10)
    m = n.ca.attach_mcast(ud, MGID, 0xC001)
    with pytest.raises(InvalidParameter):
        n.ca.attach_mcast(ud, MGID, 0xC001)
    with pytest.raises(MaxMcastQpsReached):
        n.ca.attach_mcast(ud2, MGID, 0xC001)
    with pytest.raises(InsufficientResources):
        n.ca.attach_mcast(ud2, IPv6Address("ff12::2"), 0xC002)
    n.ca.detach_mcast(m)
    with pytest.raises(InvalidMcastHandle):
        n.ca.detach_mcast(m)
    with pytest.raises(InvalidMcastHandle):
        n.ca.detach_mcast(object())


# ============================================================== cross-cutting


def test_handles_of_another_ca_are_refused(a: Node, b: Node) -> None:
    qb = b.qp()
    for call, exc in (
        (lambda: a.ca.query_ca(b.h), InvalidCaHandle),
        (lambda: a.ca.deallocate_pd(b.pd), InvalidPdHandle),
        (lambda: a.ca.query_cq(b.cq), InvalidCqHandle),
        (lambda: a.ca.query_qp(qb), InvalidQpHandle),
        (lambda: a.ca.query_mr(b.mr.handle), InvalidMrHandle),
        (lambda: a.ca.enable_cq_notify(b.cq, False), InvalidCqHandle),
        (lambda: a.ca.poll_cq(b.cq, 1), InvalidCqHandle),
    ):
        with pytest.raises(exc):
            call()


def test_all_keys_are_32_bit(a: Node) -> None:
    keys = [a.mr.lkey, a.mr.rkey, a.ca.create_mw(a.pd).rkey]
    assert all(0 < k < 1 << 32 for k in keys)
    assert all(k.to_bytes(4, "big") for k in keys)


def test_local_mad_statuses(a: Node, b: Node) -> None:
    mad = bytes([1, 1, 1, 1]) + bytes(12) + (0x11).to_bytes(2, "big") + bytes(238)
    with pytest.raises(InvalidPort):
        a.ca.local_mad(a.h, 2, mad)
    with pytest.raises(InvalidCaHandle):
        a.ca.local_mad(b.h, 1, mad)
    with pytest.raises(InvalidParameter):
        a.ca.local_mad(a.h, 1, b"short")
    assert len(a.ca.local_mad(a.h, 1, mad)) == 256


def test_failed_index_counts_work_requests_posted(a: Node, b: Node) -> None:
    qa, qb = connect(a, b, caps=QpCaps(4, 4, 1, 1, 0))
    raises_post(InsufficientResources, 4, lambda: b.ca.post_recv(qb, [
        RecvWr(i, [b.sge(0, 4)]) for i in range(6)]))
    a.ca.post_send(qa, [SendWr(i, WrType.SEND, [a.sge(0, 4)]) for i in range(4)])
    assert [w.wr_id for w in b.poll()] == [0, 1, 2, 3]
    assert all(w.status is WcStatus.SUCCESS for w in a.poll())


def test_to_rts_helper_shapes_match_the_state_table(a: Node, b: Node) -> None:
    qa, qb = a.qp(QpType.UC), b.qp(QpType.UC)
    to_rts(a, qa, b, qb.num, qp_type=QpType.UC)
    assert a.ca.query_qp(qa).state is QpState.RTS
