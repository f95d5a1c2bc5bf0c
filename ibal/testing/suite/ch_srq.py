"""Chapter: shared receive queues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import (
    InsufficientResources,
    InvalidMaxSge,
    InvalidSetting,
    InvalidSrqHandle,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.helpers import (
    GRH_BYTES,
    UD_QKEY,
    CallbackLog,
    Side,
    connect,
    make_side,
    mr_access,
    wait_wc,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import (
    ConformanceBase,
    deviation,
    post_raises,
    require,
    require_qp_type,
)
from ibal.types import (
    AsyncEvent,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    UdDest,
    WcStatus,
    WcType,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Srq
    from ibal.ci import Capabilities


class SrqChecks(ConformanceBase):
    chapter = "SRQ"

    def _srq_side(
        self, ca: Ca, port: PortAttr, srq: Srq, qp_type: QpType, **qp_kw: Any
    ) -> Side:
        """A side whose QP takes its receives from ``srq`` (same PD, own CQ and buffer)."""
        from ibal.al import QpCreate

        pd = srq.pd
        cq = ca.create_cq(128)
        buf = bytearray(8192)
        mr = pd.reg_mem(buf, mr_access(ca.capabilities))
        qp = pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq, srq=srq), **qp_kw)
        return Side(ca, port, pd, cq, buf, mr, qp)

    def _srq_setup(
        self, ca: Ca, port: PortAttr, qp_type: QpType = QpType.RC, max_wr: int = 16, **srq_kw: Any
    ) -> tuple[Srq, Side, Side]:
        """SRQ, a sender A and a receiver B on the SRQ, connected."""
        caps = ca.capabilities
        require(caps, "srq")
        require_qp_type(caps, qp_type)
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=max_wr, max_sge=1), **srq_kw)
        b = self._srq_side(ca, port, srq, qp_type)
        a = make_side(ca, port, qp_type)
        connect(a, b, caps)
        return srq, a, b

    def _send(self, a: Side, b: Side, data: bytes, wr_id: int = 1) -> None:
        a.put(0, data)
        ud = None
        if a.qp.qp_type.is_datagram:
            assert a.av is not None
            ud = UdDest(av=a.av, remote_qp=b.qp.num, remote_qkey=UD_QKEY)
        a.qp.post_send(SendWr(wr_id=wr_id, sg_list=[a.sge(0, len(data))], ud=ud))

    @rules("ci:8")
    def test_srq_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8 / decisions: SRQ verbs are optional; without them → IB_UNSUPPORTED."""
        pd = ca.alloc_pd()
        if caps.srq:
            assert pd.create_srq(SrqAttr(max_wr=4)).query().max_wr >= 4
            return
        with pytest.raises(Unsupported):
            pd.create_srq(SrqAttr(max_wr=4))

    @rules("al:46")
    def test_create_srq_query_reports_attributes(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 46: query reports granted sizes ≥ asked and the limit."""
        require(caps, "srq")
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=20, max_sge=1, srq_limit=0))
        a = srq.query()
        assert a.max_wr >= 20 and a.max_sge >= 1 and a.srq_limit == 0

    @rules("al:44")
    def test_srq_feeds_qp_receives(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 44: a message to a QP on an SRQ consumes the SRQ's receive."""
        srq, a, b = self._srq_setup(ca, port)
        srq.post_recv(RecvWr(wr_id=70, sg_list=[b.sge(512, 64)]))
        self._send(a, b, b"via srq")
        got = wait_wc(b.cq)
        assert (got.wr_id, got.wc_type, got.status, got.qp_num) == (
            70,
            WcType.RECV,
            WcStatus.SUCCESS,
            b.qp.num,
        )
        assert b.get(512, 7) == b"via srq"

    @rules("al:44")
    def test_srq_shared_by_two_qps(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 44: two QPs draw from one SRQ, in the SRQ's order."""
        srq, a1, b1 = self._srq_setup(ca, port)
        b2 = self._srq_side(ca, port, srq, QpType.RC)
        a2 = make_side(ca, port, QpType.RC)
        connect(a2, b2, ca.capabilities)
        srq.post_recv([RecvWr(wr_id=80 + i, sg_list=[b1.sge(64 * i, 64)]) for i in range(2)])
        self._send(a1, b1, b"first")
        first = wait_wc(b1.cq)
        self._send(a2, b2, b"second")
        second = wait_wc(b2.cq)
        assert (first.wr_id, first.qp_num) == (80, b1.qp.num)
        assert (second.wr_id, second.qp_num) == (81, b2.qp.num)
        assert b1.get(0, 5) == b"first" and b1.get(64, 6) == b"second"

    @rules("al:44")
    def test_srq_serves_ud_qp(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 44: an SRQ can be attached to a UD QP."""
        srq, a, b = self._srq_setup(ca, port, QpType.UD)
        srq.post_recv(RecvWr(wr_id=90, sg_list=[b.sge(0, GRH_BYTES + 32)]))
        self._send(a, b, b"ud srq")
        got = wait_wc(b.cq)
        assert (got.wr_id, got.src_qp) == (90, a.qp.num)
        assert b.get(GRH_BYTES, 6) == b"ud srq"

    @rules("al:40")
    def test_qp_query_names_its_srq(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 40: query reports the SRQ handle used at creation."""
        srq, _, b = self._srq_setup(ca, port)
        assert b.qp.query().srq is srq

    @rules("al:46")
    def test_modify_srq_changes_only_the_limit(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 46: only the fields the mask selects change."""
        require(caps, "srq")
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=16))
        before = srq.query()
        srq.modify(SrqAttr(max_wr=1, max_sge=1, srq_limit=4), SrqAttrMask.LIMIT)
        after = srq.query()
        assert after.srq_limit == 4 and after.max_wr == before.max_wr

    @rules("al:46")
    def test_modify_srq_limit_above_depth_raises_invalid_setting(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """access-layer rule 46: an invalid value → IB_INVALID_SETTING; the SRQ is unchanged."""
        require(caps, "srq")
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=8))
        depth = srq.query().max_wr
        with pytest.raises(InvalidSetting):
            srq.modify(SrqAttr(srq_limit=depth + 100), SrqAttrMask.LIMIT)
        assert srq.query().srq_limit == 0

    @rules("doc:IBA 11.6.3", "doc:access-layer §4.4")
    def test_srq_limit_event(self, ca: Ca, port: PortAttr) -> None:
        """IBA 11.6.3 / access-layer §4.4: the SRQ limit event reaches the SRQ's callback with its
        context."""
        events = CallbackLog()
        srq, a, b = self._srq_setup(ca, port, context="srq-ctx", event_cb=events)
        srq.post_recv([RecvWr(wr_id=i, sg_list=[b.sge(64 * i, 64)]) for i in range(3)])
        srq.modify(SrqAttr(srq_limit=2), SrqAttrMask.LIMIT)
        self._send(a, b, b"one", 1)
        self._send(a, b, b"two", 2)
        wait_wcs(b.cq, 2)
        events.wait(1)
        rec = events.snapshot()[0][0]
        assert (rec.code, rec.context, rec.handle) == (AsyncEvent.SRQ_LIMIT_REACHED, "srq-ctx", srq)

    @rules("al:45")
    def test_destroy_srq_in_use_raises_resource_busy(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 45: destroying an SRQ with QPs bound → IB_RESOURCE_BUSY; it keeps
        working."""
        srq, a, b = self._srq_setup(ca, port)
        with pytest.raises(ResourceBusy):
            srq.destroy()
        srq.post_recv(RecvWr(wr_id=5, sg_list=[b.sge(0, 64)]))
        self._send(a, b, b"alive")
        assert wait_wc(b.cq).wr_id == 5

    @rules("al:45")
    def test_destroy_srq_callback_with_context(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 45: an unused SRQ is destroyed asynchronously; destroy_cb(srq_context)
        once."""
        require(caps, "srq")
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=4), context="s")
        log = CallbackLog()
        srq.destroy(log)
        log.wait(1)
        ca.alloc_pd().dealloc(wait=True)
        assert log.snapshot() == [("s",)]
        with pytest.raises(InvalidSrqHandle):
            srq.query()

    @rules("al:47")
    def test_post_srq_recv_beyond_depth(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 47: exceeding the SRQ depth → IB_INSUFFICIENT_RESOURCES at the first WR
        not posted."""
        require(caps, "srq")
        pd = ca.alloc_pd()
        srq = pd.create_srq(SrqAttr(max_wr=4))
        depth = srq.query().max_wr
        mr = pd.reg_mem(bytearray(64), mr_access(caps))
        with post_raises(InsufficientResources, depth):
            srq.post_recv([RecvWr(wr_id=i, sg_list=[mr.sge(0, 16)]) for i in range(depth + 1)])

    @rules("al:49")
    def test_post_srq_recv_too_many_sges(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 49: more SGEs than the SRQ's max_sge → IB_INVALID_MAX_SGE."""
        require(caps, "srq")
        pd = ca.alloc_pd()
        srq = pd.create_srq(SrqAttr(max_wr=4, max_sge=1))
        sges = srq.query().max_sge
        mr = pd.reg_mem(bytearray(1024), mr_access(caps))
        with post_raises(InvalidMaxSge, 0):
            srq.post_recv(RecvWr(wr_id=1, sg_list=[mr.sge(16 * i, 16) for i in range(sges + 1)]))

    @rules("doc:decisions")
    def test_post_to_destroyed_srq_raises_invalid_srq_handle(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """decisions (ib_post_srq_recv): a bad SRQ → IB_INVALID_SRQ_HANDLE."""
        require(caps, "srq")
        pd = ca.alloc_pd()
        srq = pd.create_srq(SrqAttr(max_wr=4))
        mr = pd.reg_mem(bytearray(64), mr_access(caps))
        srq.destroy(wait=True)
        with pytest.raises(InvalidSrqHandle):
            srq.post_recv(RecvWr(wr_id=1, sg_list=[mr.sge(0, 16)]))

    @rules("doc:IBA 11.6.3.2")
    def test_qp_on_srq_in_error_raises_last_wqe_reached(self, ca: Ca, port: PortAttr) -> None:
        """IBA 11.6.3.2 (Last WQE Reached): a QP on an SRQ that goes to ERROR reports its last WQE
        to the QP's event callback, with its context (a natural event: no injection)."""
        caps = ca.capabilities
        require(caps, "srq")
        require_qp_type(caps, QpType.RC)
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=16, max_sge=1))
        events = CallbackLog()
        b = self._srq_side(ca, port, srq, QpType.RC, context="on-srq", event_cb=events)
        a = make_side(ca, port, QpType.RC)
        connect(a, b, caps)
        srq.post_recv(RecvWr(wr_id=1, sg_list=[b.sge(0, 64)]))
        b.qp.modify(QpMod(QpState.ERROR))
        last_wqe = AsyncEvent.SRQ_QP_LAST_WQE_REACHED
        with deviation(caps, "last_wqe_reached"):
            events.wait_for(lambda es: any(e[0].code is last_wqe for e in es), "LAST_WQE_REACHED")
        rec = next(e[0] for e in events.snapshot() if e[0].code is last_wqe)
        assert (rec.context, rec.handle) == ("on-srq", b.qp)

    @rules("al:42")
    def test_qp_on_srq_destroyed_without_error_state(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 42: destroying a QP on an SRQ without draining it first is allowed."""
        srq, _, b = self._srq_setup(ca, port)
        srq.post_recv(RecvWr(wr_id=1, sg_list=[b.sge(0, 64)]))
        b.qp.destroy(wait=True)
        srq.destroy(wait=True)
