"""Chapter: creating QPs and driving the QP state machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import (
    InvalidApmState,
    InvalidCqHandle,
    InvalidGuid,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidQpState,
    InvalidServiceType,
    InvalidSetting,
    InvalidSrqHandle,
    Unsupported,
)
from ibal.testing.helpers import (
    UD_QKEY,
    CallbackLog,
    RcTiming,
    av_to,
    make_side,
    qp_access,
    to_init,
    to_rtr,
    to_rts,
    wait_wc,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require, require_qp_type
from ibal.types import (
    AccessFlags,
    ApmState,
    DgrmInfo,
    Mtu,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    SendWr,
    SrqAttr,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Qp
    from ibal.ci import Capabilities

TRANSPORTS = [QpType.RC, QpType.UC, QpType.UD]


def any_qp_type(caps: Capabilities) -> QpType:
    for t in TRANSPORTS:
        if t in caps.qp_types:
            return t
    pytest.fail(f"provider declares none of RC, UC, UD: {sorted(caps.qp_types)}")


class QpChecks(ConformanceBase):
    chapter = "QP create & state machine"

    def _qp(self, ca: Ca, qp_type: QpType, **create: Any) -> Qp:
        from ibal.al import QpCreate

        require_qp_type(ca.capabilities, qp_type)
        pd = ca.alloc_pd()
        cq = ca.create_cq(64)
        return pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq, **create))

    def _rc_at(self, ca: Ca, port: PortAttr, state: QpState) -> Qp:
        """An RC QP brought to ``state`` (RESET, INIT, RTR or RTS) towards itself."""
        qp = self._qp(ca, QpType.RC)
        if state is QpState.RESET:
            return qp
        to_init(qp, port.port_num, qp_access(ca.capabilities))
        if state is QpState.INIT:
            return qp
        to_rtr(qp, av_to(port, port.port_num), port.active_mtu, qp.num)
        if state is QpState.RTR:
            return qp
        to_rts(qp)
        return qp

    # ------------------------------------------------------------ create
    @rules("ci:50", "al:37", "iba:qps.reset")
    @pytest.mark.parametrize("qp_type", TRANSPORTS, ids=lambda t: t.name)
    def test_create_qp_starts_in_reset(self, ca: Ca, qp_type: QpType) -> None:
        """ci-contract rule 50 / access-layer rule 37: a new QP has a number, its type, state
        RESET."""
        qp = self._qp(ca, qp_type)
        attr = qp.query()
        assert attr.state is QpState.RESET and qp.state is QpState.RESET
        assert attr.qp_type is qp_type and qp.qp_type is qp_type
        assert attr.qp_num == qp.num and 1 < qp.num < 1 << 24

    @rules("ci:50")
    def test_create_qp_grants_requested_sizes(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 50: the granted depths and SGE counts are at least those asked for."""
        attr = ca.query()
        sge = min(2, attr.max_sges)
        qp = self._qp(ca, any_qp_type(caps), sq_depth=10, rq_depth=12, sq_sge=sge, rq_sge=sge)
        got = qp.query().caps
        assert got.sq_depth >= 10 and got.rq_depth >= 12
        assert got.sq_sge >= sge and got.rq_sge >= sge

    @rules("ci:50")
    def test_qp_numbers_are_unique(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 50: every QP gets its own number, never 0 or 1 (the special QPs)."""
        qp_type = any_qp_type(caps)
        nums = [self._qp(ca, qp_type).num for _ in range(6)]
        assert len(set(nums)) == 6
        assert not {0, 1} & set(nums)

    @rules("al:40")
    def test_query_qp_reports_creation_handles(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 40: query reports type, depths and the PD and CQ handles used at
        creation."""
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        scq, rcq = ca.create_cq(16), ca.create_cq(16)
        qp_type = any_qp_type(caps)
        token = object()
        qp = pd.create_qp(
            QpCreate(qp_type, send_cq=scq, recv_cq=rcq, sq_signaled=False), context=token
        )
        attr = qp.query()
        assert attr.pd is pd and qp.pd is pd
        assert attr.send_cq is scq and attr.recv_cq is rcq and attr.srq is None
        assert attr.sq_signaled is False
        assert qp.context is token

    @rules("ci:45", "al:36")
    def test_create_qp_with_destroyed_cq_raises_invalid_cq_handle(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 45 / access-layer rule 36: a destroyed send or receive CQ →
        IB_INVALID_CQ_HANDLE."""
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        good, dead = ca.create_cq(8), ca.create_cq(8)
        dead.destroy(wait=True)
        qp_type = any_qp_type(caps)
        with pytest.raises(InvalidCqHandle):
            pd.create_qp(QpCreate(qp_type, send_cq=dead, recv_cq=good))
        with pytest.raises(InvalidCqHandle):
            pd.create_qp(QpCreate(qp_type, send_cq=good, recv_cq=dead))
        pd.dealloc(wait=True)
        good.destroy(wait=True)  # the failed creates left nothing pinning it

    @rules("ci:46", "al:36")
    def test_create_qp_too_deep_raises_invalid_max_wrs(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 46 / access-layer rule 36: depth above the CA limit →
        IB_INVALID_MAX_WRS."""
        max_wrs = ca.query().max_wrs
        with pytest.raises(InvalidMaxWrs):
            self._qp(ca, any_qp_type(caps), sq_depth=max_wrs + 1)
        with pytest.raises(InvalidMaxWrs):
            self._qp(ca, any_qp_type(caps), rq_depth=max_wrs + 1)

    @rules("ci:47", "al:36")
    def test_create_qp_too_many_sges_raises_invalid_max_sge(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 47 / access-layer rule 36: SGEs above the CA limit →
        IB_INVALID_MAX_SGE."""
        max_sges = ca.query().max_sges
        with pytest.raises(InvalidMaxSge):
            self._qp(ca, any_qp_type(caps), sq_sge=max_sges + 1)
        with pytest.raises(InvalidMaxSge):
            self._qp(ca, any_qp_type(caps), rq_sge=max_sges + 1)

    @rules("ci:48")
    def test_create_qp_unsupported_transport_refused(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 48: an unsupported transport (RD) → IB_INVALID_SERVICE_TYPE or
        IB_UNSUPPORTED."""
        if QpType.RD in caps.qp_types:
            self._qp(ca, QpType.RD)
            return
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        with pytest.raises((InvalidServiceType, Unsupported)):
            pd.create_qp(QpCreate(QpType.RD, send_cq=cq, recv_cq=cq))

    @pytest.mark.parametrize(
        "qp_type", [QpType.QP0, QpType.QP1, QpType.RAW_ETHER], ids=lambda t: t.name
    )
    @rules("al:35")
    def test_create_qp_special_type_raises_invalid_setting(self, ca: Ca, qp_type: QpType) -> None:
        """access-layer rule 35 / decisions: special QP types come from get_spl_qp; create_qp →
        IB_INVALID_SETTING."""
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        with pytest.raises(InvalidSetting):
            pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq))

    @rules("al:36")
    def test_create_qp_with_destroyed_srq_raises_invalid_srq_handle(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """access-layer rule 36: an invalid SRQ at create_qp → IB_INVALID_SRQ_HANDLE."""
        require(caps, "srq")
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        srq = pd.create_srq(SrqAttr(max_wr=8))
        srq.destroy(wait=True)
        with pytest.raises(InvalidSrqHandle):
            pd.create_qp(QpCreate(any_qp_type(caps), send_cq=cq, recv_cq=cq, srq=srq))

    # ------------------------------------------------------------ transitions
    @rules("ci:59", "al:39", "iba:qps.transitions")
    def test_rc_walks_reset_init_rtr_rts(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 59 / access-layer rule 39: each successful modify leaves the QP in the
        asked state."""
        qp = self._qp(ca, QpType.RC)
        seen = []
        to_init(qp, port.port_num, qp_access(ca.capabilities))
        seen.append(qp.query().state)
        to_rtr(qp, av_to(port, port.port_num), port.active_mtu, qp.num)
        seen.append(qp.query().state)
        to_rts(qp)
        seen.append(qp.query().state)
        assert seen == [QpState.INIT, QpState.RTR, QpState.RTS]
        assert qp.state is QpState.RTS

    @pytest.mark.parametrize(
        ("start", "target"),
        [
            (QpState.RESET, QpState.RTS),
            (QpState.RESET, QpState.RTR),
            (QpState.INIT, QpState.RTS),
            (QpState.RTS, QpState.RTR),
            (QpState.RTR, QpState.INIT),
        ],
        ids=lambda s: s.name,
    )
    @rules("ci:55", "iba:qps.transitions")
    def test_illegal_transition_raises_invalid_qp_state(
        self, ca: Ca, port: PortAttr, start: QpState, target: QpState
    ) -> None:
        """ci-contract rule 55: a transition not in IBA table 79 → IB_INVALID_QP_STATE; state
        unchanged."""
        qp = self._rc_at(ca, port, start)
        with pytest.raises(InvalidQpState):
            qp.modify(QpMod(target))
        assert qp.query().state is start

    @rules("doc:decisions", "doc:qp-state-machine")
    def test_missing_required_attribute_raises_invalid_parameter(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """decisions / ibal.qp_fsm: RESET→INIT without port_num → IB_INVALID_PARAMETER; still
        RESET."""
        qp = self._qp(ca, QpType.RC)
        with pytest.raises(InvalidParameter):
            qp.modify(QpMod(QpState.INIT, pkey_index=0, access=AccessFlags.LOCAL_WRITE))
        assert qp.query().state is QpState.RESET

    @rules("doc:decisions", "doc:qp-state-machine")
    def test_unexpected_attribute_raises_invalid_setting(self, ca: Ca, port: PortAttr) -> None:
        """decisions / ibal.qp_fsm: an attribute the transition does not take →
        IB_INVALID_SETTING."""
        qp = self._qp(ca, QpType.RC)
        with pytest.raises(InvalidSetting):
            qp.modify(
                QpMod(
                    QpState.INIT,
                    pkey_index=0,
                    port_num=port.port_num,
                    access=AccessFlags.LOCAL_WRITE,
                    sq_psn=5,
                )
            )
        assert qp.query().state is QpState.RESET

    @rules("doc:decisions", "doc:qp-state-machine")
    def test_wrong_current_state_raises_invalid_qp_state(self, ca: Ca, port: PortAttr) -> None:
        """decisions / ibal.qp_fsm: a current_state that is not the real state →
        IB_INVALID_QP_STATE."""
        qp = self._rc_at(ca, port, QpState.RTS)
        with pytest.raises(InvalidQpState):
            qp.modify(QpMod(QpState.RTS, current_state=QpState.SQD))
        qp.modify(QpMod(QpState.RTS, current_state=QpState.RTS))
        assert qp.query().state is QpState.RTS

    @rules("ci:56", "al:39")
    def test_bad_pkey_index_raises_invalid_pkey(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 56 / access-layer rule 39: a P_Key index out of range →
        IB_INVALID_PKEY."""
        qp = self._qp(ca, QpType.RC)
        with pytest.raises(InvalidPkey):
            qp.modify(
                QpMod(
                    QpState.INIT,
                    pkey_index=len(port.pkeys) + 64,
                    port_num=port.port_num,
                    access=AccessFlags.LOCAL_WRITE,
                )
            )
        assert qp.query().state is QpState.RESET

    @rules("ci:59")
    def test_bad_port_refused(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 59 / IBA 11.2.5: RESET→INIT on a port the CA lacks is refused; still
        RESET."""
        qp = self._qp(ca, QpType.RC)
        with pytest.raises((InvalidPort, InvalidParameter)):
            qp.modify(
                QpMod(
                    QpState.INIT,
                    pkey_index=0,
                    port_num=ca.query().num_ports + 1,
                    access=AccessFlags.LOCAL_WRITE,
                )
            )
        assert qp.query().state is QpState.RESET

    @pytest.mark.parametrize(
        "start", [QpState.INIT, QpState.RTR, QpState.RTS], ids=lambda s: s.name
    )
    @rules("iba:qps.transitions")
    def test_any_state_to_error_then_reset(self, ca: Ca, port: PortAttr, start: QpState) -> None:
        """ibal.qp_fsm: every state may go to ERROR and to RESET, and RESET→INIT works again."""
        qp = self._rc_at(ca, port, start)
        qp.modify(QpMod(QpState.ERROR))
        assert qp.query().state is QpState.ERROR
        qp.modify(QpMod(QpState.RESET))
        assert qp.query().state is QpState.RESET
        to_init(qp, port.port_num, AccessFlags.LOCAL_WRITE)
        assert qp.query().state is QpState.INIT

    @rules("iba:qps.reset")
    def test_reset_discards_posted_receives(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.3.1 (Reset): a QP moved to RESET forgets its posted receives without completing
        them; after reconnecting, a message consumes only a receive posted since."""
        require_qp_type(ca.capabilities, QpType.RC)
        pair = self.loop(ca, port, QpType.RC)
        b, a = pair.b, pair.a
        b.recv(1, 0, 64)
        b.qp.modify(QpMod(QpState.RESET))
        to_init(b.qp, port.port_num, qp_access(ca.capabilities))
        to_rtr(b.qp, av_to(port, port.port_num), port.active_mtu, a.qp.num)
        to_rts(b.qp)
        b.recv(2, 64, 64)
        a.put(0, b"fresh")
        a.qp.post_send(SendWr(wr_id=3, sg_list=[a.sge(0, 5)]))
        got = wait_wc(b.cq)
        assert (got.wr_id, got.status) == (2, WcStatus.SUCCESS)
        assert (wait_wc(a.cq).wr_id, b.cq.poll(4)) == (3, [])
        assert b.get(64, 5) == b"fresh" and b.get(0, 5) == bytes(5)

    @rules("ci:59")
    def test_init_to_init_changes_access(self, ca: Ca, port: PortAttr) -> None:
        """ibal.qp_fsm / ci-contract rule 59: INIT→INIT updates the access rights query reports."""
        qp = self._rc_at(ca, port, QpState.INIT)
        qp.modify(QpMod(QpState.INIT, access=AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ))
        got = qp.query()
        assert got.state is QpState.INIT
        assert got.access & AccessFlags.RDMA_READ and not got.access & AccessFlags.RDMA_WRITE

    @rules("ci:59")
    def test_connected_attributes_reported(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 59: query reports the path, remote QP, PSNs and retry counts that were
        set."""
        qp = self._qp(ca, QpType.RC)
        to_init(qp, port.port_num, AccessFlags.LOCAL_WRITE)
        qp.modify(
            QpMod(
                QpState.RTR,
                primary_av=av_to(port, port.port_num),
                path_mtu=Mtu.MTU_512,
                dest_qp=0x1234,
                rq_psn=0x777,
                resp_res=1,
                rnr_nak_timeout=3,
            )
        )
        qp.modify(
            QpMod(
                QpState.RTS,
                sq_psn=0x555,
                local_ack_timeout=9,
                retry_cnt=5,
                rnr_retry_cnt=6,
                init_depth=1,
            )
        )
        a = qp.query()
        assert (a.dest_qp, a.rq_psn, a.sq_psn) == (0x1234, 0x777, 0x555)
        assert (a.path_mtu, a.port_num, a.retry_cnt, a.rnr_retry_cnt) == (
            Mtu.MTU_512,
            port.port_num,
            5,
            6,
        )
        assert a.local_ack_timeout == 9 and a.rnr_nak_timeout == 3
        assert a.primary_av is not None and a.primary_av.dlid == port.lid

    @rules("ci:59")
    def test_ud_qkey_and_port_reported(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 59: a UD QP reports the Q_Key, port and P_Key index it was given."""
        qp = self._qp(ca, QpType.UD)
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=port.port_num, qkey=0x4242))
        a = qp.query()
        assert (a.qkey, a.port_num, a.pkey_index, a.state) == (
            0x4242,
            port.port_num,
            0,
            QpState.INIT,
        )

    @rules("ci:58")
    def test_atomic_access_matches_capability(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 58: enabling atomics is refused with IB_UNSUPPORTED unless the CA has
        them."""
        qp = self._qp(ca, QpType.RC)
        mod = QpMod(
            QpState.INIT,
            pkey_index=0,
            port_num=port.port_num,
            access=AccessFlags.LOCAL_WRITE | AccessFlags.ATOMIC,
        )
        if not caps.atomics:
            with pytest.raises(Unsupported):
                qp.modify(mod)
            assert qp.query().state is QpState.RESET
            return
        qp.modify(mod)
        assert qp.query().access & AccessFlags.ATOMIC

    @rules("iba:qps.sqd")
    def test_rts_to_sqd_and_back(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ibal.qp_fsm: RTS→SQD→RTS when the CA supports SQD."""
        require(caps, "sqd")
        qp = self._rc_at(ca, port, QpState.RTS)
        qp.modify(QpMod(QpState.SQD))
        assert qp.query().state is QpState.SQD
        qp.modify(QpMod(QpState.RTS))
        assert qp.query().state is QpState.RTS

    @rules("ci:57", "al:39")
    def test_invalid_apm_state_raises_invalid_apm_state(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 57 / access-layer rule 39: arming APM with no alternate path →
        IB_INVALID_APM_STATE (IB_UNSUPPORTED on a CA without APM); an APM state that is no
        ApmState is refused on any CA; the QP stays in RTS."""
        qp = self._rc_at(ca, port, QpState.RTS)
        refused = (InvalidApmState,) if caps.apm else (InvalidApmState, Unsupported)
        with pytest.raises(refused):
            qp.modify(QpMod(QpState.RTS, apm_state=ApmState.ARMED))
        with pytest.raises(InvalidApmState):
            qp.modify(QpMod(QpState.RTS, apm_state=99))  # type: ignore[arg-type]
        assert qp.query().state is QpState.RTS

    @rules("doc:api.md")
    def test_qp_state_tracks_last_modify(self, ca: Ca, port: PortAttr) -> None:
        """api.md: qp.state is the state of the last successful modify (no provider call)."""
        qp = self._rc_at(ca, port, QpState.RTR)
        seen = [qp.state]
        with pytest.raises(InvalidQpState):
            qp.modify(QpMod(QpState.SQD))
        seen.append(qp.state)
        qp.modify(QpMod(QpState.ERROR))
        seen.append(qp.state)
        assert seen == [QpState.RTR, QpState.RTR, QpState.ERROR]

    # ------------------------------------------------------------ datagram service
    @rules("al:66")
    def test_init_dgrm_svc_brings_ud_to_rts(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 66: ib_init_dgrm_svc binds a UD QP to the port and moves it to RTS."""
        qp = self._qp(ca, QpType.UD)
        qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        a = qp.query()
        assert (a.state, a.qkey, a.port_num) == (QpState.RTS, UD_QKEY, port.port_num)

    @rules("al:66")
    @pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC], ids=lambda t: t.name)
    def test_init_dgrm_svc_on_connected_qp_raises_invalid_parameter(
        self, ca: Ca, port: PortAttr, qp_type: QpType
    ) -> None:
        """access-layer rule 66: a connected (RC, UC) QP → IB_INVALID_PARAMETER."""
        qp = self._qp(ca, qp_type)
        with pytest.raises(InvalidParameter):
            qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        assert qp.query().state is QpState.RESET

    @rules("al:66")
    def test_init_dgrm_svc_without_info_raises_invalid_parameter(self, ca: Ca) -> None:
        """access-layer rule 66: no DgrmInfo for a UD QP → IB_INVALID_PARAMETER."""
        qp = self._qp(ca, QpType.UD)
        with pytest.raises(InvalidParameter):
            qp.init_dgrm_svc(None)

    @rules("al:66")
    def test_init_dgrm_svc_twice_raises_invalid_qp_state(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 66: a QP not in a state that allows it → IB_INVALID_QP_STATE."""
        qp = self._qp(ca, QpType.UD)
        qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        with pytest.raises(InvalidQpState):
            qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        assert qp.query().state is QpState.RTS

    @rules("al:66")
    def test_init_dgrm_svc_unknown_port_guid(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 66: a port GUID that is not on the QP's CA is refused; still RESET."""
        qp = self._qp(ca, QpType.UD)
        with pytest.raises((InvalidParameter, InvalidGuid, InvalidPort)):
            qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid ^ 0xFFFF_0000_0000, qkey=UD_QKEY))
        assert qp.query().state is QpState.RESET

    # ------------------------------------------------------------ destroy
    @rules("al:41")
    def test_destroy_qp_callback_once_with_context(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 41: ib_destroy_qp returns at once; destroy_cb(qp_context) runs exactly
        once."""
        from ibal.al import QpCreate

        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        qp = pd.create_qp(QpCreate(any_qp_type(caps), send_cq=cq, recv_cq=cq), context="qp-ctx")
        log = CallbackLog()
        qp.destroy(log)
        log.wait(1)
        cq.destroy(wait=True)  # barrier; also proves the QP no longer pins the CQ
        assert log.snapshot() == [("qp-ctx",)]

    @rules("al:41")
    def test_destroyed_qp_raises_invalid_qp_handle(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 41: every verb on a destroyed QP → IB_INVALID_QP_HANDLE."""
        side = make_side(ca, port, any_qp_type(caps))
        side.qp.destroy()
        with pytest.raises(InvalidQpHandle):
            side.qp.query()
        with pytest.raises(InvalidQpHandle):
            side.qp.modify(QpMod(QpState.ERROR))
        with pytest.raises(InvalidQpHandle):
            side.recv(1)
        with pytest.raises(InvalidQpHandle):
            side.qp.destroy()

    @rules("doc:qp-state-machine", "doc:IBA 11.2.5")
    def test_rc_retry_attributes_accepted_at_limits(self, ca: Ca, port: PortAttr) -> None:
        """ibal.qp_fsm / IBA 11.2.5: 3-bit retry counts accept 0 and 7 (7 = infinite RNR retry)."""
        for retry, rnr in ((0, 0), (7, 7)):
            qp = self._qp(ca, QpType.RC)
            to_init(qp, port.port_num, AccessFlags.LOCAL_WRITE)
            to_rtr(qp, av_to(port, port.port_num), port.active_mtu, qp.num)
            to_rts(qp, timing=RcTiming(retry_cnt=retry, rnr_retry_cnt=rnr))
            got = qp.query()
            assert (got.retry_cnt, got.rnr_retry_cnt) == (retry, rnr)
