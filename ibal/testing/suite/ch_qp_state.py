"""Chapter: one QP state -- posting in SQE/ERROR flushes, errors move the state, recovery, drain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.al import DRAIN_RECV_WR_ID, DRAIN_SEND_WR_ID
from ibal.testing.helpers import RcTiming, Side, wait_until, wait_wc, wait_wcs
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, deviation, require_qp_type
from ibal.types import (
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

if TYPE_CHECKING:
    from ibal.al import Ca, Qp

FAST = RcTiming(retry_cnt=0, rnr_retry_cnt=0, local_ack_timeout=8, rnr_nak_timeout=1)
FLUSH = WcStatus.WR_FLUSHED_ERR


def _sends(side: Side, first: int, n: int = 2) -> list[SendWr]:
    """``n`` sends alternating signaled / unsignaled (flushed WRs complete either way)."""
    return [
        SendWr(
            wr_id=first + i,
            sg_list=[side.sge(0, 8)],
            send_opt=SendOpt.SIGNALED if i % 2 == 0 else SendOpt.NONE,
        )
        for i in range(n)
    ]


def state(qp: Qp) -> QpState:
    """``qp.state`` read afresh (the AL changes it as errors are observed)."""
    return qp.state


class QpStateChecks(ConformanceBase):
    chapter = "QP state"

    @rules("iba:wc.flush", "iba:qps.error-flush")
    def test_post_send_in_error_flushes_signaled_and_unsignaled(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """IBA 10.8.3 / 11.4.1.1: a QP in ERROR accepts sends; each WR, signaled or not,
        completes with WR_FLUSHED_ERR, in order."""
        pair = self.loop(ca, port, QpType.RC, timing=FAST, sq_signaled=False)
        a = pair.a
        a.qp.modify(QpMod(QpState.ERROR))
        a.qp.post_send(_sends(a, 10, 4))
        wcs = wait_wcs(a.cq, 4)
        assert [(w.wr_id, w.status, w.qp_num) for w in wcs] == [
            (10 + i, FLUSH, a.qp.num) for i in range(4)
        ]
        assert state(a.qp) is QpState.ERROR and a.qp.query().state is QpState.ERROR

    @rules("iba:retry.error-state")
    def test_rc_error_completion_moves_the_state_to_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.8.3 / api.md: polling an RC error completion moves ``qp.state`` to ERROR at
        once (no query); the provider agrees; a send posted then flushes."""
        pair = self.loop(ca, port, QpType.RC, timing=FAST)
        a = pair.a
        a.qp.post_send(SendWr(wr_id=9, sg_list=[a.sge(0, 8)]))  # B has no receive: RNR
        wc = wait_wc(a.cq)
        assert (wc.wr_id, wc.status) == (9, WcStatus.RNR_RETRY_ERR)
        assert state(a.qp) is QpState.ERROR
        wait_until(lambda: a.qp.query().state is QpState.ERROR, "provider reports ERROR")
        a.qp.post_send(SendWr(wr_id=11, sg_list=[a.sge(0, 8)]))
        assert (lambda w: (w.wr_id, w.status))(wait_wc(a.cq)) == (11, FLUSH)

    @rules("iba:qps.sqe")
    def test_ud_send_error_enters_sqe_and_recovers_to_rts(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.8.3 / ibal.qp_fsm: a UD send error puts the QP in SQE, where a receive posted
        before the error stays and takes a datagram; sends posted in SQE flush;
        ``modify(RTS, current_state=SQERR)`` brings it back."""
        require_qp_type(ca.capabilities, QpType.UD)
        pair = self.loop(ca, port, QpType.UD)
        a, b = pair.a, pair.b
        a.recv(20, 512, 512)
        bad = Sge(addr=a.mr.vaddr, length=8, lkey=a.mr.lkey ^ 0x00FF_FF00)
        a.qp.post_send(SendWr(wr_id=1, sg_list=[bad], ud=pair.ud(b)))
        wc = wait_wc(a.cq)
        assert wc.wr_id == 1 and wc.status not in (WcStatus.SUCCESS, FLUSH)
        wait_until(lambda: a.qp.query().state in (QpState.SQERR, QpState.ERROR), "QP errored")
        with deviation(ca.capabilities, "sqe"):
            assert state(a.qp) is QpState.SQERR
            b.put(0, b"to SQE")
            b.qp.post_send(SendWr(wr_id=21, sg_list=[b.sge(0, 6)], ud=pair.ud(a)))
            got = {w.wr_id: w.status for w in wait_wcs(a.cq, 2 if a.cq is b.cq else 1)}
            assert got.get(20) is WcStatus.SUCCESS, f"the receive posted before SQE: {got}"
            assert a.get(512 + 40, 6) == b"to SQE"
            if a.cq is not b.cq:
                assert wait_wc(b.cq).wr_id == 21
        a.qp.post_send(SendWr(wr_id=2, sg_list=[a.sge(0, 8)], ud=pair.ud(b)))
        assert (lambda w: (w.wr_id, w.status))(wait_wc(a.cq)) == (2, FLUSH)
        a.qp.modify(QpMod(QpState.RTS, current_state=QpState.SQERR))
        assert state(a.qp) is QpState.RTS and a.qp.query().state is QpState.RTS
        send, recv = pair.send(b"after SQE", wr_id=3, recv_id=30)
        assert (send.wr_id, send.status, recv.wr_id, recv.status) == (
            3, WcStatus.SUCCESS, 30, WcStatus.SUCCESS)  # fmt: skip

    @rules("iba:qps.error-flush")
    def test_drain_flushes_everything_posted(self, ca: Ca, port: PortAttr) -> None:
        """api.md / IBA 10.8.3: ``qp.drain()`` moves the QP to ERROR and returns only when every
        WR posted before it has completed; the markers are not among the completions."""
        pair = self.loop(ca, port, QpType.RC, timing=FAST)
        b = pair.b
        for i in range(3):
            b.recv(40 + i)
        wcs = b.qp.drain(timeout=30)
        assert [(w.wr_id, w.status, w.wc_type) for w in wcs] == [
            (40 + i, FLUSH, WcType.RECV) for i in range(3)
        ]
        assert state(b.qp) is QpState.ERROR
        assert not {DRAIN_SEND_WR_ID, DRAIN_RECV_WR_ID} & {w.wr_id for w in wcs}
        assert b.cq.poll() == []

    @rules("doc:api.md")
    def test_drain_of_a_datagram_qp(self, ca: Ca, port: PortAttr) -> None:
        """api.md: ``drain`` works on UD QPs too (its marker send carries a throwaway AV)."""
        require_qp_type(ca.capabilities, QpType.UD)
        pair = self.loop(ca, port, QpType.UD)
        pair.b.recv(5)
        wcs = pair.b.qp.drain(timeout=30)
        assert [(w.wr_id, w.status) for w in wcs] == [(5, FLUSH)]
        assert state(pair.b.qp) is QpState.ERROR

    @rules("doc:qp-state-machine")
    def test_drain_after_an_error_then_reset(self, ca: Ca, port: PortAttr) -> None:
        """ibal.qp_fsm: a QP an error completion put in ERROR drains (nothing left to flush)
        and goes back to RESET."""
        pair = self.loop(ca, port, QpType.RC, timing=FAST)
        a = pair.a
        a.qp.post_send(SendWr(wr_id=9, sg_list=[a.sge(0, 8)], opcode=WrType.SEND))
        assert wait_wc(a.cq).status is WcStatus.RNR_RETRY_ERR
        assert state(a.qp) is QpState.ERROR
        assert a.qp.drain(timeout=30) == []
        a.qp.modify(QpMod(QpState.RESET))
        assert state(a.qp) is QpState.RESET and a.qp.query().state is QpState.RESET
