"""Numeric fields of work requests, SGEs, AVs and QP modifies out of their widths.

Issue 25 §2: on rxe an R_Key of 2**32 raised ``struct.error`` out of
``post_send`` and later killed the device's timer thread; the mock and the
sample provider took the same values silently (and delivered something else).
The access layer refuses each with ``INVALID_PARAMETER`` at its index, the same
on every provider, posts nothing of it, and the QP goes on working.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
from robust_world import World, close_world_parts, open_world

import ibal.status
from ibal.status import IbError, InvalidParameter, PostError, Status
from ibal.testing.helpers import Pair, RcTiming, make_pair, wait_wc
from ibal.types import (
    AccessFlags,
    AvAttr,
    BindWr,
    Grh,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)

U32, U64 = 1 << 32, 1 << 64


def _write(p: Pair, **change: Any) -> SendWr:
    wr = SendWr(wr_id=7, opcode=WrType.RDMA_WRITE, sg_list=[p.a.sge(0, 8)],
                remote_addr=p.b.remote(0), rkey=p.b.mr.rkey)  # fmt: skip
    return dataclasses.replace(wr, **change)


SEND_CASES: dict[str, Callable[[Pair], SendWr]] = {
    "rkey -1": lambda p: _write(p, rkey=-1),
    "rkey 2**32": lambda p: _write(p, rkey=U32),
    "remote_addr -1": lambda p: _write(p, remote_addr=-1),
    "remote_addr 2**64": lambda p: _write(p, remote_addr=U64),
    "imm 2**32": lambda p: _write(p, imm=U32),
    "wr_id 2**64": lambda p: _write(p, wr_id=U64),
    "wr_id -1": lambda p: _write(p, wr_id=-1),
    "compare_add -1": lambda p: _write(p, opcode=WrType.FETCH_ADD, sg_list=[p.a.sge(0, 8)],
                                       compare_add=-1),
    "swap 2**64": lambda p: _write(p, opcode=WrType.COMPARE_SWAP, swap=U64),
    "Sge length -1": lambda p: _write(p, sg_list=[Sge(p.a.mr.vaddr, -1, p.a.mr.lkey)]),
    "Sge length 2**32": lambda p: _write(p, sg_list=[Sge(p.a.mr.vaddr, U32, p.a.mr.lkey)]),
    "Sge lkey -1": lambda p: _write(p, sg_list=[Sge(p.a.mr.vaddr, 8, -1)]),
    "Sge addr 2**64": lambda p: _write(p, sg_list=[Sge(U64, 8, p.a.mr.lkey)]),
    "sg_list generator": lambda p: _write(p, sg_list=(g for g in [p.a.sge(0, 8)])),
}


@pytest.mark.parametrize("case", sorted(SEND_CASES))
def test_send_field_out_of_range_is_refused_and_the_qp_goes_on(world: World, case: str) -> None:
    p = make_pair(world.ca0, world.p0, world.ca1, world.p1, QpType.RC)
    good = _write(p, wr_id=1)
    p.a.put(0, b"landed!!")
    with pytest.raises(PostError) as err:
        p.a.qp.post_send([good, SEND_CASES[case](p)])
    assert err.value.status is Status.INVALID_PARAMETER
    assert err.value.failed_index == 1
    wc = wait_wc(p.a.cq)
    assert (wc.wr_id, wc.status) == (1, WcStatus.SUCCESS)
    assert p.b.get(0, 8) == b"landed!!"
    assert p.a.cq.poll() == []  # the refused request never completes
    p.a.qp.post_send(_write(p, wr_id=2))
    assert wait_wc(p.a.cq).status is WcStatus.SUCCESS


@pytest.mark.parametrize(
    "field", ["remote_qp 2**24", "remote_qkey 2**32", "remote_qkey -1", "pkey_index 2**16"]
)
def test_ud_dest_out_of_range_is_refused(world: World, field: str) -> None:
    p = make_pair(world.ca0, world.p0, world.ca1, world.p1, QpType.UD)
    name, value = field.split()
    bad = {"remote_qp": 1 << 24, "remote_qkey": U32 if value != "-1" else -1,
           "pkey_index": 1 << 16}[name]  # fmt: skip
    ud = dataclasses.replace(p.ud(p.b), **{name: bad})
    with pytest.raises(PostError) as err:
        p.a.qp.post_send(SendWr(wr_id=1, sg_list=[p.a.sge(0, 8)], ud=ud))
    assert (err.value.status, err.value.failed_index) == (Status.INVALID_PARAMETER, 0)
    assert p.send(b"datagram")[1].status is WcStatus.SUCCESS


@pytest.mark.parametrize("case", ["wr_id 2**64", "Sge length -1", "Sge lkey 2**32"])
def test_recv_field_out_of_range_is_refused(world: World, case: str) -> None:
    p = make_pair(world.ca0, world.p0, world.ca1, world.p1, QpType.RC)
    b = p.b
    wr = {
        "wr_id 2**64": RecvWr(wr_id=U64, sg_list=[b.sge(0, 64)]),
        "Sge length -1": RecvWr(wr_id=1, sg_list=[Sge(b.mr.vaddr, -1, b.mr.lkey)]),
        "Sge lkey 2**32": RecvWr(wr_id=1, sg_list=[Sge(b.mr.vaddr, 64, U32)]),
    }[case]
    with pytest.raises(PostError) as err:
        b.qp.post_recv(wr)
    assert (err.value.status, err.value.failed_index) == (Status.INVALID_PARAMETER, 0)
    assert p.send(b"after")[1].status is WcStatus.SUCCESS


AV_CASES: dict[str, dict[str, Any]] = {
    "sl 16": {"sl": 16},
    "sl 99": {"sl": 99},
    "static_rate -1": {"static_rate": -1},
    "path_bits 128": {"path_bits": 128},
    "dlid 2**16": {"dlid": 1 << 16},
    "hop_limit 256": {"hop_limit": 256},
    "traffic_class 256": {"traffic_class": 256},
    "flow_label 2**20": {"flow_label": 1 << 20},
    "dgid not a Gid": {"dgid": "junk"},
}


@pytest.mark.parametrize("case", sorted(AV_CASES))
def test_av_field_out_of_range_is_refused(world: World, case: str) -> None:
    pd = world.ca0.alloc_pd()
    grh = Grh(dgid=world.p1.gids[0])
    change = AV_CASES[case]
    grh_change = {k: v for k, v in change.items() if k in Grh.__dataclass_fields__}
    av_change = {k: v for k, v in change.items() if k not in grh_change}
    base = AvAttr(port_num=world.p0.port_num, dlid=world.p1.lid, grh=grh)
    attr = dataclasses.replace(base, grh=dataclasses.replace(grh, **grh_change), **av_change)
    with pytest.raises(InvalidParameter):
        pd.create_av(attr)
    good = pd.create_av(AvAttr(port_num=world.p0.port_num, dlid=world.p1.lid, grh=grh))
    with pytest.raises(InvalidParameter):
        good.modify(attr)
    assert good.query().grh == grh  # the refused modify changed nothing


@pytest.mark.parametrize(
    "mod",
    [
        QpMod("RTS"),  # type: ignore[arg-type]
        QpMod(QpState.RTS, sq_psn=-1),
        QpMod(QpState.RTS, sq_psn=1 << 24),
        QpMod(QpState.RTS, retry_cnt=8),
        QpMod(QpState.RTS, local_ack_timeout="14"),  # type: ignore[arg-type]
    ],
    ids=["state str", "sq_psn -1", "sq_psn 2**24", "retry_cnt 8", "timeout str"],
)
def test_modify_value_out_of_range_is_refused(world: World, mod: QpMod) -> None:
    p = make_pair(world.ca0, world.p0, world.ca1, world.p1, QpType.RC, do_connect=False)
    with pytest.raises(InvalidParameter):
        p.a.qp.modify(mod)
    assert p.a.qp.query().state is QpState.RESET


def test_rxe_timer_thread_survives_a_work_request_no_packet_can_carry() -> None:
    """Below the access layer: a WR posted on rxe's channel interface directly
    with an R_Key of 2**32 must not stop the timer thread, which every other QP of
    the device needs for its retransmits and time-outs."""
    w = open_world("rxe")
    try:
        timing = RcTiming(retry_cnt=1, local_ack_timeout=10)
        victim = make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.RC, timing=timing, connect_b=False)
        bystander = make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.RC, timing=timing,
                              connect_b=False)  # fmt: skip
        ci = w.registrar.traced[w.ca0.guid]
        (h_qp,) = [c.result.handle for c in ci.succeeded("create_qp")
                   if c.result.attr.qp_num == victim.a.qp.num]  # fmt: skip
        # one good request first, so the victim's timer is armed when the bad one comes
        ci.post_send(h_qp, [_write(victim, wr_id=1)])
        with contextlib.suppress(IbError):  # refusing it is fine; dying of it is not
            ci.post_send(h_qp, [_write(victim, wr_id=2, rkey=U32)])
        bystander.a.qp.post_send(_write(bystander, wr_id=9))
        wc = wait_wc(bystander.a.cq, timeout=30)
        assert (wc.wr_id, wc.status) == (9, WcStatus.TIMEOUT_RETRY_ERR)
        timers = [t for t in threading.enumerate() if t.name == f"{w.ca0.name}-timer"]
        assert timers and timers[0].is_alive()
    finally:
        close_world_parts(w.provider, w.mgr)


def test_a_type_1_bind_with_a_wr_id_past_64_bits_is_refused(world: World) -> None:
    p = make_pair(world.ca0, world.p0, world.ca1, world.p1, QpType.RC)
    try:
        mw = p.a.pd.create_mw(1)
    except ibal.status.Unsupported:
        pytest.skip(f"{world.name} has no type 1 windows")
    bind = BindWr(mr=p.a.mr, addr=p.a.mr.vaddr, length=8, access=AccessFlags.RDMA_WRITE,
                  current_rkey=mw.query()[1], wr_id=U64)  # fmt: skip
    with pytest.raises(InvalidParameter):
        mw.bind(p.a.qp, bind)
    assert p.a.cq.poll() == []  # nothing was posted
    assert mw.bind(p.a.qp, dataclasses.replace(bind, wr_id=5)) != bind.current_rkey
