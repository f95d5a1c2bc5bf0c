"""Chapter: completion queues and completion notification."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import (
    InvalidCqHandle,
    InvalidCqSize,
    InvalidParameter,
    Overflow,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.helpers import CallbackLog, Source, drain, settle, wait_until, wait_wcs
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require
from ibal.types import PortAttr, SendOpt, WcType

if TYPE_CHECKING:
    from ibal.al import Ca, Cq
    from ibal.ci import Capabilities


def barrier(ca: Ca) -> None:
    """Let every callback queued so far run, so a callback that should not fire has fired if
    it was going to (a waited destroy is no barrier: its callback runs on another queue)."""
    settle(ca)


def finish(src: Source, *cqs: Cq) -> None:
    """Barrier: destroy the source's QPs and ``cqs`` and wait, so no callback can follow."""
    src.a.qp.destroy(wait=True)
    src.b.qp.destroy(wait=True)
    for cq in cqs:
        cq.destroy(wait=True)


class CqChecks(ConformanceBase):
    chapter = "CQ & notification"

    @rules("ci:65", "al:25", "al:26")
    def test_create_cq_size_at_least_requested(self, ca: Ca) -> None:
        """ci-contract rule 65 / access-layer rules 25, 26: granted size ≥ asked; query reports
        it."""
        cq = ca.create_cq(17)
        assert cq.size >= 17
        assert cq.query() == cq.size

    @rules("ci:66", "al:25")
    def test_create_cq_above_max_raises_invalid_cq_size(self, ca: Ca) -> None:
        """ci-contract rule 66 / access-layer rule 25: a size above the CA maximum →
        IB_INVALID_CQ_SIZE."""
        with pytest.raises(InvalidCqSize):
            ca.create_cq(ca.query().max_cqes + 1)

    @rules("ci:94")
    def test_poll_empty_cq_returns_empty_list(self, ca: Ca) -> None:
        """ci-contract rule 94 / decisions: polling an empty CQ gives [] (IB_NOT_FOUND)."""
        cq = ca.create_cq(8)
        assert cq.poll() == []
        assert cq.poll(1) == []

    @rules("ci:95", "al:31", "al:32", "iba:wc.order")
    def test_poll_returns_at_most_max_then_rest_in_order(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 95 / access-layer rules 31, 32: ≤ max per poll, in completion order; the
        rest next."""
        cq = ca.create_cq(64)
        src = Source(ca, port, send_cq=cq)
        ids = src.fire(7)
        got: list[int] = []
        sizes: list[int] = []

        def more() -> bool:
            batch = cq.poll(2)
            if batch:
                sizes.append(len(batch))
                got.extend(w.wr_id for w in batch)
            return len(got) >= 7

        wait_until(more, "7 completions polled two at a time")
        assert max(sizes) <= 2
        assert got == ids
        assert cq.poll() == []

    @staticmethod
    def _count_ready(cq: Cq, n: int) -> bool:
        return bool(cq.peek() >= n)

    @rules("ci:96", "al:30")
    def test_peek_counts_without_consuming(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 96 / access-layer rule 30: peek gives the queued count, IB_UNSUPPORTED
        if absent."""
        cq = ca.create_cq(32)
        if not caps.peek_cq:
            with pytest.raises(Unsupported):
                cq.peek()
            return
        assert cq.peek() == 0
        src = Source(ca, port, send_cq=cq)
        src.fire(3)
        wait_until(lambda: cq.peek() == 3, "peek() == 3")
        assert cq.peek() == 3
        assert len(cq.poll(8)) == 3
        assert cq.peek() == 0

    @rules("al:26", "al:27")
    def test_modify_cq_grows(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rules 26, 27: ib_modify_cq gives a size ≥ asked, which query then
        reports."""
        cq = ca.create_cq(16)
        if not caps.resize_cq:
            with pytest.raises(Unsupported):
                cq.modify(64)
            return
        new = cq.modify(64)
        assert new >= 64
        assert cq.query() == new == cq.size

    @rules("ci:68", "al:27")
    def test_modify_cq_below_queued_raises_overflow(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 68 / access-layer rule 27: shrink below queued entries → IB_OVERFLOW, CQ
        unchanged."""
        require(caps, "resize_cq")
        require(caps, "peek_cq")  # to know the entries are queued without consuming them
        cq = ca.create_cq(32)
        size = cq.size
        src = Source(ca, port, send_cq=cq)
        ids = src.fire(6)
        wait_until(lambda: self._count_ready(cq, 6), "6 completions queued")
        with pytest.raises(Overflow):
            cq.modify(2)
        assert cq.query() == size
        assert [w.wr_id for w in wait_wcs(cq, 6)] == ids

    @rules("ci:69", "al:27")
    def test_modify_cq_above_max_raises_invalid_cq_size(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 69 / access-layer rule 27: a size the CA cannot support →
        IB_INVALID_CQ_SIZE."""
        require(caps, "resize_cq")
        cq = ca.create_cq(16)
        with pytest.raises(InvalidCqSize):
            cq.modify(ca.query().max_cqes + 1)
        assert cq.query() == cq.size

    @rules("ci:70")
    def test_modify_cq_keeps_completions(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 70: resizing with entries queued and WRs outstanding loses no
        completion."""
        require(caps, "resize_cq")
        cq = ca.create_cq(16)
        src = Source(ca, port, send_cq=cq)
        ids = src.fire(4)
        cq.modify(128)
        ids += src.fire(4)
        assert [w.wr_id for w in wait_wcs(cq, 8)] == ids

    @rules("al:28")
    def test_comp_cb_gets_cq_and_context(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 28: pfn_comp_cb(h_cq, cq_context) for the armed CQ."""
        log = CallbackLog()
        token = object()
        cq = ca.create_cq(32, comp_cb=log, context=token)
        assert cq.context is token
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        log.wait(1)
        got_cq, got_ctx = log.snapshot()[0]
        assert got_cq is cq and got_ctx is token

    @rules("doc:api.md")
    def test_comp_cb_runs_on_dispatcher_thread(self, ca: Ca, port: PortAttr) -> None:
        """api.md: completion callbacks never run on the caller's stack (nor the provider's)."""
        log = CallbackLog()
        cq = ca.create_cq(32, comp_cb=log)
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        log.wait(1)
        assert log.threads[0] != threading.get_ident()

    @rules("ci:97", "al:28", "iba:cq.arm-once")
    def test_rearm_fires_exactly_once(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 97 / access-layer rule 28: one arm → one callback, however many
        completions follow."""
        log = CallbackLog()
        cq = ca.create_cq(64, comp_cb=log)
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(4)
        log.wait(1)
        wait_wcs(cq, 4)
        finish(src, cq)
        assert len(log) == 1

    @rules("ci:97", "iba:cq.per-cq")
    def test_arm_of_one_cq_ignores_another(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 97: an armed CQ gets no callback for another CQ's completions; its
        own next completion fires it, with its own handle."""
        log = CallbackLog()
        armed = ca.create_cq(64, comp_cb=log)
        other = ca.create_cq(64, comp_cb=log)
        busy = Source(ca, port, send_cq=other, recv_cq=other)
        mine = Source(ca, port, send_cq=armed, recv_cq=armed)
        armed.rearm()
        busy.fire(2)
        wait_wcs(other, 4)
        barrier(ca)
        assert len(log) == 0, "arming one CQ fired the callback for another's completion"
        mine.fire(1)
        log.wait(1)
        wait_wcs(armed, 2)
        finish(busy)
        finish(mine)
        assert [entry[0] for entry in log.snapshot()] == [armed]

    @rules("al:28", "iba:cq.no-arm")
    def test_no_callback_without_rearm(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 28: without a rearm, no completion callback fires."""
        log = CallbackLog()
        cq = ca.create_cq(64, comp_cb=log)
        src = Source(ca, port, send_cq=cq)
        src.fire(2)
        wait_wcs(cq, 2)
        barrier(ca)
        assert len(log) == 0, "a completion fired the callback without a rearm"
        cq.rearm()
        src.fire(1)
        log.wait(1)
        wait_wcs(cq, 1)
        finish(src, cq)
        assert len(log) == 1

    @rules("ci:97", "iba:cq.arm-present")
    def test_entries_present_at_arm_do_not_fire(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 97: entries already in the CQ at arm time do not trigger the
        callback."""
        log = CallbackLog()
        cq = ca.create_cq(64, comp_cb=log)
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        log.wait(1)
        wait_until(lambda: cq.peek() >= 1 if caps.peek_cq else True, "the entry queued")
        cq.rearm()  # that entry is still queued (not polled): it must not fire this arm
        barrier(ca)
        assert len(log) == 1, "re-arming a CQ that holds entries fired the callback at once"
        src.fire(1)
        log.wait(2)
        assert len(wait_wcs(cq, 2)) == 2
        finish(src, cq)
        assert len(log) == 2

    @rules("ci:97", "al:28", "iba:cq.solicited")
    def test_rearm_solicited_ignores_unsolicited(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 97 / access-layer rule 28: solicited arm fires only for a solicited
        completion."""
        require(caps, "solicited_events")
        log = CallbackLog()
        rcq = ca.create_cq(64, comp_cb=log)
        src = Source(ca, port, recv_cq=rcq)
        rcq.rearm(solicited=True)
        src.fire(2)  # unsolicited
        first = wait_wcs(rcq, 2)
        barrier(ca)
        assert len(log) == 0, "an unsolicited completion fired a solicited-only arm"
        src.fire(1, SendOpt.SIGNALED | SendOpt.SOLICITED)
        log.wait(1)
        last = wait_wcs(rcq, 1)
        finish(src, rcq)
        assert len(log) == 1
        assert all(w.wc_type is WcType.RECV for w in first + last)

    @rules("ci:98", "al:29")
    def test_rearm_n_fires_after_n(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 98 / access-layer rule 29: the callback comes after N new completions,
        once."""
        log = CallbackLog()
        cq = ca.create_cq(64, comp_cb=log)
        if not caps.rearm_n_cq:
            with pytest.raises(Unsupported):
                cq.rearm_n(2)
            return
        src = Source(ca, port, send_cq=cq)
        src.fire(1)
        wait_wcs(cq, 1)
        cq.rearm_n(3)
        src.fire(2)
        wait_wcs(cq, 2)
        barrier(ca)
        assert len(log) == 0, "fired before the third new completion"
        src.fire(1)
        log.wait(1)
        wait_wcs(cq, 1)
        finish(src, cq)
        assert len(log) == 1

    @rules("ci:98", "al:29")
    def test_rearm_n_bad_count_raises_invalid_parameter(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 98 / access-layer rule 29: n < 1 or n > CQ size →
        IB_INVALID_PARAMETER."""
        require(caps, "rearm_n_cq")
        cq = ca.create_cq(16)
        with pytest.raises(InvalidParameter):
            cq.rearm_n(0)
        with pytest.raises(InvalidParameter):
            cq.rearm_n(cq.size + 1)

    @rules("ci:71", "al:34")
    def test_destroy_cq_in_use_raises_resource_busy(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 71 / access-layer rule 34: destroying a CQ a QP uses → IB_RESOURCE_BUSY;
        it keeps working."""
        cq = ca.create_cq(32)
        src = Source(ca, port, send_cq=cq)
        with pytest.raises(ResourceBusy):
            cq.destroy()
        ids = src.fire(2)
        assert [w.wr_id for w in wait_wcs(cq, 2)] == ids

    @rules("ci:72")
    def test_destroy_cq_twice_raises_invalid_cq_handle(self, ca: Ca) -> None:
        """ci-contract rule 72: a destroyed CQ handle → IB_INVALID_CQ_HANDLE."""
        cq = ca.create_cq(8)
        cq.destroy(wait=True)
        with pytest.raises(InvalidCqHandle):
            cq.destroy()
        with pytest.raises(InvalidCqHandle):
            cq.poll()
        with pytest.raises(InvalidCqHandle):
            cq.rearm()

    @rules("al:34", "al:114")
    def test_destroy_cq_callback_after_last_comp_cb(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rules 34, 114: the destroy callback runs after the running completion
        callback returns."""
        order: list[str] = []
        entered, release = threading.Event(), threading.Event()

        def comp_cb(cq: Any, ctx: Any) -> None:
            entered.set()
            release.wait(30)
            order.append("comp")

        cq = ca.create_cq(32, comp_cb=comp_cb, context="cq")
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        assert entered.wait(self.timeout)
        src.a.qp.destroy()
        src.b.qp.destroy()
        done = CallbackLog()

        def destroyed(ctx: Any) -> None:
            order.append("destroy")
            done.add(ctx)

        cq.destroy(destroyed)
        assert "destroy" not in order  # cannot have run: a callback for the CQ is running
        release.set()
        done.wait(1)
        assert order == ["comp", "destroy"]
        assert done.snapshot() == [("cq",)]

    @rules("ci:72")
    def test_no_comp_cb_after_destroy(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 72: after destroy, pending notifications are discarded; no callback
        follows."""
        events: list[str] = []
        cq = ca.create_cq(32, comp_cb=lambda c, x: events.append("comp"))
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        src.fire(1)
        src.a.qp.destroy(wait=True)
        src.b.qp.destroy(wait=True)
        cq.destroy(lambda ctx: events.append("destroy"), wait=True)
        ca.alloc_pd().dealloc(wait=True)  # a later teardown-queue round
        assert events[-1] == "destroy"
        assert events.count("comp") <= 1

    @rules("ci:62")
    def test_completions_survive_qp_destroy(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 62: completions already in the CQ stay pollable after their QP is
        destroyed."""
        require(ca.capabilities, "peek_cq")  # to know they are queued without consuming them
        cq = ca.create_cq(32)
        src = Source(ca, port, send_cq=cq)
        ids = src.fire(3)
        wait_until(lambda: self._count_ready(cq, 3), "3 completions queued")
        qp_num = src.a.qp.num
        src.a.qp.destroy(wait=True)
        got = drain(cq)
        assert [w.wr_id for w in got] == ids
        assert all(w.qp_num == qp_num for w in got)
