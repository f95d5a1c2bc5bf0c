"""The access layer's side of SEND_WITH_INV, LOCAL_INV and type 2 BIND_MW work requests."""

from __future__ import annotations

from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AlManager, Qp, QpCreate
from ibal.status import InvalidParameter, PostError, Status, Unsupported
from ibal.types import (
    BASE_WR_TYPES,
    INVALIDATE_WR_TYPES,
    AccessFlags,
    AvAttr,
    BindWr,
    Mtu,
    QpMod,
    QpState,
    QpType,
    SendWr,
    WrType,
)

RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.MW_BIND


def _world(**caps: Any) -> tuple[AlManager, FakeCi, Any, Qp]:
    provider = FakeProvider(1, **caps)
    mgr = AlManager()
    mgr.add_provider(provider)
    ci = provider.cis[0]
    ca = mgr.open_al().open_ca(ci.guid)
    pd = ca.alloc_pd()
    cq = ca.create_cq(16)
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
    qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=AccessFlags.LOCAL_WRITE))
    qp.modify(QpMod(QpState.RTR, primary_av=AvAttr(port_num=1, dlid=2), path_mtu=Mtu.MTU_1024,
                    dest_qp=9, rq_psn=0, resp_res=1, rnr_nak_timeout=1))  # fmt: skip
    qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=1, retry_cnt=1, rnr_retry_cnt=1,
                    init_depth=1))  # fmt: skip
    return mgr, ci, pd, qp


def _sent(qp: Qp) -> list[SendWr]:
    return list(qp._h.data.get("sent", []))


@pytest.fixture
def v1() -> Any:
    """A CA that says nothing about the new opcodes or type 2 windows (contract version 1)."""
    mgr, ci, pd, qp = _world()
    yield ci, pd, qp
    mgr.close(timeout=10)


@pytest.fixture
def full() -> Any:
    mgr, ci, pd, qp = _world(
        opcodes={QpType.RC: BASE_WR_TYPES | INVALIDATE_WR_TYPES},
        mw_types=frozenset({1, 2}),
    )
    yield ci, pd, qp
    mgr.close(timeout=10)


@pytest.mark.parametrize("op", sorted(INVALIDATE_WR_TYPES))
def test_unlisted_opcode_is_unsupported_after_posting_the_ones_before(v1: Any, op: WrType) -> None:
    _ci, pd, qp = v1
    with pytest.raises(Unsupported) as info:
        qp.post_send([SendWr(wr_id=1), SendWr(wr_id=2, opcode=op, invalidate_rkey=5,
                      mw=pd.create_mw(), bind=BindWr(None, 0, 0, 0, 0))])  # fmt: skip
    assert isinstance(info.value, PostError) and info.value.failed_index == 1
    assert [wr.wr_id for wr in _sent(qp)] == [1]  # the old CA never saw the new opcode


def test_type2_window_needs_the_capability(v1: Any) -> None:
    ci, pd, _ = v1
    with pytest.raises(Unsupported):
        pd.create_mw(2)
    with pytest.raises(InvalidParameter):
        pd.create_mw(3)
    mw = pd.create_mw()  # type 1 works on a CA that knows nothing of type 2
    assert mw.mw_type == 1 and ("create_mw", (1,)) in ci.calls


def test_bind_mw_request_reaches_the_provider_with_its_handles(full: Any) -> None:
    ci, pd, qp = full
    mw = pd.create_mw(2)
    assert ("create_mw", (2,)) in ci.calls and mw._h.data["mw_type"] == 2
    mr = pd.reg_mem(bytearray(64), RW)
    wr = SendWr(wr_id=7, opcode=WrType.BIND_MW, rkey=mw.rkey + 1, mw=mw,
                bind=BindWr(mr, mr.vaddr, 32, AccessFlags.RDMA_WRITE, 0))  # fmt: skip
    qp.post_send(wr)
    (got,) = _sent(qp)
    assert got.mw is mw._h and got.bind is not None and got.bind.mr is mr._h
    assert (got.rkey, got.bind.addr, got.bind.length) == (mw.rkey + 1, mr.vaddr, 32)
    assert wr.mw is mw and wr.bind is not None and wr.bind.mr is mr  # consumer WR untouched


def test_closing_the_ca_destroys_windows_before_the_qps_they_may_hold(full: Any) -> None:
    # A bound type 2 window holds its QP; kernel rxe (6.1) stalls ~50 s in ibv_destroy_qp
    # when the QP goes first, which the cascade's ranks alone (CQs, and the QPs on them,
    # before PDs and their windows) would do.
    ci, pd, qp = full
    mr = pd.reg_mem(bytearray(64), RW)
    mw = pd.create_mw(2)
    qp.post_send(SendWr(wr_id=7, opcode=WrType.BIND_MW, rkey=mw.rkey + 1, mw=mw,
                        bind=BindWr(mr, mr.vaddr, 32, AccessFlags.RDMA_WRITE, 0)))  # fmt: skip
    start = len(ci.calls)
    pd.ca.close(timeout=10)
    order = [v for v in ci.verbs()[start:] if v in ("destroy_mw", "destroy_qp", "destroy_cq",
                                                     "deregister_mr", "deallocate_pd")]  # fmt: skip
    assert order[0] == "destroy_mw" and order.count("destroy_mw") == 1, order
    assert order.index("destroy_mw") < order.index("destroy_qp") < order.index("deallocate_pd")


def test_bind_mw_request_checks_window_and_region(full: Any) -> None:
    _ci, pd, qp = full
    mr = pd.reg_mem(bytearray(64), RW)
    one = pd.create_mw()
    two = pd.create_mw(2)
    bind = BindWr(mr, mr.vaddr, 32, AccessFlags.RDMA_WRITE, 0)
    cases: list[tuple[SendWr, Status]] = [
        (SendWr(opcode=WrType.BIND_MW, mw=one, bind=bind), Status.INVALID_PARAMETER),
        (SendWr(opcode=WrType.BIND_MW, mw=pd, bind=bind), Status.INVALID_MW_HANDLE),
        (SendWr(opcode=WrType.BIND_MW, mw=two, bind=BindWr(pd, 0, 8, 0, 0)),
         Status.INVALID_MR_HANDLE),
    ]  # fmt: skip
    for wr, status in cases:
        with pytest.raises(PostError) as info:
            qp.post_send(wr)
        assert info.value.status is status
    with pytest.raises(InvalidParameter):
        two.bind(qp, bind)  # type 2 windows are not bound by the verb
    assert _sent(qp) == []


def test_send_with_invalidate_passes_the_key(full: Any) -> None:
    _ci, _pd, qp = full
    qp.post_send(SendWr(wr_id=3, opcode=WrType.SEND_WITH_INV, invalidate_rkey=0x1234))
    (got,) = _sent(qp)
    assert (got.opcode, got.invalidate_rkey) == (WrType.SEND_WITH_INV, 0x1234)
