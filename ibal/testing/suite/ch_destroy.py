"""Chapter: destroy ordering, cascades and the destroy-callback contract."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import (
    InvalidCqSize,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidPdHandle,
    InvalidPermission,
    InvalidQpHandle,
    InvalidState,
)
from ibal.testing.helpers import (
    DEFAULT_TIMEOUT,
    UD_QKEY,
    CallbackLog,
    Source,
    av_to,
    drain,
    mr_access,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, Fabric, traced
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    EventRecord,
    PdType,
    PortAttr,
    QpCaps,
    QpType,
    SendWr,
    SrqAttr,
    UdDest,
    WrType,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ibal.al import AccessLayer, Ca, Cq
    from ibal.ci import ChannelInterface
    from ibal.testing.backdoor import Call


def index_of(calls: list[Call], name: str, handle: Any) -> int:
    """Position of the successful ``name(handle, ...)`` call; fails if absent or repeated."""
    hits = [i for i, c in enumerate(calls) if c.name == name and c.args[0] is handle]
    assert len(hits) == 1, f"{name} called {len(hits)} times for one handle"
    return hits[0]


class DestroyChecks(ConformanceBase):
    chapter = "destroy ordering & cascade"

    @rules("doc:access-layer §4.3", "doc:ci-contract §3.4")
    @traced
    def test_cascade_destroys_children_first(self, fabric: Fabric, ca: Ca, port: PortAttr) -> None:
        """access-layer §4.3 / ci-contract §3.4: a cascade frees QPs (newest first), MWs, MRs, AVs,
        SRQs, then PD and CQ."""
        from ibal.al import QpCreate

        tr = fabric.traced(ca.guid)
        caps = ca.capabilities
        qp_type = QpType.UD if QpType.UD in caps.qp_types else QpType.RC
        pd = ca.alloc_pd()
        cq = ca.create_cq(16)
        pd.reg_mem(bytearray(256), mr_access(caps))
        pd.create_av(av_to(port, port.port_num))
        pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq))
        pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq))
        if caps.mw_types:
            pd.create_mw()
        if caps.srq:
            srq = pd.create_srq(SrqAttr(max_wr=4))
            pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq, srq=srq))
        made = tr.succeeded()
        qps = [c.result.handle for c in made if c.name == "create_qp"]
        (h_pd,) = [c.result for c in made if c.name == "allocate_pd"][-1:]
        h_cq = [c.result.handle for c in made if c.name == "create_cq"][-1]
        h_mr = [c.result.handle for c in made if c.name == "register_mr"][-1]
        h_av = [c.result for c in made if c.name == "create_av"][-1]
        tr.clear()
        ca.close(wait=True)
        calls = tr.succeeded()
        q_idx = [index_of(calls, "destroy_qp", h) for h in qps]
        assert q_idx == sorted(q_idx, reverse=True), "sibling QPs not destroyed newest first"
        pd_idx = index_of(calls, "deallocate_pd", h_pd)
        assert max(q_idx) < index_of(calls, "destroy_cq", h_cq)
        assert max(q_idx) < pd_idx
        mr_idx = index_of(calls, "deregister_mr", h_mr)
        assert mr_idx < pd_idx and index_of(calls, "destroy_av", h_av) < pd_idx
        if caps.mw_types:
            h_mw = [c.result.handle for c in made if c.name == "create_mw"][-1]
            assert index_of(calls, "destroy_mw", h_mw) < mr_idx
        if caps.srq:
            h_srq = [c.result.handle for c in made if c.name == "create_srq"][-1]
            srq_idx = index_of(calls, "destroy_srq", h_srq)
            assert max(q_idx) < srq_idx < pd_idx

    @rules("al:9", "al:10")
    @traced
    def test_close_ca_callback_after_provider_frees(
        self, fabric: Fabric, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rules 9, 10: ib_close_ca's callback runs after the children were freed in
        the provider."""
        tr = fabric.traced(ca.guid)
        Source(ca, port)
        seen: list[list[str]] = []
        done = threading.Event()

        def cb(ctx: Any) -> None:
            seen.append([c.name for c in tr.succeeded()])
            done.set()

        tr.clear()
        ca.close(cb)
        assert done.wait(DEFAULT_TIMEOUT)
        names = seen[0]
        assert names.count("destroy_qp") == 2 and "deallocate_pd" in names
        assert names.count("destroy_cq") == 2

    @staticmethod
    def _one_completion(ca: Ca, port: PortAttr, comp_cb: Callable[[Any, Any], None]) -> Cq:
        """A CQ calling ``comp_cb``, armed, with one send completion on its way to it."""
        cq = ca.create_cq(32, comp_cb=comp_cb)
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        return cq

    @rules("al:3")
    def test_close_al_waits_for_running_callback(
        self, al: AccessLayer, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rule 3: ib_close_al blocks until callbacks in flight returned; none run
        after."""
        entered, release = threading.Event(), threading.Event()
        after_close: list[str] = []
        closed = threading.Event()

        def comp_cb(cq: Any, ctx: Any) -> None:
            entered.set()
            release.wait(30)
            if closed.is_set():
                after_close.append("late")

        self._one_completion(ca, port, comp_cb)
        assert entered.wait(self.timeout)

        def close() -> None:
            al.close()
            closed.set()

        closer = threading.Thread(target=close)
        closer.start()
        assert not closed.is_set()  # cannot be: the callback is still running
        release.set()
        closer.join(self.timeout)
        assert closed.is_set() and not closer.is_alive()
        assert after_close == []
        assert al.closed

    @rules("al:4")
    def test_close_al_from_callback_raises_invalid_state(
        self, al: AccessLayer, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rule 4 / decisions: ib_close_al inside an AL callback → IB_INVALID_STATE, no
        deadlock."""
        errors: list[BaseException] = []
        log = CallbackLog()

        def comp_cb(cq: Any, ctx: Any) -> None:
            try:
                al.close()
            except BaseException as exc:
                errors.append(exc)
            log.add("done")

        self._one_completion(ca, port, comp_cb)
        log.wait(1)
        assert len(errors) == 1 and isinstance(errors[0], InvalidState)
        assert not al.closed

    @rules("doc:decisions")
    def test_waiting_destroy_from_callback_returns(self, ca: Ca, port: PortAttr) -> None:
        """decisions: destroy(wait=True) of another object inside a completion callback returns
        once its destroy callback (on the teardown queue) ran."""
        errors: list[BaseException] = []
        log = CallbackLog()
        destroyed = CallbackLog()
        victim = ca.alloc_pd(context="victim")

        def comp_cb(cq: Any, ctx: Any) -> None:
            try:
                victim.dealloc(destroyed, wait=True)
                log.add("returned", destroyed.snapshot())
            except BaseException as exc:
                errors.append(exc)
                log.add("raised")

        self._one_completion(ca, port, comp_cb)
        log.wait(1)
        assert not errors
        assert log.snapshot() == [("returned", [("victim",)])]
        with pytest.raises(InvalidPdHandle):
            victim.reg_mem(bytearray(16), AccessFlags.LOCAL_WRITE)

    @rules("doc:decisions")
    def test_waiting_destroy_of_own_object_from_its_callback_raises_invalid_state(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """decisions: destroy(wait=True) inside a callback of the object it destroys (or of one
        of its descendants) would wait for itself → IB_INVALID_STATE; the object survives."""
        errors: list[BaseException] = []
        log = CallbackLog()

        def comp_cb(cq: Any, ctx: Any) -> None:
            for call in (lambda: cq.destroy(wait=True), lambda: ca.close(wait=True)):
                try:
                    call()
                except BaseException as exc:
                    errors.append(exc)
            log.add("done")

        cq = self._one_completion(ca, port, comp_cb)
        log.wait(1)
        assert len(errors) == 2 and all(isinstance(e, InvalidState) for e in errors)
        cq.query()  # still valid
        ca.query()

    @rules("al:114")
    def test_async_destroy_from_callback_allowed(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 114: a non-waiting destroy inside a callback works; its callback
        follows."""
        destroyed = CallbackLog()
        victim = ca.alloc_pd(context="victim")

        def comp_cb(cq: Any, ctx: Any) -> None:
            victim.dealloc(destroyed)

        self._one_completion(ca, port, comp_cb)
        destroyed.wait(1)
        assert destroyed.snapshot() == [("victim",)]

    @rules("doc:api.md")
    def test_handle_invalid_as_soon_as_destroy_returns(self, ca: Ca, port: PortAttr) -> None:
        """api.md: after an asynchronous destroy returns, the handle is already invalid."""
        src = Source(ca, port)
        src.a.qp.destroy()
        with pytest.raises(InvalidQpHandle):
            src.a.qp.query()

    @rules("doc:access-layer §4.4")
    def test_destroy_callbacks_run_off_callers_thread(self, ca: Ca) -> None:
        """access-layer §4.4: destroy callbacks run on a system (dispatcher) thread."""
        log = CallbackLog()
        ca.alloc_pd().dealloc(log)
        log.wait(1)
        assert log.threads[0] != threading.get_ident()

    @rules("al:41", "al:114")
    @traced
    def test_qp_event_callback_finishes_before_destroy_callback(
        self, fabric: Fabric, ca: Ca
    ) -> None:
        """access-layer rules 41, 114: a running QP event callback finishes before the QP's destroy
        callback."""
        from ibal.al import QpCreate

        tr = fabric.traced(ca.guid)
        if not tr.capabilities.async_event_injection:
            pytest.skip(
                "provider lacks async_event_injection: "
                + tr.capabilities.reason("async_event_injection")
            )
        order: list[str] = []
        entered, release = threading.Event(), threading.Event()

        def event_cb(rec: Any) -> None:
            entered.set()
            release.wait(30)
            order.append("event")

        cq = ca.create_cq(8)
        qp_type = next(
            t for t in (QpType.UD, QpType.RC, QpType.UC) if t in ca.capabilities.qp_types
        )
        qp = ca.alloc_pd().create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq), event_cb=event_cb)
        tr.inject_async_event(EventRecord(AsyncEvent.QP_FATAL, tr.qp_contexts[qp.num]))
        assert entered.wait(self.timeout)
        done = CallbackLog()

        def destroyed(ctx: Any) -> None:
            order.append("destroy")
            done.add(ctx)

        qp.destroy(destroyed)
        assert "destroy" not in order
        release.set()
        done.wait(1)
        assert order == ["event", "destroy"]

    @rules("ci:62")
    def test_no_completion_after_qp_destroy_returns(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 62: once destroy_qp returned, its outstanding WRs never complete."""
        cq = ca.create_cq(1024)
        src = Source(
            ca,
            port,
            send_cq=cq,
            qp_type=QpType.RC if QpType.RC in ca.capabilities.qp_types else None,
        )
        dead = src.a.qp.num
        for _ in range(4):
            src.a.qp.post_send([self._write_wr(src, i) for i in range(8)])
        src.a.qp.destroy(wait=True)
        drain(cq)  # what completed before the destroy may still be polled
        other = Source(ca, port, send_cq=cq)
        ids = other.fire(3)
        got = wait_wcs(cq, 3)
        assert [w.wr_id for w in got] == ids, "a completion of the destroyed QP appeared"
        assert all(w.qp_num != dead for w in got + drain(cq))

    @staticmethod
    def _write_wr(src: Source, i: int) -> SendWr:
        if src.qp_type.is_datagram:
            assert src.a.av is not None
            return SendWr(
                wr_id=1000 + i,
                sg_list=[src.a.sge(0, 8)],
                ud=UdDest(av=src.a.av, remote_qp=src.b.qp.num, remote_qkey=UD_QKEY),
            )
        return SendWr(
            wr_id=1000 + i,
            opcode=WrType.RDMA_WRITE,
            sg_list=[src.a.sge(0, 8)],
            remote_addr=src.b.remote(512),
            rkey=src.b.mr.rkey,
        )

    @rules("al:10", "al:20")
    def test_cascade_returns_every_provider_resource(
        self, fabric: Fabric, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rules 10, 20 / ci-contract §3.4: after a cascade the provider holds
        exactly what it held before (nothing leaked, nothing freed twice)."""
        before = self.resources_of(fabric, ca.guid)
        src = Source(ca, port)
        during = self.resources_of(fabric, ca.guid)
        assert during != before, "the backdoor did not see the new objects"
        src.pd.dealloc(wait=True)
        src.send_cq.destroy(wait=True)
        src.recv_cq.destroy(wait=True)
        assert self.resources_of(fabric, ca.guid) == before

    @rules("ci:49")
    def test_failed_verb_leaves_nothing_behind(self, raw_cis: list[ChannelInterface]) -> None:
        """ci-contract rule 49 / ibal.ci.interface: a verb that fails creates nothing at the
        provider (called on the CI directly: the access layer refuses these arguments first)."""
        from ibal.testing.suite.ch_contract import RawCa, address_of

        raw = RawCa(raw_cis[0])
        try:
            ci, attr = raw.ci, raw.attr
            h_pd = ci.allocate_pd(raw.h, PdType.NORMAL)
            cq = ci.create_cq(raw.h, 8, None)
            before = self.live_resources(ci)
            qp_type = next(
                t for t in (QpType.RC, QpType.UD, QpType.UC) if t in ci.capabilities.qp_types
            )
            for caps, error in (
                (QpCaps(sq_depth=attr.max_wrs + 1), InvalidMaxWrs),
                (QpCaps(rq_depth=attr.max_wrs + 1), InvalidMaxWrs),
                (QpCaps(sq_sge=attr.max_sges + 1), InvalidMaxSge),
            ):
                with pytest.raises(error):
                    ci.create_qp(h_pd, qp_type, caps, cq.handle, cq.handle, None, True, None)
            with pytest.raises(InvalidCqSize):
                ci.create_cq(raw.h, attr.max_cqes + 1, None)
            buf = bytearray(64)
            with pytest.raises(InvalidPermission):
                ci.register_mr(h_pd, memoryview(buf), address_of(buf), AccessFlags.RDMA_WRITE)
            if before is not None:
                assert self.live_resources(ci) == before, "a failed verb left an object behind"
            # Nothing half-made holds the parents: they go at once, and the CA closes.
            ci.destroy_cq(cq.handle)
            ci.deallocate_pd(h_pd)
            ci.close_ca(raw.h)
        finally:
            raw.close()

    @rules("al:2")
    def test_close_al_returns_every_provider_resource(
        self, fabric: Fabric, al: AccessLayer, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rule 2: closing the AL frees, at the provider, everything opened through
        it."""
        before = self.resources_of(fabric, ca.guid)
        Source(ca, port)
        ca.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
        al.close()
        assert self.resources_of(fabric, ca.guid) == before
