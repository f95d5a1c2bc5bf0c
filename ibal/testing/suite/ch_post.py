"""Chapter: posting work requests (states, queue limits, validation, signaling)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

from ibal.status import (
    InsufficientResources,
    InvalidAvHandle,
    InvalidMaxSge,
    InvalidParameter,
    InvalidQpHandle,
    InvalidQpState,
    InvalidWrType,
    Unsupported,
)
from ibal.testing.helpers import (
    UD_QKEY,
    RcTiming,
    av_to,
    drain,
    make_side,
    qp_access,
    to_init,
    to_rtr,
    wait_until,
    wait_wc,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, post_raises, require, require_qp_type
from ibal.types import (
    DgrmInfo,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    UdDest,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Side


class PostChecks(ConformanceBase):
    chapter = "posting"

    def _side_in(self, ca: Ca, port: PortAttr, state: QpState, qp_type: QpType = QpType.RC) -> Side:
        require_qp_type(ca.capabilities, qp_type)
        side = make_side(ca, port, qp_type)
        if state is QpState.RESET:
            return side
        to_init(side.qp, port.port_num, qp_access(ca.capabilities))
        if state is QpState.INIT:
            return side
        to_rtr(side.qp, av_to(port, port.port_num), port.active_mtu, side.qp.num)
        if state is QpState.RTR:
            return side
        if state is QpState.ERROR:
            side.qp.modify(QpMod(QpState.ERROR))
            return side
        raise AssertionError(state)

    @pytest.mark.parametrize(
        "state", [QpState.RESET, QpState.INIT, QpState.RTR], ids=lambda s: s.name
    )
    @rules("ci:90", "al:37", "al:50")
    def test_post_send_outside_rts_raises_invalid_qp_state(
        self, ca: Ca, port: PortAttr, state: QpState
    ) -> None:
        """ci-contract rule 90 / access-layer rules 37, 50: sends in RESET, INIT, RTR →
        IB_INVALID_QP_STATE (in SQE and ERROR they flush: ch_qp_state)."""
        side = self._side_in(ca, port, state)
        with post_raises(InvalidQpState, 0):
            side.qp.post_send(
                [
                    SendWr(wr_id=1, sg_list=[side.sge(0, 4)]),
                    SendWr(wr_id=2, sg_list=[side.sge(0, 4)]),
                ]
            )
        assert drain(side.cq) == []

    @rules("ci:93", "al:50")
    def test_post_recv_in_reset_raises_invalid_qp_state(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 93 / access-layer rule 50: receives in RESET → IB_INVALID_QP_STATE."""
        side = self._side_in(ca, port, QpState.RESET)
        with post_raises(InvalidQpState, 0):
            side.recv(1)

    @rules("ci:93")
    @pytest.mark.parametrize("state", [QpState.INIT, QpState.RTR], ids=lambda s: s.name)
    def test_post_recv_allowed_before_rts(self, ca: Ca, port: PortAttr, state: QpState) -> None:
        """ci-contract rule 93 / decisions: receives are accepted from INIT on (IBA 1.2)."""
        side = self._side_in(ca, port, state)
        side.recv(1)
        side.recv(2)
        assert side.qp.query().state is state

    @rules("iba:qps.error-flush")
    def test_post_recv_in_error_completes_flushed(self, ca: Ca, port: PortAttr) -> None:
        """decisions / qp-state-machine: a QP in ERROR accepts receives and flushes them
        (WR_FLUSHED_ERR)."""
        side = self._side_in(ca, port, QpState.ERROR)
        side.recv(41)
        wc = wait_wc(side.cq)
        assert (wc.wr_id, wc.status, wc.qp_num) == (41, WcStatus.WR_FLUSHED_ERR, side.qp.num)

    @rules("ci:91", "al:48", "al:49")
    def test_post_send_beyond_sq_depth_posts_prefix(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 91 / access-layer rules 48, 49: beyond free SQ slots →
        IB_INSUFFICIENT_RESOURCES at the first unposted WR; the WRs before it were posted."""
        # B stays in INIT and A waits seconds for ACKs: nothing completes while we post.
        slow = RcTiming(retry_cnt=7, rnr_retry_cnt=7, local_ack_timeout=20, rnr_nak_timeout=1)
        pair = self.loop(
            ca, port, QpType.RC, sq_depth=4, cq_size=1024, timing=slow, connect_b=False
        )
        depth = pair.a.qp.query().caps.sq_depth
        assert depth <= 1000, f"granted sq_depth {depth} too large for this check"
        wrs = [
            SendWr(
                wr_id=i,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(64),
                rkey=pair.b.mr.rkey,
            )
            for i in range(depth + 2)
        ]
        with post_raises(InsufficientResources, depth):
            pair.a.qp.post_send(wrs)
        pair.a.qp.modify(QpMod(QpState.ERROR))
        got = wait_wcs(pair.a.cq, depth)
        assert [w.wr_id for w in got] == list(range(depth))
        # flushed by the move to ERROR (or timed out first, on a provider without real timers)
        assert {w.status for w in got} <= {WcStatus.WR_FLUSHED_ERR, WcStatus.TIMEOUT_RETRY_ERR}
        assert drain(pair.a.cq) == []

    @rules("ci:93", "al:48")
    def test_post_recv_beyond_rq_depth_posts_prefix(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 93 / access-layer rule 48: beyond RQ depth → IB_INSUFFICIENT_RESOURCES
        with pp_failed."""
        side = self._side_in(
            ca, port, QpState.INIT, QpType.RC if QpType.RC in caps.qp_types else QpType.UD
        )
        depth = side.qp.query().caps.rq_depth
        wrs = [RecvWr(wr_id=i, sg_list=[side.sge(0, 16)]) for i in range(depth + 1)]
        with post_raises(InsufficientResources, depth):
            side.qp.post_recv(wrs)
        side.qp.modify(QpMod(QpState.ERROR))
        flushed = wait_wcs(side.cq, depth)
        assert sorted(w.wr_id for w in flushed) == list(range(depth))

    @rules("ci:92", "al:48", "al:49")
    def test_post_send_too_many_sges_at_that_wr(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 92 / access-layer rules 48, 49: num_ds > sq_sge → IB_INVALID_MAX_SGE;
        earlier WRs run."""
        pair = self.loop(ca, port, QpType.RC, sq_sge=1)
        sges = pair.a.qp.query().caps.sq_sge
        too_many = [pair.a.sge(8 * i, 8) for i in range(sges + 1)]
        wrs = [
            SendWr(
                wr_id=1,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(0),
                rkey=pair.b.mr.rkey,
            ),
            SendWr(
                wr_id=2,
                opcode=WrType.RDMA_WRITE,
                sg_list=too_many,
                remote_addr=pair.b.remote(0),
                rkey=pair.b.mr.rkey,
            ),
            SendWr(
                wr_id=3,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(0),
                rkey=pair.b.mr.rkey,
            ),
        ]
        with post_raises(InvalidMaxSge, 1):
            pair.a.qp.post_send(wrs)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (1, WcStatus.SUCCESS)
        pair.a.qp.post_send(
            SendWr(
                wr_id=9,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(0),
                rkey=pair.b.mr.rkey,
            )
        )
        assert wait_wc(pair.a.cq).wr_id == 9  # WR 3 was never posted

    @rules("al:49")
    def test_post_recv_too_many_sges(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 49: a receive with more SGEs than rq_sge → IB_INVALID_MAX_SGE."""
        side = self._side_in(ca, port, QpState.INIT)
        sges = side.qp.query().caps.rq_sge
        with post_raises(InvalidMaxSge, 0):
            side.qp.post_recv(
                RecvWr(wr_id=1, sg_list=[side.sge(8 * i, 8) for i in range(sges + 1)])
            )

    @rules("ci:92", "al:49")
    def test_post_send_unknown_opcode_raises_invalid_wr_type(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 92 / access-layer rule 49: an unknown wr_type → IB_INVALID_WR_TYPE."""
        pair = self.loop(ca, port, QpType.RC)
        with post_raises(InvalidWrType, 0):
            pair.a.qp.post_send(
                SendWr(wr_id=1, opcode=cast(WrType, 42), sg_list=[pair.a.sge(0, 4)])
            )

    @pytest.mark.parametrize(
        ("qp_type", "opcode"),
        [
            (QpType.UD, WrType.RDMA_WRITE),
            (QpType.UD, WrType.RDMA_READ),
            (QpType.UC, WrType.RDMA_READ),
            (QpType.UC, WrType.FETCH_ADD),
        ],
        ids=lambda v: v.name,
    )
    @rules("al:49")
    def test_opcode_not_in_transport_refused(
        self, ca: Ca, port: PortAttr, qp_type: QpType, opcode: WrType
    ) -> None:
        """ci-contract §2.9 (IBA table 81) / access-layer rule 49: an opcode the transport lacks is
        refused."""
        pair = self.loop(ca, port, qp_type)
        ud = pair.ud(pair.b) if qp_type.is_datagram else None
        with pytest.raises((InvalidWrType, Unsupported)) as info:
            pair.a.qp.post_send(
                SendWr(
                    wr_id=1,
                    opcode=opcode,
                    sg_list=[pair.a.sge(0, 8)],
                    remote_addr=pair.b.remote(0),
                    rkey=pair.b.mr.rkey,
                    ud=ud,
                )
            )
        assert getattr(info.value, "failed_index", 0) == 0

    @rules("al:49")
    def test_atomics_refused_without_capability(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 49: an operation the CA does not support → IB_UNSUPPORTED."""
        if caps.atomics:
            pair = self.loop(ca, port, QpType.RC)
            wc = pair.atomic(WrType.FETCH_ADD, remote_off=0, local_off=8, compare_add=0)
            assert wc.status is WcStatus.SUCCESS
            return
        pair = self.loop(ca, port, QpType.RC)
        with pytest.raises((Unsupported, InvalidWrType)):
            pair.a.qp.post_send(
                SendWr(
                    wr_id=1,
                    opcode=WrType.FETCH_ADD,
                    sg_list=[pair.a.sge(0, 8)],
                    remote_addr=pair.b.remote(0),
                    rkey=pair.b.mr.rkey,
                )
            )

    @rules("ci:92")
    def test_ud_send_without_address_refused(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 92: a UD send without an AV → IB_INVALID_AV_HANDLE (or
        IB_INVALID_PARAMETER)."""
        pair = self.loop(ca, port, QpType.UD)
        with pytest.raises((InvalidAvHandle, InvalidParameter)):
            pair.a.qp.post_send(SendWr(wr_id=1, sg_list=[pair.a.sge(0, 8)], ud=None))

    @rules("al:51")
    def test_post_accepts_one_wr_or_a_sequence(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 51: one WR may be posted alone; a sequence posts each in order."""
        pair = self.loop(ca, port, QpType.RC)
        pair.b.qp.post_recv(RecvWr(wr_id=10, sg_list=[pair.b.sge(0, 64)]))
        pair.b.qp.post_recv(
            [
                RecvWr(wr_id=11, sg_list=[pair.b.sge(64, 64)]),
                RecvWr(wr_id=12, sg_list=[pair.b.sge(128, 64)]),
            ]
        )
        pair.a.qp.post_send(SendWr(wr_id=1, sg_list=[pair.a.sge(0, 4)]))
        pair.a.qp.post_send(
            (
                SendWr(wr_id=2, sg_list=[pair.a.sge(0, 4)]),
                SendWr(wr_id=3, sg_list=[pair.a.sge(0, 4)]),
            )
        )
        assert [w.wr_id for w in wait_wcs(pair.a.cq, 3)] == [1, 2, 3]
        assert [w.wr_id for w in wait_wcs(pair.b.cq, 3)] == [10, 11, 12]

    @rules("al:48", "iba:wc.order")
    def test_receives_consumed_in_post_order(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 48: receive WRs are consumed in list order, each filling its own
        buffer."""
        pair = self.loop(ca, port, QpType.RC)
        pair.b.qp.post_recv(
            [RecvWr(wr_id=20 + i, sg_list=[pair.b.sge(1024 + 64 * i, 64)]) for i in range(3)]
        )
        for i in range(3):
            pair.a.put(16 * i, bytes([0x41 + i]) * 16)
        pair.a.qp.post_send([SendWr(wr_id=i, sg_list=[pair.a.sge(16 * i, 16)]) for i in range(3)])
        assert [w.wc_type for w in wait_wcs(pair.a.cq, 3)] == [WcType.SEND] * 3
        got = wait_wcs(pair.b.cq, 3)
        assert [w.wr_id for w in got] == [20, 21, 22]
        for i in range(3):
            assert pair.b.get(1024 + 64 * i, 16) == bytes([0x41 + i]) * 16

    @rules("iba:wc.signaling")
    def test_unsignaled_wr_gives_no_completion(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.9 (IBA selective signaling): with sq_signaled off, only SIGNALED WRs
        complete."""
        pair = self.loop(ca, port, QpType.RC, sq_signaled=False)
        pair.write(b"quiet", wr_id=1, opt=SendOpt.NONE)
        pair.write(b"loud!", wr_id=2, opt=SendOpt.SIGNALED, dst_off=64)
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == 2
        assert pair.b.get(0, 5) == b"quiet"
        assert drain(pair.a.cq) == []

    @rules("iba:wc.signaling")
    def test_all_signaled_qp_completes_every_wr(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.9: with sq_signaled on, a WR without the SIGNALED option still
        completes."""
        pair = self.loop(ca, port, QpType.RC, sq_signaled=True)
        pair.write(b"one", wr_id=1, opt=SendOpt.NONE)
        pair.write(b"two", wr_id=2, opt=SendOpt.NONE)
        assert [w.wr_id for w in wait_wcs(pair.a.cq, 2)] == [1, 2]

    @rules("doc:ci-contract §2.9")
    def test_inline_data_copied_at_post(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract §2.9: an INLINE send carries the bytes as they were at post time."""
        require(caps, "inline_data")
        pair = self.loop(ca, port, QpType.RC, max_inline=64)
        assert pair.a.qp.query().caps.max_inline >= 64
        pair.b.recv(5, 512, 64)
        pair.a.put(0, b"inline payload!!")
        pair.a.qp.post_send(
            SendWr(wr_id=1, sg_list=[pair.a.sge(0, 16)], send_opt=SendOpt.SIGNALED | SendOpt.INLINE)
        )
        pair.a.put(0, b"X" * 16)  # changing the source after post must not matter
        wcs = list(pair.wait_pair())
        assert all(w.status is WcStatus.SUCCESS for w in wcs)
        assert pair.b.get(512, 16) == b"inline payload!!"

    @rules("al:41")
    def test_post_on_destroyed_qp_raises_invalid_qp_handle(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 41: posting on a destroyed QP → IB_INVALID_QP_HANDLE."""
        pair = self.loop(ca, port, QpType.RC)
        pair.a.qp.destroy(wait=True)
        with pytest.raises(InvalidQpHandle):
            pair.a.qp.post_send(SendWr(wr_id=1, sg_list=[pair.a.sge(0, 4)]))
        with pytest.raises(InvalidQpHandle):
            pair.a.qp.post_recv(RecvWr(wr_id=1, sg_list=[pair.a.sge(0, 4)]))

    @rules("iba:qps.sqd")
    def test_sends_posted_in_sqd_run_after_resume(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """decisions: sends are accepted in SQD and execute once the QP is back in RTS."""
        require(caps, "sqd")
        pair = self.loop(ca, port, QpType.RC)
        pair.a.qp.modify(QpMod(QpState.SQD))
        wait_until(lambda: not pair.a.qp.query().sq_draining, "SQ drained")
        pair.write(b"queued in SQD", dst_off=300)
        pair.a.qp.modify(QpMod(QpState.RTS))
        wc = wait_wc(pair.a.cq)
        assert wc.status is WcStatus.SUCCESS
        assert pair.b.get(300, 13) == b"queued in SQD"

    @rules("doc:ci-contract §2.9")
    def test_zero_sge_send_is_zero_length(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.9: a SEND with no SGE is a zero-length message."""
        pair = self.loop(ca, port, QpType.RC)
        pair.b.recv(7, 0, 64)
        pair.a.qp.post_send(SendWr(wr_id=1, sg_list=[]))
        _, recv = pair.wait_pair()
        assert (recv.wr_id, recv.length, recv.status) == (7, 0, WcStatus.SUCCESS)

    @rules("doc:IBA 10.2.4")
    def test_ud_post_to_qp_in_init_sender_succeeds(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.2.4 (unreliable): a UD send completes successfully even when nobody receives
        it."""
        pair = self.loop(ca, port, QpType.UD, connect_b=False)
        pair.a.put(0, b"into the void")
        pair.a.qp.post_send(SendWr(wr_id=4, sg_list=[pair.a.sge(0, 13)], ud=pair.ud(pair.b)))
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status, wc.wc_type) == (4, WcStatus.SUCCESS, WcType.SEND)

    @rules("al:68")
    def test_ud_qkey_in_wr_used(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 68: the Q_Key in the WR is the one the receiving QP checks."""
        pair = self.loop(ca, port, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY + 1))
        side.recv(1, 0, 128)
        pair.a.put(0, b"qkey!")
        pair.a.qp.post_send(
            SendWr(
                wr_id=2,
                sg_list=[pair.a.sge(0, 5)],
                ud=UdDest(av=pair.a.av, remote_qp=side.qp.num, remote_qkey=UD_QKEY + 1),
            )
        )
        wc = wait_wc(side.cq)
        assert (wc.wr_id, wc.status, wc.src_qp) == (1, WcStatus.SUCCESS, pair.a.qp.num)
        assert side.get(40, 5) == b"qkey!"
