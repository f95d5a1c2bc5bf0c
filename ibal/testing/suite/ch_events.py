"""Chapter: asynchronous events (routing, contexts, threads, natural events)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ibal.testing.helpers import (
    CallbackLog,
    Pair,
    RcTiming,
    Side,
    Source,
    av_to,
    connect,
    make_side,
    mr_access,
    qp_access,
    to_init,
    to_rtr,
    to_rts,
    wait_wc,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import (
    ConformanceBase,
    Fabric,
    deviation,
    require,
    require_qp_type,
    traced,
)
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    EventRecord,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    SendWr,
    SrqAttr,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Ca, Qp
    from ibal.testing.backdoor import TracingCi

FAST = RcTiming(retry_cnt=0, rnr_retry_cnt=0, local_ack_timeout=8, rnr_nak_timeout=1)
"""Give up at the first NAK: the requester's error completes at once."""


class EventChecks(ConformanceBase):
    chapter = "async events"

    def _tracer(self, fabric: Fabric, ca: Ca) -> TracingCi:
        tr = fabric.traced(ca.guid)
        require(tr.capabilities, "async_event_injection")
        return tr

    def _event_qp(self, ca: Ca, **kw: Any) -> Qp:
        from ibal.al import QpCreate

        caps = ca.capabilities
        qp_type = QpType.UD if QpType.UD in caps.qp_types else QpType.RC
        pd = ca.alloc_pd()
        cq = ca.create_cq(16)
        return pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq), **kw)

    def _watched_responder(
        self, ca: Ca, port: PortAttr, *, connect_b: bool = True
    ) -> tuple[Pair, CallbackLog]:
        """An RC loopback pair whose responder B reports its events (context "responder")."""
        from ibal.al import QpCreate

        caps = ca.capabilities
        require_qp_type(caps, QpType.RC)
        log = CallbackLog()
        a = make_side(ca, port, QpType.RC)
        pd = ca.alloc_pd()
        cq = ca.create_cq(64)
        buf = bytearray(4096)
        mr = pd.reg_mem(buf, mr_access(caps))
        qp = pd.create_qp(
            QpCreate(QpType.RC, send_cq=cq, recv_cq=cq), context="responder", event_cb=log
        )
        b = Side(ca, port, pd, cq, buf, mr, qp)
        connect(a, b, caps, timing=FAST, connect_b=connect_b)
        return Pair(QpType.RC, a, b, caps), log

    @staticmethod
    def _event(log: CallbackLog, *codes: AsyncEvent) -> Any:
        """The first recorded event whose code is one of ``codes`` (waits for it)."""
        log.wait_for(
            lambda es: any(e[0].code in codes for e in es),
            " or ".join(c.name for c in codes),
        )
        return next(e[0] for e in log.snapshot() if e[0].code in codes)

    @rules("doc:IBA 11.6.3.1", "doc:ci-contract §3.1")
    def test_bad_rkey_raises_wq_access_error_at_responder(self, ca: Ca, port: PortAttr) -> None:
        """IBA 11.6.3.1 (Local Access Violation WQ Error) / ci-contract §3.1: an RDMA WRITE with
        an unknown R_Key raises WQ_ACCESS_ERROR on the responder QP, with its context and handle
        (a natural event: no injection)."""
        pair, log = self._watched_responder(ca, port)
        pair.write(b"forbidden", rkey=pair.b.mr.rkey ^ 0x5A5A5A00, wr_id=4)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
        with deviation(ca.capabilities, "responder_events"):
            rec = self._event(log, AsyncEvent.WQ_ACCESS_ERROR)
        assert (rec.context, rec.handle) == ("responder", pair.b.qp)

    @rules("doc:IBA 11.6.3.1")
    def test_refused_request_raises_wq_error_at_responder(self, ca: Ca, port: PortAttr) -> None:
        """IBA 11.6.3.1 (Invalid Request / Local Access Violation WQ Error): an RDMA WRITE to a
        QP whose access flags refuse remote writes is refused (remote memory untouched) and raises
        WQ_REQ_ERROR or WQ_ACCESS_ERROR on the responder."""
        pair, log = self._watched_responder(ca, port)
        pair.b.qp.modify(QpMod(QpState.RTS, access=AccessFlags.LOCAL_WRITE))
        pair.write(b"no writes", wr_id=5)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) in (
            (5, WcStatus.REM_INVALID_REQ_ERR),
            (5, WcStatus.REM_ACCESS_ERR),
        )
        assert pair.b.get(0, 9) == bytes(9)
        with deviation(ca.capabilities, "responder_events"):
            rec = self._event(log, AsyncEvent.WQ_REQ_ERROR, AsyncEvent.WQ_ACCESS_ERROR)
        assert (rec.context, rec.handle) == ("responder", pair.b.qp)

    @rules("iba:qps.rtr")
    def test_first_receive_in_rtr_raises_comm_est(self, ca: Ca, port: PortAttr) -> None:
        """IBA 11.6.2 (Communication Established): the first message a QP in RTR receives raises
        QP_COMM on it, with its context (a natural event: no injection)."""
        pair, log = self._watched_responder(ca, port, connect_b=False)
        b = pair.b
        to_rtr(b.qp, av_to(port, port.port_num), port.active_mtu, pair.a.qp.num, timing=FAST)
        b.recv(1, 0, 64)
        pair.a.put(0, b"hello")
        pair.a.qp.post_send(SendWr(wr_id=2, sg_list=[pair.a.sge(0, 5)]))
        assert wait_wc(b.cq).wr_id == 1
        assert b.get(0, 5) == b"hello"
        with deviation(ca.capabilities, "comm_est"):
            rec = self._event(log, AsyncEvent.QP_COMM)
        assert (rec.context, rec.handle) == ("responder", b.qp)

    def _barrier(self, tr: TracingCi, ca_log: CallbackLog, port: PortAttr) -> None:
        """Raise a port event and wait for it: everything queued before it has been delivered."""
        seen = len(ca_log)
        tr.inject_async_event(
            EventRecord(AsyncEvent.PORT_ACTIVE, tr.ca_context, port_num=port.port_num)
        )
        ca_log.wait(seen + 1, what="the barrier port event")

    @rules("al:38")
    @traced
    def test_qp_event_reaches_qp_callback(
        self, fabric: Fabric, al: AccessLayer, port: PortAttr
    ) -> None:
        """access-layer rule 38: a QP event carries qp_context and the QP handle; CA callbacks don't
        see it."""
        ca_log = CallbackLog()
        ca = al.open_ca(al.get_ca_guids()[0], event_cb=ca_log, context="ca")
        tr = self._tracer(fabric, ca)
        qp_log = CallbackLog()
        qp = self._event_qp(ca, context="qp-ctx", event_cb=qp_log)
        tr.inject_async_event(
            EventRecord(AsyncEvent.QP_FATAL, tr.qp_contexts[qp.num], vendor_specific=7)
        )
        qp_log.wait(1)
        rec = qp_log.snapshot()[0][0]
        assert (rec.code, rec.context, rec.handle, rec.vendor_specific) == (
            AsyncEvent.QP_FATAL,
            "qp-ctx",
            qp,
            7,
        )
        self._barrier(tr, ca_log, port)
        assert all(e[0].code is not AsyncEvent.QP_FATAL for e in ca_log.snapshot())

    @rules("doc:ci-contract §3.1")
    @traced
    def test_cq_event_reaches_cq_callback(self, fabric: Fabric, ca: Ca) -> None:
        """ci-contract §3.1: a CQ event reaches the CQ's event callback with cq_context and
        handle."""
        tr = self._tracer(fabric, ca)
        log = CallbackLog()
        cq = ca.create_cq(8, event_cb=log, context="cq-ctx")
        tr.inject_async_event(EventRecord(AsyncEvent.CQ_ERROR, tr.cq_contexts[-1]))
        log.wait(1)
        rec = log.snapshot()[0][0]
        assert (rec.code, rec.context, rec.handle) == (AsyncEvent.CQ_ERROR, "cq-ctx", cq)

    @rules("doc:ci-contract §3.1")
    @traced
    def test_srq_event_reaches_srq_callback(self, fabric: Fabric, ca: Ca) -> None:
        """ci-contract §3.1: an SRQ event reaches the SRQ's event callback with srq_context."""
        tr = self._tracer(fabric, ca)
        require(ca.capabilities, "srq")
        log = CallbackLog()
        srq = ca.alloc_pd().create_srq(SrqAttr(max_wr=4), context="srq-ctx", event_cb=log)
        tr.inject_async_event(EventRecord(AsyncEvent.SRQ_CATAS_ERROR, tr.srq_contexts[-1]))
        log.wait(1)
        rec = log.snapshot()[0][0]
        assert (rec.code, rec.context, rec.handle) == (AsyncEvent.SRQ_CATAS_ERROR, "srq-ctx", srq)

    @rules("al:8")
    @traced
    def test_port_event_reaches_every_ca_handle(
        self, fabric: Fabric, al: AccessLayer, port: PortAttr
    ) -> None:
        """access-layer rule 8: each open CA handle gets port events with its own ca_context."""
        guid = al.get_ca_guids()[0]
        other = fabric.manager.open_al()
        try:
            l1, l2 = CallbackLog(), CallbackLog()
            c1 = al.open_ca(guid, event_cb=l1, context="first")
            c2 = other.open_ca(guid, event_cb=l2, context="second")
            tr = self._tracer(fabric, c1)
            tr.inject_async_event(
                EventRecord(AsyncEvent.PORT_DOWN, tr.ca_context, port_num=port.port_num)
            )
            l1.wait(1)
            l2.wait(1)
            r1, r2 = l1.snapshot()[0][0], l2.snapshot()[0][0]
            assert (r1.code, r1.context, r1.handle, r1.port_num) == (
                AsyncEvent.PORT_DOWN,
                "first",
                c1,
                port.port_num,
            )
            assert (r2.code, r2.context, r2.handle) == (AsyncEvent.PORT_DOWN, "second", c2)
        finally:
            other.close()

    @rules("doc:api.md", "doc:ci-contract §3.2")
    @traced
    def test_event_callback_runs_off_callers_thread(self, fabric: Fabric, ca: Ca) -> None:
        """api.md / ci-contract §3.2: event callbacks run on the dispatcher, not the injecting
        stack."""
        tr = self._tracer(fabric, ca)
        log = CallbackLog()
        qp = self._event_qp(ca, event_cb=log)
        tr.inject_async_event(EventRecord(AsyncEvent.WQ_ACCESS_ERROR, tr.qp_contexts[qp.num]))
        log.wait(1)
        assert log.threads[0] != threading.get_ident()

    @rules("ci:63", "al:41")
    @traced
    def test_no_qp_event_after_destroy(
        self, fabric: Fabric, al: AccessLayer, port: PortAttr
    ) -> None:
        """ci-contract rule 63 / access-layer rule 41: after destroy, no event reaches the QP's
        callback."""
        ca_log = CallbackLog()
        ca = al.open_ca(al.get_ca_guids()[0], event_cb=ca_log)
        tr = self._tracer(fabric, ca)
        log = CallbackLog()
        qp = self._event_qp(ca, event_cb=log)
        stale = tr.qp_contexts[qp.num]
        qp.destroy(wait=True)
        tr.inject_async_event(EventRecord(AsyncEvent.QP_FATAL, stale))
        self._barrier(tr, ca_log, port)
        assert len(log) == 0

    @rules("al:8")
    @traced
    def test_event_without_callback_is_dropped(
        self, fabric: Fabric, al: AccessLayer, port: PortAttr
    ) -> None:
        """access-layer rule 8: event callbacks are optional; an event for an object without one is
        dropped."""
        ca_log = CallbackLog()
        ca = al.open_ca(al.get_ca_guids()[0], event_cb=ca_log)
        tr = self._tracer(fabric, ca)
        qp = self._event_qp(ca)
        tr.inject_async_event(EventRecord(AsyncEvent.QP_FATAL, tr.qp_contexts[qp.num]))
        self._barrier(tr, ca_log, port)
        assert qp.query().qp_num == qp.num  # the AL kept going

    @rules("doc:ci-contract §3.1")
    def test_sq_drained_event(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §3.1 (IB_AE_SQ_DRAINED): RTS→SQD with sqd_event reports the drained SQ to the
        QP."""
        require(ca.capabilities, "sqd")
        require_qp_type(ca.capabilities, QpType.RC)
        from ibal.al import QpCreate

        log = CallbackLog()
        cq = ca.create_cq(16)
        qp = ca.alloc_pd().create_qp(
            QpCreate(QpType.RC, send_cq=cq, recv_cq=cq), context="sqd", event_cb=log
        )
        to_init(qp, port.port_num, qp_access(ca.capabilities))
        to_rtr(qp, av_to(port, port.port_num), port.active_mtu, qp.num)
        to_rts(qp)
        qp.modify(QpMod(QpState.SQD, sqd_event=True))
        log.wait(1)
        rec = log.snapshot()[0][0]
        assert (rec.code, rec.context, rec.handle) == (AsyncEvent.SQ_DRAINED, "sqd", qp)

    @rules("doc:ci-contract §3.1")
    def test_cq_overrun_raises_cq_error(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §3.1 (IB_AE_CQ_ERROR): more completions than the CQ holds → a CQ error
        event."""
        log = CallbackLog()
        cq = ca.create_cq(4, event_cb=log, context="small")
        size = cq.size
        recv_cq = ca.create_cq(min(ca.query().max_cqes, size + 64))
        src = Source(ca, port, send_cq=cq, recv_cq=recv_cq)
        left = size + 1
        while left:
            n = min(left, 32)
            src.fire(n)
            wait_wcs(recv_cq, n)
            left -= n
        log.wait(1)
        rec = log.snapshot()[0][0]
        assert rec.code in (AsyncEvent.CQ_ERROR, AsyncEvent.CQ_OVERFLOW)
        assert (rec.context, rec.handle) == ("small", cq)
