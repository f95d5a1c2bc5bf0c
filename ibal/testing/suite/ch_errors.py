"""Chapter: error completions (remote access, length, RNR, retry, flush)."""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING, Any

from ibal.status import InvalidParameter, PostError
from ibal.testing.helpers import (
    GRH_BYTES,
    RcTiming,
    atomic_result_ok,
    av_to,
    qp_access,
    to_init,
    to_rtr,
    to_rts,
    wait_until,
    wait_wc,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, deviation, require_opcode
from ibal.types import (
    AccessFlags,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Pair

FAST = RcTiming(retry_cnt=0, rnr_retry_cnt=0, local_ack_timeout=8, rnr_nak_timeout=1)
"""Give up at the first NAK or timeout (about a millisecond): error paths finish fast."""

PEER_TIMING = RcTiming(retry_cnt=3, rnr_retry_cnt=0, local_ack_timeout=16, rnr_nak_timeout=1)
"""For checks that also run across two CAs: a refusal still comes back at once (a NAK), but
the ACK timeout (about 0.27 s) must outlast a round trip between devices on a loaded host."""

RNR_WINDOW = 0.05
"""Seconds a check watches for a completion that must not come (RNR retried for ever)."""


def assert_local_error(caps: Capabilities, got: WcStatus, status: WcStatus) -> None:
    """A local protection or length error completes with the IBA's ``status``; a CA that
    declares the ``precise_local_errors`` deviation gets an xfail instead of a failure."""
    with deviation(caps, "precise_local_errors"):
        assert got is status, f"completed {got.name}, the IBA says {status.name}"


class ErrorCompletionChecks(ConformanceBase):
    chapter = "error completions"

    def _rc(self, ca: Ca, port: PortAttr, **kw: Any) -> Pair:
        return self.loop(ca, port, QpType.RC, timing=FAST, **kw)

    def _restricted_b(self, ca: Ca, port: PortAttr, access: AccessFlags) -> Pair:
        """An RC pair whose B buffer is registered with only ``access``."""
        pair = self._rc(ca, port)
        buf = bytearray(4096)
        pair.b.mr = pair.b.pd.reg_mem(buf, access)
        pair.b.buf = buf
        return pair

    @rules("iba:rnr.exceeded", "iba:retry.error-state")
    def test_rnr_retry_exceeded(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.7.5.2.8: an RC SEND with no receive posted and rnr_retry 0 → RNR_RETRY_ERR; QP to
        ERROR."""
        pair = self._rc(ca, port)
        pair.a.qp.post_send(SendWr(wr_id=9, sg_list=[pair.a.sge(0, 8)]))
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status, wc.qp_num) == (9, WcStatus.RNR_RETRY_ERR, pair.a.qp.num)
        wait_until(lambda: pair.a.qp.query().state is QpState.ERROR, "requester QP in ERROR")

    @rules("iba:retry.exceeded")
    def test_transport_retry_exceeded(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.7.6.1.3: no ACK within the local ACK timeout and retry_cnt 0 →
        TIMEOUT_RETRY_ERR."""
        pair = self.loop(ca, port, QpType.RC, timing=FAST, connect_b=False)
        pair.write(b"anyone?", wr_id=3)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (3, WcStatus.TIMEOUT_RETRY_ERR)
        assert pair.b.get(0, 7) == bytes(7)

    @rules("ci:74", "iba:mp.rkey", "iba:mp.untouched")
    def test_bad_rkey_is_remote_access_error(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 74 / IBA 9.7.5.1.3: an unknown R_Key → REM_ACCESS_ERR; remote memory
        untouched."""
        pair = self._rc(ca, port)
        pair.write(b"forbidden", rkey=pair.b.mr.rkey ^ 0x5A5A5A00, wr_id=4)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (4, WcStatus.REM_ACCESS_ERR)
        assert pair.b.get(0, 9) == bytes(9)

    @rules("iba:mp.remote-bounds", "iba:mp.untouched")
    def test_write_beyond_region_is_remote_access_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.3: an RDMA WRITE past the end of the remote region → REM_ACCESS_ERR."""
        pair = self._rc(ca, port)
        end = pair.b.mr.vaddr + len(pair.b.buf)
        pair.write(b"x" * 32, remote_addr=end - 16, wr_id=5)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (5, WcStatus.REM_ACCESS_ERR)
        assert pair.b.get(len(pair.b.buf) - 16, 16) == bytes(16)

    @rules("ci:74", "iba:mp.remote-rights")
    def test_write_without_remote_write_right(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 74: an MR registered without RDMA_WRITE refuses remote writes
        (REM_ACCESS_ERR)."""
        pair = self._restricted_b(ca, port, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ)
        pair.write(b"no", wr_id=6)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR

    @rules("ci:74", "iba:mp.remote-rights")
    def test_read_without_remote_read_right(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 74: an MR registered without RDMA_READ refuses remote reads
        (REM_ACCESS_ERR)."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_READ)
        pair = self._restricted_b(ca, port, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        pair.read(8, wr_id=7)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (7, WcStatus.REM_ACCESS_ERR)

    @rules("ci:74", "iba:mp.remote-rights", "iba:at.rights")
    def test_atomic_without_remote_atomic_right(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 74: an MR registered without ATOMIC refuses atomics (REM_ACCESS_ERR)."""
        require_opcode(ca.capabilities, QpType.RC, WrType.FETCH_ADD)
        pair = self._restricted_b(ca, port, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        wc = pair.atomic(WrType.FETCH_ADD, remote_off=0, local_off=0, compare_add=1)
        assert wc.status is WcStatus.REM_ACCESS_ERR

    @rules("ci:74", "iba:mp.remote-rights", "iba:mp.untouched")
    def test_local_only_mr_has_no_remote_access(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 74: an rkey is meaningful only with remote rights; local-only MRs
        refuse."""
        pair = self._restricted_b(ca, port, AccessFlags.LOCAL_WRITE)
        # ci_register_mr returns an rkey "only if remote access rights" were asked for.
        assert pair.b.mr.rkey == 0, f"local-only region got R_Key {pair.b.mr.rkey:#x}"
        assert pair.b.mr.query().rkey == 0
        # The region's own L_Key used as an R_Key (many CAs make them equal) is refused too.
        pair.write(b"local only", rkey=pair.b.mr.lkey, wr_id=8)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
        assert pair.b.get(0, 10) == bytes(10)

    @staticmethod
    def _write_from(ca: Ca, pair: Pair, sge: Sge, wr_id: int) -> None:
        """An RDMA WRITE from the bad local ``sge`` completes LOCAL_PROTECTION_ERR."""
        pair.a.qp.post_send(
            SendWr(
                wr_id=wr_id,
                opcode=WrType.RDMA_WRITE,
                sg_list=[sge],
                remote_addr=pair.b.remote(0),
                rkey=pair.b.mr.rkey,
            )
        )
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == wr_id
        assert_local_error(ca.capabilities, wc.status, WcStatus.LOCAL_PROTECTION_ERR)

    @rules("iba:mp.lkey")
    def test_bad_lkey_is_local_protection_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.3: an SGE with an unknown L_Key → LOCAL_PROTECTION_ERR (an xfail on a CA
        declaring the precise_local_errors deviation)."""
        pair = self._rc(ca, port)
        bad = Sge(addr=pair.a.mr.vaddr, length=8, lkey=pair.a.mr.lkey ^ 0x00FF_FF00)
        self._write_from(ca, pair, bad, wr_id=10)

    @rules("iba:mp.local-bounds")
    def test_sge_beyond_region_is_local_protection_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.3: an SGE running past its region's end → LOCAL_PROTECTION_ERR (an xfail on
        a CA declaring the precise_local_errors deviation)."""
        pair = self._rc(ca, port)
        bad = Sge(addr=pair.a.mr.vaddr + len(pair.a.buf) - 4, length=64, lkey=pair.a.mr.lkey)
        self._write_from(ca, pair, bad, wr_id=11)

    @rules("iba:mp.local-pd")
    def test_lkey_of_other_pd_is_local_protection_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.2.3: an MR of another PD cannot be used by the QP → LOCAL_PROTECTION_ERR (or
        an xfail on a CA declaring the precise_local_errors deviation)."""
        pair = self._rc(ca, port)
        other = ca.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
        self._write_from(ca, pair, Sge(other.vaddr, 8, other.lkey), wr_id=12)

    @rules("iba:mp.remote-pd", "iba:mp.untouched")
    def test_rkey_of_other_pd_is_remote_access_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.2.3: an R_Key whose MR is in another PD than the responder QP → REM_ACCESS_ERR."""
        pair = self._rc(ca, port)
        buf = bytearray(64)
        other = ca.alloc_pd().reg_mem(buf, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        pair.write(b"cross-pd", remote_addr=other.vaddr, rkey=other.rkey, wr_id=13)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (13, WcStatus.REM_ACCESS_ERR)
        assert bytes(buf[:8]) == bytes(8)

    @rules("iba:wc.length")
    def test_receive_too_small_is_length_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.9.3: a message longer than the receive → LOCAL_LEN_ERR there (an xfail on a CA
        declaring the precise_local_errors deviation), REM_INVALID_REQ_ERR at the sender."""
        pair = self._rc(ca, port)
        pair.b.recv(20, 0, 16)
        pair.a.qp.post_send(SendWr(wr_id=21, sg_list=[pair.a.sge(0, 64)]))
        recv = wait_wc(pair.b.cq)
        sent = wait_wc(pair.a.cq)
        assert recv.wr_id == 20
        assert_local_error(ca.capabilities, recv.status, WcStatus.LOCAL_LEN_ERR)
        assert sent.wr_id == 21
        assert sent.status in (WcStatus.REM_INVALID_REQ_ERR, WcStatus.REM_OP_ERR)

    @rules("iba:wc.length")
    def test_ud_receive_too_small_is_length_error(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.2.4: a datagram longer than the receive buffer → LOCAL_LEN_ERR at the receiver
        only (or an xfail on a CA declaring the precise_local_errors deviation)."""
        pair = self.loop(ca, port, QpType.UD)
        pair.b.recv(30, 0, GRH_BYTES + 8)
        pair.a.qp.post_send(SendWr(wr_id=31, sg_list=[pair.a.sge(0, 64)], ud=pair.ud(pair.b)))
        sent = wait_wc(pair.a.cq)
        recv = wait_wc(pair.b.cq)
        assert (sent.wr_id, sent.status) == (31, WcStatus.SUCCESS)
        assert recv.wr_id == 30
        assert_local_error(ca.capabilities, recv.status, WcStatus.LOCAL_LEN_ERR)

    @rules("iba:wc.flush")
    def test_failure_flushes_later_sends(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.8.3: after an error completion, the WRs behind it complete with WR_FLUSHED_ERR, in
        order."""
        pair = self._rc(ca, port)

        def mk(wr_id: int, rkey: int) -> SendWr:
            return SendWr(
                wr_id=wr_id,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(0),
                rkey=rkey,
            )

        pair.a.qp.post_send(
            [mk(1, pair.b.mr.rkey ^ 0x01010100), mk(2, pair.b.mr.rkey), mk(3, pair.b.mr.rkey)]
        )
        wcs = wait_wcs(pair.a.cq, 3)
        assert [(w.wr_id, w.status) for w in wcs] == [
            (1, WcStatus.REM_ACCESS_ERR),
            (2, WcStatus.WR_FLUSHED_ERR),
            (3, WcStatus.WR_FLUSHED_ERR),
        ]
        assert all(w.qp_num == pair.a.qp.num for w in wcs)

    @rules("iba:wc.errors-complete")
    def test_unsignaled_failures_and_flushes_complete(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.8.3 / ci-contract §3.3: an unsignaled WR that fails, and the unsignaled WRs
        flushed behind it, still complete (errors are always reported); in order."""
        pair = self._rc(ca, port, sq_signaled=False)
        assert not pair.a.qp.query().sq_signaled

        def mk(wr_id: int, rkey: int) -> SendWr:
            return SendWr(
                wr_id=wr_id,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(0),
                rkey=rkey,
                send_opt=SendOpt.NONE,
            )

        pair.a.qp.post_send(
            [mk(1, pair.b.mr.rkey ^ 0x01010100), mk(2, pair.b.mr.rkey), mk(3, pair.b.mr.rkey)]
        )
        wcs = wait_wcs(pair.a.cq, 3)
        assert [(w.wr_id, w.status) for w in wcs] == [
            (1, WcStatus.REM_ACCESS_ERR),
            (2, WcStatus.WR_FLUSHED_ERR),
            (3, WcStatus.WR_FLUSHED_ERR),
        ]

    @rules("iba:wc.errors-complete")
    def test_unsignaled_sends_flushed_by_error_state_complete(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """IBA 10.8.3: moving a QP to ERROR flushes its outstanding sends, unsignaled ones too,
        each with a WR_FLUSHED_ERR completion."""
        # B stays in INIT, A retries for seconds: the sends are still outstanding.
        slow = RcTiming(retry_cnt=7, rnr_retry_cnt=7, local_ack_timeout=20, rnr_nak_timeout=1)
        pair = self.loop(ca, port, QpType.RC, timing=slow, connect_b=False, sq_signaled=False)
        wrs = [
            SendWr(
                wr_id=20 + i,
                opcode=WrType.RDMA_WRITE,
                sg_list=[pair.a.sge(0, 8)],
                remote_addr=pair.b.remote(64),
                rkey=pair.b.mr.rkey,
                send_opt=SendOpt.NONE,
            )
            for i in range(3)
        ]
        pair.a.qp.post_send(wrs)
        pair.a.qp.modify(QpMod(QpState.ERROR))
        wcs = wait_wcs(pair.a.cq, 3)
        assert [w.wr_id for w in wcs] == [20, 21, 22]
        assert {w.status for w in wcs} <= {WcStatus.WR_FLUSHED_ERR, WcStatus.TIMEOUT_RETRY_ERR}

    @rules("iba:rnr.infinite")
    def test_rnr_retry_7_retries_until_a_receive_is_posted(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.7.5.2.8 / 11.2.4.2: rnr_retry_cnt 7 means retry for ever: a SEND to a QP with no
        receive waits (no completion) and succeeds once the receive is posted."""
        forever = RcTiming(retry_cnt=7, rnr_retry_cnt=7, local_ack_timeout=14, rnr_nak_timeout=1)
        pair = self.loop(ca, port, QpType.RC, timing=forever)
        assert pair.a.qp.query().rnr_retry_cnt == 7
        pair.a.put(0, b"patience")
        pair.a.qp.post_send(SendWr(wr_id=30, sg_list=[pair.a.sge(0, 8)]))
        # No receive yet: nothing may complete.  A provider that gives up (after 7 or 0
        # RNR NAKs, 0.01 ms apart) has completed RNR_RETRY_ERR within this window.
        early: list[Any] = []
        window = time.monotonic() + RNR_WINDOW
        while not early and time.monotonic() < window:
            early = pair.a.cq.poll(4)
        assert early == [], f"completed without a receive: {early}"
        pair.b.recv(31, 0, 64)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (30, WcStatus.SUCCESS)
        got = wait_wc(pair.b.cq)
        assert (got.wr_id, got.status, got.length) == (31, WcStatus.SUCCESS, 8)
        assert pair.b.get(0, 8) == b"patience"

    @rules("iba:qps.error-flush")
    def test_error_state_flushes_posted_receives(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.3.1: moving a QP to ERROR completes every posted receive with WR_FLUSHED_ERR, in
        order."""
        pair = self._rc(ca, port)
        pair.b.qp.post_recv(
            [RecvWr(wr_id=50 + i, sg_list=[pair.b.sge(64 * i, 64)]) for i in range(4)]
        )
        pair.b.qp.modify(QpMod(QpState.ERROR))
        wcs = wait_wcs(pair.b.cq, 4)
        assert [(w.wr_id, w.status) for w in wcs] == [
            (50 + i, WcStatus.WR_FLUSHED_ERR) for i in range(4)
        ]

    @rules("ci:84", "al:56")
    def test_dereg_mr_with_posted_receive(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 84 / access-layer rule 56: a WR whose region was deregistered completes
        LOCAL_PROTECTION_ERR (or an xfail on a CA declaring the precise_local_errors deviation)."""
        pair = self._rc(ca, port)
        buf = bytearray(256)
        mr = pair.b.pd.reg_mem(buf, AccessFlags.LOCAL_WRITE)
        pair.b.qp.post_recv(RecvWr(wr_id=60, sg_list=[mr.sge(0, 64)]))
        mr.dereg()
        pair.a.put(0, b"late")
        pair.a.qp.post_send(SendWr(wr_id=61, sg_list=[pair.a.sge(0, 4)]))
        recv = wait_wc(pair.b.cq)
        assert recv.wr_id == 60
        assert_local_error(ca.capabilities, recv.status, WcStatus.LOCAL_PROTECTION_ERR)
        assert bytes(buf[:4]) == bytes(4)

    @rules("doc:IBA 9.9.3")
    def test_uc_bad_rkey_silently_dropped(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """IBA 9.9.3 (unreliable connected): a write the responder refuses is dropped; the requester
        succeeds."""
        require_opcode(caps, QpType.UC, WrType.RDMA_WRITE)
        pair = self.loop(ca, port, QpType.UC)
        pair.write(b"dropped", rkey=pair.b.mr.rkey ^ 0x3C3C3C00, wr_id=70)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (70, WcStatus.SUCCESS)
        assert pair.b.get(0, 7) == bytes(7)

    @rules("iba:at.alignment")
    def test_misaligned_atomic_refused(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.4.5: an atomic on an address not 8-byte aligned fails (at post, or as a remote
        invalid request completion)."""
        require_opcode(ca.capabilities, QpType.RC, WrType.FETCH_ADD)
        pair = self._rc(ca, port)
        pair.b.put(0, struct.pack("=Q", 5) + bytes(8))
        wr = SendWr(
            wr_id=80,
            opcode=WrType.FETCH_ADD,
            sg_list=[pair.a.sge(0, 8)],
            remote_addr=pair.b.remote(3),
            rkey=pair.b.mr.rkey,
            compare_add=1,
        )
        try:
            pair.a.qp.post_send(wr)
        except InvalidParameter as exc:  # refused at post time: also conformant
            assert isinstance(exc, PostError) and exc.failed_index == 0
            return
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == 80
        assert wc.status in (
            WcStatus.REM_INVALID_REQ_ERR,
            WcStatus.REM_ACCESS_ERR,
            WcStatus.LOCAL_OP_ERR,
        )

    @rules("iba:wc.isolation")
    def test_error_completion_on_second_qp_does_not_affect_first(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """IBA 10.8.3: an error on one QP leaves other QPs on the same CA working."""
        bad = self._rc(ca, port)
        good = self._rc(ca, port)
        bad.write(b"nope", rkey=bad.b.mr.rkey ^ 0x10101000)
        assert wait_wc(bad.a.cq).status is WcStatus.REM_ACCESS_ERR
        good.write(b"still fine", dst_off=100)
        assert wait_wc(good.a.cq).status is WcStatus.SUCCESS
        assert good.b.get(100, 10) == b"still fine"

    @rules("doc:qp-state-machine")
    def test_failed_qp_reusable_after_reset(self, ca: Ca, port: PortAttr) -> None:
        """ibal.qp_fsm: a QP in ERROR can be reset and connected again to move data."""
        pair = self._rc(ca, port)
        pair.write(b"x", rkey=pair.b.mr.rkey ^ 0x11111100)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
        for side, other in ((pair.a, pair.b), (pair.b, pair.a)):
            side.qp.modify(QpMod(QpState.RESET))
            to_init(side.qp, port.port_num, qp_access(ca.capabilities))
            to_rtr(side.qp, av_to(port, port.port_num), port.active_mtu, other.qp.num)
            to_rts(side.qp)
        pair.write(b"again", dst_off=40, wr_id=90)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (90, WcStatus.SUCCESS)
        assert pair.b.get(40, 5) == b"again"

    # ------------------------------------------------ IBA memory protection and atomics
    def _refused_atomic(self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr], off: int) -> None:
        """A FETCH_ADD at ``off`` from B's region start (outside it) → REM_ACCESS_ERR, the
        region's ends untouched; a fresh pair, since the failure takes the QP to ERROR."""
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        n = len(pair.b.buf)
        pair.b.put(0, b"\x11" * 8)
        pair.b.put(n - 8, b"\x22" * 8)
        pair.a.put(0, b"\x33" * 8)
        pair.a.qp.post_send(SendWr(wr_id=77, opcode=WrType.FETCH_ADD, sg_list=[pair.a.sge(0, 8)],
                                   remote_addr=pair.b.mr.vaddr + off, rkey=pair.b.mr.rkey,
                                   compare_add=1))  # fmt: skip
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (77, WcStatus.REM_ACCESS_ERR), (
            f"atomic at region offset {off} completed {wc.status.name}"
        )
        assert pair.b.get(0, 8) == b"\x11" * 8 and pair.b.get(n - 8, 8) == b"\x22" * 8
        assert pair.a.get(0, 8) == b"\x33" * 8, "a refused atomic wrote its local buffer"

    @rules("iba:at.bounds", "iba:at.fetch-add", "iba:mp.untouched")
    def test_atomic_at_both_ends_of_region(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: FETCH_ADD on a region's first and last 8 bytes works; 8 bytes before its
        start or at its end → REM_ACCESS_ERR and nothing changes."""
        require_opcode(ca.capabilities, QpType.RC, WrType.FETCH_ADD)
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        n = len(pair.b.buf)
        for wr_id, off in ((70, 0), (71, n - 8)):
            init = struct.pack("<Q", 0xFFFF_FFFF_FFFF_FFF0 + wr_id % 2)
            pair.b.put(off, init)
            wc = pair.atomic(WrType.FETCH_ADD, remote_off=off, local_off=64, compare_add=0x20,
                             wr_id=wr_id)  # fmt: skip
            assert (wc.wr_id, wc.status) == (wr_id, WcStatus.SUCCESS), wc.status.name
            assert atomic_result_ok(init, pair.a.get(64, 8), pair.b.get(off, 8),
                                    lambda v: v + 0x20), f"FETCH_ADD at offset {off}"  # fmt: skip
        self._refused_atomic(ca, port, peer, -8)
        self._refused_atomic(ca, port, peer, n)

    @rules("iba:mp.local-write")
    def test_receive_into_region_without_local_write_fails(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: a receive whose buffer is registered without LOCAL_WRITE completes with a
        local protection error, the sender with an error; no byte lands."""
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        caps = pair.caps
        ro = bytearray(256)
        mr = pair.b.pd.reg_mem(ro, AccessFlags(0))
        pair.b.qp.post_recv(RecvWr(wr_id=41, sg_list=[Sge(addr=mr.vaddr, length=64, lkey=mr.lkey)]))
        pair.a.put(0, b"must not land")
        pair.a.qp.post_send(SendWr(wr_id=42, sg_list=[pair.a.sge(0, 13)]))
        sent, got = wait_wc(pair.a.cq), wait_wc(pair.b.cq)
        assert got.wr_id == 41 and got.status is not WcStatus.SUCCESS, got.status.name
        assert sent.wr_id == 42 and sent.status is not WcStatus.SUCCESS, sent.status.name
        assert ro == bytes(256), "the receive wrote a region without LOCAL_WRITE"
        assert_local_error(caps, got.status, WcStatus.LOCAL_PROTECTION_ERR)

    @rules("iba:mp.local-write")
    def test_read_into_region_without_local_write_fails(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: an RDMA READ whose local buffer lacks LOCAL_WRITE completes with a local
        protection error; the buffer stays as it was."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_READ)
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        pair.b.put(0, b"secret bytes")
        ro = bytearray(64)
        mr = pair.a.pd.reg_mem(ro, AccessFlags(0))
        pair.a.qp.post_send(SendWr(wr_id=43, opcode=WrType.RDMA_READ,
                                   sg_list=[Sge(addr=mr.vaddr, length=12, lkey=mr.lkey)],
                                   remote_addr=pair.b.remote(0), rkey=pair.b.mr.rkey))  # fmt: skip
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == 43 and wc.status is not WcStatus.SUCCESS, wc.status.name
        assert ro == bytes(64), "the READ response landed in a region without LOCAL_WRITE"
        assert_local_error(pair.caps, wc.status, WcStatus.LOCAL_PROTECTION_ERR)

    @rules("iba:mp.dead-keys", "iba:mp.untouched")
    def test_deregistered_region_key_refused_remotely(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.2: an RDMA WRITE through the R_Key of a deregistered region →
        REM_ACCESS_ERR; its old memory is untouched."""
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        buf = bytearray(256)
        mr = pair.b.pd.reg_mem(buf, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        rkey, addr = mr.rkey, mr.vaddr
        mr.dereg()
        pair.write(b"stale key", rkey=rkey, remote_addr=addr, wr_id=90)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (90, WcStatus.REM_ACCESS_ERR), wc.status.name
        assert buf == bytes(256), "a deregistered region's R_Key still wrote its memory"

    @rules("iba:mp.zero-length", "iba:mp.untouched")
    def test_zero_length_rdma_needs_no_valid_key(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA C9-88: a zero-length RDMA WRITE or READ completes successfully with a valid
        R_Key and address, and with neither (the responder validates nothing); no byte moves."""
        pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
        ops = [WrType.RDMA_WRITE]
        if pair.caps.supports_opcode(QpType.RC, WrType.RDMA_READ):
            ops.append(WrType.RDMA_READ)
        wr_id = 60
        for op in ops:
            bogus = pair.b.mr.rkey ^ 0x5A5A5A00
            for rkey, addr in ((pair.b.mr.rkey, pair.b.remote(16)), (bogus, 0)):
                wr_id += 1
                pair.a.qp.post_send(SendWr(wr_id=wr_id, opcode=op, sg_list=[], remote_addr=addr,
                                           rkey=rkey))  # fmt: skip
                wc = wait_wc(pair.a.cq)
                assert (wc.wr_id, wc.status) == (wr_id, WcStatus.SUCCESS), (
                    f"zero-length {op.name} with R_Key {rkey:#x} at {addr:#x}: {wc.status.name}"
                )
        assert pair.b.get(0, 64) == bytes(64) and pair.a.get(0, 64) == bytes(64)
