"""Verbs through the AL: parameter checks before the provider, translation, state tracking."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AccessLayer, AlManager, Ca, Cq, Pd, QpCreate
from ibal.al.pnp import DeviceAttrMask
from ibal.status import (
    Error,
    InvalidCqSize,
    InvalidGid,
    InvalidGuid,
    InvalidHandle,
    InvalidIndex,
    InvalidLid,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidPermission,
    InvalidPkey,
    InvalidPort,
    InvalidQpState,
    InvalidServiceType,
    InvalidSetting,
    NoMatch,
    NotFound,
    Overflow,
    PostError,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    IB_ANY_INDEX,
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AvAttr,
    BindWr,
    CaMod,
    CiOp,
    DgrmInfo,
    Gid,
    LinkState,
    MrModMask,
    Mtu,
    PhysCreate,
    PortAttrMod,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    SrqAttrMask,
)

RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def rc(pd: Pd, cq: Cq, **kw: Any) -> Any:
    return pd.create_qp(QpCreate(QpType.RC, cq, cq, **kw))


def to_rts(qp: Any) -> None:
    qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=RW))
    qp.modify(QpMod(QpState.RTR, primary_av=AvAttr(port_num=1, dlid=2), path_mtu=Mtu.MTU_1024,
                    dest_qp=9, rq_psn=0, resp_res=1, rnr_nak_timeout=1))
    qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=1, retry_cnt=1, rnr_retry_cnt=1,
                    init_depth=1))


def modifies(ci: FakeCi) -> list[Any]:
    return [args[0] for v, args in ci.calls if v == "modify_qp"]


# ---------------------------------------------------------------------- QP state
@pytest.mark.parametrize(
    "mod,err",
    [
        (QpMod(QpState.RTS, sq_psn=0), InvalidQpState),  # RESET -> RTS is illegal
        (QpMod(QpState.INIT, port_num=1, access=RW), InvalidParameter),  # pkey_index missing
        (QpMod(QpState.INIT, pkey_index=0, port_num=1, access=RW, qkey=1), InvalidSetting),
        (QpMod(QpState.INIT, pkey_index=0, port_num=5, access=RW), InvalidPort),
        (QpMod(QpState.INIT, pkey_index=9, port_num=1, access=RW), InvalidPkey),
    ],
)
def test_modify_checked_before_the_provider(pd: Pd, cq: Cq, ci: FakeCi, mod: QpMod,
                                            err: type[Exception]) -> None:
    qp = rc(pd, cq)
    with pytest.raises(err):
        qp.modify(mod)
    assert modifies(ci) == []
    assert qp.state is QpState.RESET


def test_modify_tracks_state_and_query_fills_handles(pd: Pd, cq: Cq) -> None:
    srq = pd.create_srq(SrqAttr(max_wr=4))
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, srq=srq))
    to_rts(qp)
    assert qp.state is QpState.RTS
    attr = qp.query()
    assert (attr.pd, attr.send_cq, attr.recv_cq, attr.srq) == (pd, cq, cq, srq)
    assert attr.qp_num == qp.num
    qp.modify(QpMod(QpState.ERROR))
    assert qp.state is QpState.ERROR


def test_posting_before_ready_is_invalid_qp_state(pd: Pd, cq: Cq, ci: FakeCi) -> None:
    qp = rc(pd, cq)
    with pytest.raises(InvalidQpState) as info:
        qp.post_send(SendWr(wr_id=1))
    assert isinstance(info.value, PostError) and info.value.failed_index == 0
    with pytest.raises(InvalidQpState):
        qp.post_recv(RecvWr(wr_id=1))
    qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=RW))
    qp.post_recv(RecvWr(wr_id=2))  # receives from INIT on
    with pytest.raises(InvalidQpState):
        qp.post_send([SendWr(wr_id=3)])
    assert "sent" not in qp._h.data


def test_rc_posts_reach_the_provider_unchanged(pd: Pd, cq: Cq) -> None:
    qp = rc(pd, cq)
    to_rts(qp)
    wrs = [SendWr(wr_id=i) for i in range(4)]
    qp.post_send(wrs)
    assert all(a is b for a, b in zip(qp._h.data["sent"], wrs, strict=True))  # no copies


def test_create_qp_checks(pd: Pd, cq: Cq, ci: FakeCi) -> None:
    with pytest.raises(InvalidSetting):
        pd.create_qp(QpCreate(QpType.QP1, cq, cq))
    with pytest.raises(Unsupported):
        pd.create_qp(QpCreate(QpType.RD, cq, cq))
    with pytest.raises(InvalidMaxWrs):
        rc(pd, cq, sq_depth=100_000)
    with pytest.raises(InvalidMaxSge):
        rc(pd, cq, rq_sge=99)
    with pytest.raises(InvalidParameter):
        rc(pd, cq, sq_depth=-1)
    with pytest.raises(InvalidParameter):
        pd.create_qp("not a QpCreate")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=5)  # type: ignore[arg-type]
    assert "create_qp" not in ci.verbs()
    mad = pd.create_qp(QpCreate(QpType.MAD, cq, cq))
    assert mad.qp_type is QpType.MAD
    assert ci.calls[-1] == ("create_qp", (QpType.UD,))  # a MAD QP is a UD QP below


def test_init_dgrm_svc(pd: Pd, cq: Cq, ci: FakeCi, ca: Ca) -> None:
    port = ca.query().ports[0]
    ud = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    ud.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=0x1234))
    assert ud.state is QpState.RTS
    assert modifies(ci) == [QpState.INIT, QpState.RTR, QpState.RTS]
    with pytest.raises(InvalidQpState):
        ud.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid))
    with pytest.raises(InvalidParameter):
        rc(pd, cq).init_dgrm_svc(DgrmInfo(port_guid=port.port_guid))
    fresh = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    with pytest.raises(InvalidParameter):
        fresh.init_dgrm_svc()
    with pytest.raises(InvalidParameter):
        fresh.init_dgrm_svc(DgrmInfo(port_guid=0x42))


def test_init_dgrm_svc_failure_goes_back_to_reset(pd: Pd, cq: Cq, ci: FakeCi, ca: Ca) -> None:
    ud = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    real = ci.modify_qp

    def modify(h: Any, mod: QpMod) -> Any:
        if mod.state is QpState.RTR:
            raise InvalidParameter("fake: RTR refused")
        return real(h, mod)

    ci.modify_qp = modify  # type: ignore[method-assign]
    with pytest.raises(InvalidParameter):
        ud.init_dgrm_svc(DgrmInfo(port_guid=ca.query().ports[0].port_guid))
    assert ud.state is QpState.RESET


def test_special_qps(pd: Pd, cq: Cq, ci: FakeCi, ca: Ca) -> None:
    port = ca.query().ports[1]
    qp1 = pd.get_spl_qp(port.port_guid, QpCreate(QpType.QP1, cq, cq))
    assert ci.calls[-1] == ("create_spl_qp", (QpType.QP1, port.port_num))
    qp1.init_dgrm_svc()
    assert qp1.state is QpState.RTS
    init = next(args for v, args in ci.calls if v == "modify_qp")
    assert init == (QpState.INIT,)
    with pytest.raises(ResourceBusy):
        pd.get_spl_qp(port.port_guid, QpCreate(QpType.QP1, cq, cq))
    with pytest.raises(InvalidSetting):
        pd.get_spl_qp(port.port_guid, QpCreate(QpType.UD, cq, cq))
    with pytest.raises(InvalidPort):
        pd.get_spl_qp(0xBAD, QpCreate(QpType.QP0, cq, cq))
    with pytest.raises(Unsupported):
        pd.get_spl_qp(port.port_guid, QpCreate(QpType.RAW_ETHER, cq, cq))
    assert QP1_WELL_KNOWN_QKEY == 0x80010000


# ---------------------------------------------------------------------- memory
def test_reg_mem_uses_the_real_address_and_pins_the_buffer(pd: Pd, ci: FakeCi) -> None:
    buf = bytearray(b"x" * 128)
    mr = pd.reg_mem(buf, RW)
    assert mr.vaddr == ctypes.addressof((ctypes.c_char * 128).from_buffer(buf))
    assert mr.length == 128 and mr.lkey and mr.rkey
    assert mr.buffer is not None
    mr.buffer[0:2] = b"hi"
    assert buf[:2] == b"hi"
    with pytest.raises(BufferError):
        buf.extend(b"more")  # registered memory cannot move
    sge = mr.sge(16, 8)
    assert (sge.addr, sge.length, sge.lkey) == (mr.vaddr + 16, 8, mr.lkey)
    assert mr.sge().length == 128
    with pytest.raises(InvalidParameter):
        mr.sge(120, 16)
    assert mr.query().pd is pd
    mr.dereg()
    buf.extend(b"more")  # unpinned


@pytest.mark.parametrize(
    "buffer,access,err",
    [
        (b"read-only", AccessFlags.LOCAL_WRITE, InvalidParameter),
        (bytearray(), AccessFlags.LOCAL_WRITE, InvalidParameter),
        (12345, AccessFlags.LOCAL_WRITE, InvalidParameter),
        (bytearray(8), AccessFlags.RDMA_WRITE, InvalidPermission),
        (bytearray(8), 0x400, InvalidParameter),
    ],
)
def test_reg_mem_checks(pd: Pd, ci: FakeCi, buffer: Any, access: Any,
                        err: type[Exception]) -> None:
    with pytest.raises(err):
        pd.reg_mem(buffer, access)
    assert "register_mr" not in ci.verbs()


def test_reg_mem_takes_any_writable_buffer(pd: Pd) -> None:
    import array
    import mmap

    for buf in (array.array("d", [0.0] * 8), mmap.mmap(-1, 4096), memoryview(bytearray(64))):
        mr = pd.reg_mem(buf, AccessFlags.LOCAL_WRITE)
        assert mr.length == memoryview(buf).nbytes  # type: ignore[arg-type]
        mr.dereg()


def test_reg_phys(pd: Pd) -> None:
    pages = [memoryview(bytearray(4096)) for _ in range(2)]
    mr = pd.reg_phys(PhysCreate(pages, 4096, 8192, AccessFlags.LOCAL_WRITE), vaddr=0x20000)
    assert (mr.vaddr, mr.length, mr.buffer) == (0x20000, 8192, None)


def test_shared_regions_and_windows_keep_a_region_busy(ca: Ca, pd: Pd, cq: Cq,
                                                       ci: FakeCi) -> None:
    mr = pd.reg_mem(bytearray(256), RW | AccessFlags.MW_BIND)
    other_pd = ca.alloc_pd()
    shared = mr.reg_shared(other_pd, AccessFlags.LOCAL_WRITE)
    assert shared.pd is other_pd and shared.lkey != mr.lkey
    with pytest.raises(ResourceBusy):
        mr.dereg()
    shared.dereg()
    qp = rc(pd, cq)
    to_rts(qp)
    mw = pd.create_mw()
    rkey = mw.bind(qp, BindWr(mr, mr.vaddr, 64, AccessFlags.RDMA_READ, mw.rkey))
    assert rkey == mw.rkey == mw.query()[1]
    assert ci.calls[-1] == ("bind_mw", (64,))
    with pytest.raises(ResourceBusy):
        mr.dereg()
    with pytest.raises(ResourceBusy):
        mr.rereg(MrModMask.ACCESS, access=AccessFlags.LOCAL_WRITE)
    mw.bind(qp, BindWr(mr, 0, 0, AccessFlags.NONE, mw.rkey))  # length 0 unbinds
    mr.rereg(MrModMask.ACCESS, access=AccessFlags.LOCAL_WRITE)
    assert mr.access is AccessFlags.LOCAL_WRITE
    mr.dereg()


def test_bind_checks(pd: Pd, cq: Cq, ca: Ca) -> None:
    mr = pd.reg_mem(bytearray(64), RW)
    mw = pd.create_mw()
    ud = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    with pytest.raises(InvalidServiceType):
        mw.bind(ud, BindWr(mr, mr.vaddr, 8, RW, mw.rkey))
    qp = rc(pd, cq)
    with pytest.raises(InvalidQpState):
        mw.bind(qp, BindWr(mr, mr.vaddr, 8, RW, mw.rkey))
    to_rts(qp)
    elsewhere = ca.alloc_pd().reg_mem(bytearray(8), RW)
    with pytest.raises(InvalidParameter):
        mw.bind(qp, BindWr(elsewhere, elsewhere.vaddr, 8, RW, mw.rkey))


def test_cascade_takes_shared_regions_on_other_pds(ca: Ca, pd: Pd, ci: FakeCi) -> None:
    mr = pd.reg_mem(bytearray(64), RW)
    other = ca.alloc_pd()
    shared = mr.reg_shared(other, AccessFlags.LOCAL_WRITE)
    pd.dealloc(wait=True)
    verbs = ci.verbs()
    assert verbs.count("deregister_mr") == 2 and verbs[-1] == "deallocate_pd"
    from ibal.status import InvalidMrHandle

    with pytest.raises(InvalidMrHandle):
        shared.query()
    other.create_mw()  # the other PD lives on


def test_rereg_moves_a_region_to_another_pd(ca: Ca, pd: Pd, ci: FakeCi) -> None:
    mr = pd.reg_mem(bytearray(64), RW)
    target = ca.alloc_pd()
    old_keys = (mr.lkey, mr.rkey)
    mr.rereg(MrModMask.PD, pd=target)
    assert mr.pd is target
    pd.dealloc(wait=True)  # the region is no longer the old PD's
    mr.query()
    assert (mr.lkey, mr.rkey) == old_keys or mr.lkey
    with pytest.raises(InvalidParameter):
        mr.rereg(MrModMask.ADDR)  # the buffer is missing
    with pytest.raises(InvalidParameter):
        mr.rereg(MrModMask.ACCESS, access=RW, buffer=bytearray(8))  # not in the mask
    buf = bytearray(32)
    mr.rereg(MrModMask.ADDR, buffer=buf)
    assert mr.length == 32 and mr.buffer is not None and mr.buffer.obj is buf
    target.dealloc(wait=True)


# ---------------------------------------------------------------------- multicast
def test_multicast(pd: Pd, cq: Cq, ci: FakeCi, ca: Ca) -> None:
    ud = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    with pytest.raises(InvalidServiceType):
        rc(pd, cq).attach_mcast(Gid("ff12::1"), 0xC001)
    with pytest.raises(InvalidGid):
        ud.attach_mcast(Gid("fe80::1"), 0xC001)
    with pytest.raises(InvalidGid):
        ud.attach_mcast("nonsense", 0xC001)
    with pytest.raises(InvalidLid):
        ud.attach_mcast(Gid("ff12::1"), 0x10)
    m = ud.attach_mcast("ff12::1", 0xC001)
    assert (m.gid, m.lid, m.qp) == (Gid("ff12::1"), 0xC001, ud)
    ud.destroy(wait=True)
    verbs = ci.verbs()
    assert verbs.index("detach_mcast") < verbs.index("destroy_qp")


# ---------------------------------------------------------------------- CQ / SRQ / AV
def test_cq_checks(ca: Ca, ci: FakeCi) -> None:
    with pytest.raises(InvalidCqSize):
        ca.create_cq(0)
    with pytest.raises(InvalidCqSize):
        ca.create_cq(10**6)
    with pytest.raises(InvalidParameter):
        ca.create_cq(8, comp_cb="nope")  # type: ignore[arg-type]
    cq = ca.create_cq(8)
    assert cq.size == 8 and cq.query() == 8
    for bad in (0, 9, -1):
        with pytest.raises(InvalidParameter):
            cq.rearm_n(bad)
    with pytest.raises(InvalidParameter):
        cq.poll(0)
    from ibal.types import Wc, WcType

    for i in range(3):
        ci.complete(cq._h, Wc(i, WcType.SEND))
    assert cq.peek() == 3
    with pytest.raises(Overflow):
        cq.modify(2)
    assert cq.size == 8
    assert cq.modify(16) == 16 and cq.size == 16


def test_srq_verbs(pd: Pd) -> None:
    srq = pd.create_srq(SrqAttr(max_wr=8), context="s")
    srq.modify(SrqAttr(max_wr=8, srq_limit=2), SrqAttrMask.LIMIT)
    assert srq.query().srq_limit == 2
    for mask in (0, 0x8):
        with pytest.raises(InvalidParameter):
            srq.modify(SrqAttr(), mask)  # type: ignore[arg-type]
    with pytest.raises(InvalidSetting):
        srq.modify(SrqAttr(max_wr=-1), SrqAttrMask.MAX_WR)
    srq.post_recv([RecvWr(1), RecvWr(2)])
    assert len(srq._h.data["recvs"]) == 2
    with pytest.raises(InvalidMaxWrs):
        pd.create_srq(SrqAttr(max_wr=10**6))


def test_av_verbs(pd: Pd) -> None:
    av = pd.create_av(AvAttr(port_num=1, dlid=5))
    assert av.query().dlid == 5 and av.pd is pd
    av.modify(AvAttr(port_num=2, dlid=6))
    assert av.query().dlid == 6
    with pytest.raises(InvalidPort):
        av.modify(AvAttr(port_num=3))
    with pytest.raises(InvalidPort):
        pd.create_av(AvAttr(port_num=0))
    with pytest.raises(InvalidParameter):
        pd.create_av(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- CA and AL
def test_ca_modify_ci_call_local_mad(ca: Ca, pd: Pd, cq: Cq, ci: FakeCi) -> None:
    ca.modify(1, CaMod.IS_SM, PortAttrMod())
    assert ci.calls[-1] == ("modify_ca", (1, CaMod.IS_SM))
    with pytest.raises(InvalidPort):
        ca.modify(7, CaMod.IS_SM, PortAttrMod())
    with pytest.raises(InvalidParameter):
        ca.modify(1, 1 << 30, PortAttrMod())  # type: ignore[arg-type]
    with pytest.raises(Unsupported):
        ca.modify(1, CaMod.QKEY_CTR, PortAttrMod())
    op = ca.ci_call(CiOp(1), [pd, cq])
    assert ci.calls[-1] == ("vendor_call", ((pd._h, cq._h),))
    assert op.out == bytes(2)
    failing = CiOp(0xBAD)
    with pytest.raises(Error):
        ca.ci_call(failing)
    assert failing.status == 7
    with pytest.raises(InvalidHandle):
        ca.ci_call(CiOp(1), [ca])
    mad = bytes(range(256))
    assert ca.local_mad(1, mad) == bytes(reversed(mad))
    with pytest.raises(InvalidPort):
        ca.local_mad(3, mad)
    with pytest.raises(InvalidParameter):
        ca.local_mad(1, b"short")


def test_al_queries(al: AccessLayer, ci: FakeCi) -> None:
    guids = al.get_ca_guids()
    assert guids[0] == ci.guid and len(guids) == 2
    assert al.query_ca_by_guid(ci.guid).ca_guid == ci.guid
    with pytest.raises(InvalidGuid):
        al.query_ca_by_guid(0x1234)
    with pytest.raises(InvalidGuid):
        al.open_ca(0x1234)
    with pytest.raises(InvalidParameter):
        al.open_ca("x")  # type: ignore[arg-type]
    gid = ci.attr.ports[1].gids[0]
    assert al.get_ca_by_gid(gid) == ci.guid
    assert al.get_port_by_gid(gid) == ci.attr.ports[1].port_guid
    with pytest.raises(NotFound):
        al.get_ca_by_gid(Gid("fe80::dead"))
    with pytest.raises(InvalidParameter):
        al.get_port_by_gid("not a gid")  # type: ignore[arg-type]


def test_get_guid(al: AccessLayer, ci: FakeCi) -> None:
    assert al.get_guid(0, "ca") == ci.guid
    assert al.get_guid(IB_ANY_INDEX, "port") == ci.guid + 1
    assert al.get_guid(1, "port") == ci.guid + 2
    with pytest.raises(InvalidIndex):
        al.get_guid(99, "ca")
    with pytest.raises(InvalidSetting):
        al.get_guid(0, "switch")
    with pytest.raises(InvalidParameter):
        al.get_guid(0, "port", 0x80)
    down = tuple(dataclasses.replace(p, link_state=LinkState.DOWN) for p in ci.attr.ports)
    ci.attr = dataclasses.replace(ci.attr, ports=down)
    with pytest.raises(NoMatch):
        al.get_guid(0, "port", DeviceAttrMask.PORT_ACTIVE)
    assert al.get_guid(IB_ANY_INDEX, "port", DeviceAttrMask.PORT_ACTIVE) != ci.guid + 1


def test_an_unsupported_qp_type_says_the_providers_reason() -> None:
    """The reasons are keyed by field name: ``qp_types`` and ``special_qps``."""
    provider = FakeProvider(
        1,
        qp_types=frozenset({QpType.RC, QpType.UD}),
        special_qps=frozenset({QpType.QP1}),
        reasons={"qp_types": "UC is left out on purpose", "special_qps": "no SMA here"},
    )
    mgr = AlManager()
    mgr.add_provider(provider)
    try:
        al = mgr.open_al()
        ca = al.open_ca(provider.cis[0].guid)
        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        with pytest.raises(Unsupported, match="UC is left out on purpose"):
            pd.create_qp(QpCreate(QpType.UC, cq, cq))
        port = ca.query().ports[0]
        with pytest.raises(Unsupported, match="no SMA here"):
            pd.get_spl_qp(port.port_guid, QpCreate(QpType.QP0, cq, cq))
    finally:
        mgr.close(timeout=10)


def test_queue_depths_in_a_modify_need_the_resize_capability(pd: Pd, cq: Cq, ci: FakeCi) -> None:
    qp = rc(pd, cq)
    to_rts(qp)
    before = len(modifies(ci))
    with pytest.raises(Unsupported, match="resizing work queues"):
        qp.modify(QpMod(QpState.RTS, sq_depth=8))
    assert len(modifies(ci)) == before  # the provider never saw it


def test_queue_depths_reach_a_provider_that_resizes() -> None:
    provider = FakeProvider(1, resize_qp=True)
    mgr = AlManager()
    mgr.add_provider(provider)
    try:
        ca = mgr.open_al().open_ca(provider.cis[0].guid)
        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        qp = rc(pd, cq)
        to_rts(qp)
        qp.modify(QpMod(QpState.RTS, sq_depth=8, rq_depth=4))
        last = qp._h.data["mod"]
        assert (last.sq_depth, last.rq_depth) == (8, 4)
        with pytest.raises(InvalidMaxWrs):
            qp.modify(QpMod(QpState.RTS, sq_depth=100_000))
        with pytest.raises(InvalidMaxWrs):
            qp.modify(QpMod(QpState.RTS, rq_depth=0))
        with pytest.raises(InvalidSetting):  # RTS -> SQD takes no depths (IBAL's sqd struct)
            qp.modify(QpMod(QpState.SQD, sq_depth=8))
    finally:
        mgr.close(timeout=10)
