"""One QP state over the mock: errors move ``qp.state``, modify races, SQE recovery, drain."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import ibal
from ibal import qp_fsm
from ibal.al import AccessLayer, Ca
from ibal.al.qp import Qp
from ibal.clock import ManualClock
from ibal.status import InvalidQpState, Timeout
from ibal.testing.helpers import RcTiming, make_pair
from ibal.types import (
    AsyncEvent,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WcType,
    WrType,
)

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

FLUSH = WcStatus.WR_FLUSHED_ERR
FAST = RcTiming(retry_cnt=0, rnr_retry_cnt=0, local_ack_timeout=8, rnr_nak_timeout=1)


def state(qp: Qp) -> QpState:
    return qp.state


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def al(clock: ManualClock) -> Iterator[AccessLayer]:
    with ibal.open_al({"mock": {"cas": 1, "clock": clock}}, clock=clock) as al:
        yield al


@pytest.fixture
def fabric(al: AccessLayer) -> Any:
    return al.manager.providers[0].fabric  # type: ignore[attr-defined]


@pytest.fixture
def ca(al: AccessLayer) -> Ca:
    return al.open_ca(al.get_ca_guids()[0])


@pytest.fixture
def port(ca: Ca) -> PortAttr:
    return ca.query().ports[0]


def bad_send(pair: Any, wr_id: int = 1) -> SendWr:
    a, b = pair.a, pair.b
    sge = Sge(addr=a.mr.vaddr, length=8, lkey=a.mr.lkey ^ 0x00FF_FF00)
    return SendWr(wr_id=wr_id, sg_list=[sge], ud=pair.ud(b) if pair.qp_type is QpType.UD else None)


# ------------------------------------------------------------------ the rule table


@pytest.mark.parametrize(
    ("qp_type", "current", "new", "expected"),
    [
        (QpType.RC, QpState.RTS, QpState.ERROR, QpState.ERROR),
        (QpType.RC, QpState.RTS, QpState.SQERR, QpState.ERROR),  # RC has no SQE
        (QpType.UD, QpState.RTS, QpState.SQERR, QpState.SQERR),
        (QpType.UD, QpState.SQD, QpState.SQERR, QpState.SQERR),
        (QpType.UD, QpState.RTR, QpState.SQERR, QpState.RTR),  # no send queue running yet
        (QpType.UD, QpState.SQERR, QpState.ERROR, QpState.ERROR),
        (QpType.UD, QpState.ERROR, QpState.SQERR, QpState.ERROR),  # no way back but modify
        (QpType.RC, QpState.RESET, QpState.ERROR, QpState.RESET),  # a late report of old news
    ],
)
def test_observed_state_rules(
    qp_type: QpType, current: QpState, new: QpState, expected: QpState
) -> None:
    assert qp_fsm.observed_state(qp_type, current, new) is expected


# ------------------------------------------------------------------ async events


@pytest.mark.parametrize(
    ("qp_type", "code", "expected"),
    [
        (QpType.RC, AsyncEvent.QP_FATAL, QpState.ERROR),
        (QpType.RC, AsyncEvent.WQ_ACCESS_ERROR, QpState.ERROR),
        (QpType.RC, AsyncEvent.SQ_ERROR, QpState.ERROR),
        (QpType.UD, AsyncEvent.SQ_ERROR, QpState.SQERR),
        (QpType.UD, AsyncEvent.RQ_ERROR, QpState.ERROR),
        (QpType.UD, AsyncEvent.QP_APM, QpState.RTS),  # path migration: same state
    ],
)
def test_async_events_move_the_state_when_raised(
    ca: Ca, port: PortAttr, fabric: Any, qp_type: QpType, code: AsyncEvent, expected: QpState
) -> None:
    got: list[AsyncEvent] = []
    pair = make_pair(ca, port, ca, port, qp_type, timing=FAST)
    pair.a.qp._event_cb = lambda rec: got.append(rec.code)
    fabric.raise_event(_mock_qp(fabric, pair.a.qp.num), code)
    # The state moved in the provider's upcall, before any callback ran.
    assert state(pair.a.qp) is expected
    al = pair.a.ca._al
    assert al is not None
    al.manager.dispatcher.flush()
    assert got == [code]


def _mock_qp(fabric: Any, num: int) -> Any:
    """The mock's own QP object (what ``fabric.raise_event`` takes)."""
    return fabric.cas[0].qps[num]


def test_a_late_error_event_does_not_resurrect_a_reset_qp(
    ca: Ca, port: PortAttr, fabric: Any
) -> None:
    pair = make_pair(ca, port, ca, port, QpType.RC, timing=FAST)
    qp = pair.a.qp
    mock_qp = _mock_qp(fabric, qp.num)
    qp.modify(QpMod(QpState.RESET))
    fabric.raise_event(mock_qp, AsyncEvent.QP_FATAL)
    assert state(qp) is QpState.RESET


# ------------------------------------------------------------------ error completions


def test_ud_send_error_moves_to_sqe_and_recovers(ca: Ca, port: PortAttr) -> None:
    pair = make_pair(ca, port, ca, port, QpType.UD)
    qp = pair.a.qp
    qp.post_send(bad_send(pair))
    assert state(qp) is QpState.RTS  # not polled yet: the AL has not seen the error
    (wc,) = pair.a.cq.poll()
    assert wc.status is WcStatus.LOCAL_PROTECTION_ERR and wc.wc_type is WcType.SEND
    assert state(qp) is QpState.SQERR
    qp.post_send(SendWr(wr_id=2, sg_list=[pair.a.sge(0, 4)], ud=pair.ud(pair.b),
                        send_opt=SendOpt.NONE))  # fmt: skip
    assert [(w.wr_id, w.status) for w in pair.a.cq.poll()] == [(2, FLUSH)]
    assert state(qp) is QpState.SQERR  # a flush changes nothing
    qp.modify(QpMod(QpState.RTS, current_state=QpState.SQERR))
    assert state(qp) is QpState.RTS
    send, recv = pair.send(b"again", wr_id=3, recv_id=4)
    assert (send.status, recv.status) == (WcStatus.SUCCESS, WcStatus.SUCCESS)


def test_recovery_works_before_the_error_is_polled(ca: Ca, port: PortAttr) -> None:
    """current_state=SQERR while the AL still says RTS: the provider is asked, and agrees."""
    pair = make_pair(ca, port, ca, port, QpType.UD)
    qp = pair.a.qp
    qp.post_send(bad_send(pair))
    assert state(qp) is QpState.RTS
    qp.modify(QpMod(QpState.RTS, current_state=QpState.SQERR))
    assert state(qp) is QpState.RTS and qp.query().state is QpState.RTS
    with pytest.raises(InvalidQpState):  # the provider says RTS: SQERR is wrong now
        qp.modify(QpMod(QpState.RTS, current_state=QpState.SQERR))
    assert state(qp) is QpState.RTS


def test_rc_error_completion_means_error_and_posts_flush(ca: Ca, port: PortAttr) -> None:
    pair = make_pair(ca, port, ca, port, QpType.RC, timing=FAST)
    qp = pair.a.qp
    qp.post_send(bad_send(pair))
    (wc,) = pair.a.cq.poll()
    assert wc.status is WcStatus.LOCAL_PROTECTION_ERR
    assert state(qp) is QpState.ERROR
    qp.post_send([SendWr(wr_id=5, sg_list=[pair.a.sge(0, 4)], send_opt=SendOpt.NONE),
                  SendWr(wr_id=6, opcode=WrType.RDMA_WRITE, sg_list=[pair.a.sge(0, 4)])])
    qp.post_recv([])  # an empty list is fine in ERROR too
    pair.a.recv(7)
    assert [(w.wr_id, w.status) for w in pair.a.cq.poll()] == [(5, FLUSH), (6, FLUSH), (7, FLUSH)]


def test_a_receive_error_on_ud_leaves_the_state_to_the_provider(ca: Ca, port: PortAttr) -> None:
    pair = make_pair(ca, port, ca, port, QpType.UD)
    pair.b.recv(1, 0, 8)  # too small for GRH + payload: a local length error on receive
    pair.a.put(0, b"x" * 64)
    pair.a.qp.post_send(SendWr(wr_id=2, sg_list=[pair.a.sge(0, 64)], ud=pair.ud(pair.b)))
    wcs = pair.b.cq.poll()
    recv = [w for w in wcs if w.qp_num == pair.b.qp.num]
    assert recv and recv[0].status is not WcStatus.SUCCESS
    assert state(pair.b.qp) is pair.b.qp.query().state


# ------------------------------------------------------------------ modify races


def test_an_error_while_modify_waits_for_the_provider_is_not_lost(
    ca: Ca, port: PortAttr, fabric: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider answers RTS, then an error arrives before modify records it: the AL asks
    the provider again and keeps SQERR, not the stale RTS."""
    pair = make_pair(ca, port, ca, port, QpType.UD)
    qp = pair.a.qp
    mock_ca = fabric.cas[0]
    real = mock_ca.modify_qp

    def racing(h: Any, mod: QpMod) -> Any:
        answer = real(h, mod)
        qp.post_send(bad_send(pair))
        assert [w.wr_id for w in pair.a.cq.poll()] == [1]  # observed while modify is in flight
        return answer

    monkeypatch.setattr(mock_ca, "modify_qp", racing)
    qp.modify(QpMod(QpState.RTS, qkey=0x1234))
    monkeypatch.undo()
    assert state(qp) is QpState.SQERR and qp.query().state is QpState.SQERR


def test_concurrent_modifies_leave_the_providers_state(ca: Ca, port: PortAttr) -> None:
    """Four threads modify (RTS -> SQD -> RTS ...) while a fifth makes a send fail and polls
    the error: whatever order they land in (RTS -> RTS also recovers SQE), the AL ends where
    the provider is."""
    pair = make_pair(ca, port, ca, port, QpType.UD)
    qp = pair.a.qp
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def modifier(k: int) -> None:
        start.wait()
        for i in range(40):
            try:
                if i % 2:
                    qp.modify(QpMod(QpState.SQD))
                else:
                    qp.modify(QpMod(QpState.RTS, qkey=k * 1000 + i))
            except InvalidQpState:
                pass  # another thread's modify or the error came first
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    def failer() -> None:
        start.wait()
        qp.post_send(bad_send(pair))
        while not pair.a.cq.poll():
            pass

    threads = [threading.Thread(target=modifier, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=failer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    seen = state(qp)
    assert seen is qp.query().state
    assert seen in (QpState.RTS, QpState.SQD, QpState.SQERR)


# ------------------------------------------------------------------ drain


def test_drain_flushes_outstanding_sends_signaled_or_not(
    ca: Ca, port: PortAttr, clock: ManualClock
) -> None:
    """B never answers (INIT) and time stands still: A's sends are outstanding until drain."""
    pair = make_pair(ca, port, ca, port, QpType.RC, connect_b=False, sq_signaled=False)
    a = pair.a
    a.qp.post_send([SendWr(wr_id=i, sg_list=[a.sge(0, 8)],
                           send_opt=SendOpt.SIGNALED if i % 2 else SendOpt.NONE)
                    for i in range(4)])  # fmt: skip
    a.recv(9)
    assert a.cq.poll() == []
    wcs = a.qp.drain(timeout=10)
    assert [(w.wr_id, w.status) for w in wcs] == [(i, FLUSH) for i in range(4)] + [(9, FLUSH)]
    assert state(a.qp) is QpState.ERROR
    assert clock.now() == 0.0


def test_drain_returns_other_qps_completions_from_the_shared_cq(ca: Ca, port: PortAttr) -> None:
    pair = make_pair(ca, port, ca, port, QpType.RC, timing=FAST)
    other = pair.b  # a separate CQ; put another QP's completion on A's CQ instead
    from ibal.al import QpCreate

    twin = pair.a.pd.create_qp(QpCreate(QpType.RC, pair.a.cq, pair.a.cq))
    twin.modify(QpMod(QpState.ERROR))
    twin.post_send(SendWr(wr_id=77, sg_list=[pair.a.sge(0, 4)]))
    pair.a.recv(5)
    wcs = pair.a.qp.drain(timeout=10)
    assert sorted((w.qp_num, w.wr_id) for w in wcs) == sorted(
        [(twin.num, 77), (pair.a.qp.num, 5)]
    )
    assert other.cq.poll() == []


def test_drain_times_out_when_someone_else_takes_the_markers(
    ca: Ca, port: PortAttr, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = make_pair(ca, port, ca, port, QpType.RC, timing=FAST)
    cq = pair.a.cq
    real_poll = type(cq).poll

    def thief(self: Any, max_entries: int = 16) -> list[Any]:
        real_poll(self, max_entries)  # a concurrent poller took them
        return []

    monkeypatch.setattr(type(cq), "poll", thief)
    with pytest.raises(Timeout):
        pair.a.qp.drain(timeout=0.05)


def test_drain_of_a_reset_qp_is_refused(ca: Ca, port: PortAttr) -> None:
    pair = make_pair(ca, port, ca, port, QpType.RC, do_connect=False)
    with pytest.raises(InvalidQpState):
        pair.a.qp.drain()


def test_modify_validated_moves_the_qp_and_keeps_the_state_and_path_checks(
    ca: Ca, port: PortAttr
) -> None:
    """The CM's entry skips the field checks, not the state machine nor the AV's widths;
    the public ``modify`` still refuses what ``modify_validated`` was trusted with."""
    from ibal.al import QpCreate
    from ibal.status import InvalidParameter
    from ibal.types import AccessFlags, AvAttr

    cq = ca.create_cq(4)
    qp = ca.alloc_pd().create_qp(QpCreate(QpType.RC, cq, cq))
    with pytest.raises(InvalidQpState):  # RESET -> RTR is no transition
        qp.modify_validated(QpMod(QpState.RTR, dest_qp=1))
    assert qp.state is QpState.RESET
    with pytest.raises(InvalidParameter, match="sl"):
        qp.modify_validated(QpMod(QpState.INIT, port_num=port.port_num, pkey_index=0,
                                  primary_av=AvAttr(port_num=port.port_num, sl=99)))  # fmt: skip
    assert qp.state is QpState.RESET
    with pytest.raises(InvalidParameter, match="retry_cnt"):
        qp.modify(QpMod(QpState.INIT, port_num=port.port_num, pkey_index=0, retry_cnt=99))
    qp.modify_validated(QpMod(QpState.INIT, port_num=port.port_num, pkey_index=0,
                              access=AccessFlags.LOCAL_WRITE))  # fmt: skip
    assert qp.state is QpState.INIT and qp.query().state is QpState.INIT
