"""The callback queues: which callback runs where, waits across queues, ordering kept."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import (
    AccessLayer,
    AlManager,
    Ca,
    Cq,
    Pd,
    PnpClass,
    PnpEvent,
    PnpRec,
    QpCreate,
    in_callback,
)
from ibal.status import InvalidPdHandle, InvalidQpHandle, InvalidState
from ibal.types import AsyncEvent, AsyncEventRec, LinkState, QpType, Wc, WcType

WAIT = 10.0


def _fire(ci: FakeCi, cq: Cq, wr_id: int = 1) -> None:
    cq.rearm()
    ci.complete(cq._h, Wc(wr_id, WcType.SEND))


def _qp(pd: Pd, cq: Cq, **kw: Any) -> Any:
    return pd.create_qp(QpCreate(QpType.RC, cq, cq), **kw)


class Threads:
    """The queue thread each named callback ran on."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.cond = threading.Condition()

    def cb(self, name: str) -> Any:
        def record(*_args: Any) -> None:
            with self.cond:
                self.names[name] = threading.current_thread().name
                self.cond.notify_all()

        return record

    def wait(self, *names: str) -> dict[str, str]:
        with self.cond:
            assert self.cond.wait_for(lambda: set(names) <= set(self.names), WAIT), self.names
            return dict(self.names)


def test_each_kind_of_callback_runs_on_its_own_queue(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    t = Threads()
    cq = ca.create_cq(8, comp_cb=t.cb("completion"))
    qp = _qp(pd, cq, event_cb=t.cb("event"))
    al.reg_pnp(PnpClass.CA, lambda rec: t.cb("pnp")() if rec.event is PnpEvent.CA_ADD else None)
    _fire(ci, cq)
    ci.qp_event(qp._h)
    ca.alloc_pd().dealloc(t.cb("destroy"))
    mgr.queues.misc.post(t.cb("posted"))
    names = t.wait("completion", "event", "pnp", "destroy", "posted")
    q = mgr.queues
    assert names == {
        "completion": q.completion.name,
        "event": q.misc.name,
        "pnp": q.pnp.name,
        "destroy": q.teardown.name,
        "posted": q.misc.name,
    }
    assert len(set(names.values())) == 4


def test_misc_post_runs_in_fifo_order_off_the_callers_thread(mgr: AlManager) -> None:
    got: list[tuple[int, bool]] = []
    for i in range(50):
        mgr.queues.misc.post(lambda i=i: got.append((i, mgr.queues.misc.is_current())))
    assert mgr.queues.flush(WAIT)
    assert got == [(i, True) for i in range(50)]


def test_event_callback_waits_for_a_completion(ca: Ca, pd: Pd, ci: FakeCi) -> None:
    """An async-event callback blocks until a completion callback ran, then polls it."""
    completed = threading.Event()
    returned: list[list[Wc]] = []
    cq = ca.create_cq(8, comp_cb=lambda cq, ctx: completed.set())

    def event_cb(rec: AsyncEventRec) -> None:
        assert in_callback()
        _fire(ci, cq, wr_id=77)  # the hardware completes while we handle the event
        assert completed.wait(WAIT)  # on one dispatcher thread this never returned
        wcs: list[Wc] = []
        while not wcs:
            wcs = cq.poll()
        returned.append(wcs)

    qp = _qp(pd, cq, event_cb=event_cb)
    ci.qp_event(qp._h, AsyncEvent.QP_FATAL)
    assert ca._mgr.queues.flush(WAIT)
    assert [[w.wr_id for w in wcs] for wcs in returned] == [[77]]


def test_waiting_destroy_inside_a_completion_callback_returns(
    ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    order: list[str] = []
    victim_cq = ca.create_cq(4)
    victim = _qp(pd, victim_cq, context="victim-qp")

    def comp_cb(cq: Cq, ctx: Any) -> None:
        victim.destroy(lambda c: order.append(f"destroy-cb {c}"), wait=True)
        order.append("returned")
        victim_cq.destroy(wait=True)  # no longer used: no ResourceBusy
        order.append("cq gone")

    cq = ca.create_cq(8, comp_cb=comp_cb)
    _fire(ci, cq)
    assert ca._mgr.queues.flush(WAIT)
    assert order == ["destroy-cb victim-qp", "returned", "cq gone"]
    assert "destroy_qp" in ci.verbs() and "destroy_cq" in ci.verbs()
    with pytest.raises(InvalidQpHandle):
        victim.query()


def test_waits_that_depend_on_their_own_queue_raise(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    seen: dict[str, Any] = {}

    def destroy_cb(_ctx: Any) -> None:  # on the teardown queue
        other = ca.alloc_pd()
        try:
            other.dealloc(wait=True)
        except InvalidState:
            seen["teardown"] = InvalidState
        other.dealloc()

    def pnp_cb(rec: PnpRec) -> None:  # on the PnP queue
        if rec.event is not PnpEvent.REG_COMPLETE:
            return
        try:
            al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, lambda r: None)
        except InvalidState:
            seen["pnp"] = InvalidState
        try:
            al.close()  # its own registration is running: it would wait for itself
        except InvalidState:
            seen["close"] = InvalidState

    ca.alloc_pd().dealloc(destroy_cb)
    al.reg_pnp(PnpClass.CA, pnp_cb)
    assert mgr.queues.flush(WAIT) and mgr.queues.flush(WAIT)
    assert seen == {"teardown": InvalidState, "pnp": InvalidState, "close": InvalidState}
    assert not al.closed


def test_sync_reg_pnp_and_dereg_fence_from_a_completion_callback(
    mgr: AlManager, al: AccessLayer, ca: Ca, ci: FakeCi
) -> None:
    """Both wait for the PnP queue, which a completion callback does not run on."""
    pnp_running, release = threading.Event(), threading.Event()
    events: list[str] = []

    def slow(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_ADD:
            pnp_running.set()
            release.wait(WAIT)
            events.append("slow-returned")

    reg = al.reg_pnp(PnpClass.CA, slow)
    assert pnp_running.wait(WAIT)

    def comp_cb(cq: Cq, ctx: Any) -> None:
        threading.Timer(0.05, release.set).start()  # the fence must wait for the running one
        reg.dereg()
        events.append("dereg-returned")
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC,
                   lambda rec: events.append(f"sync {rec.event.name}"))
        events.append("reg-returned")

    cq = ca.create_cq(8, comp_cb=comp_cb)
    _fire(ci, cq)
    assert mgr.queues.flush(WAIT)
    assert events == ["slow-returned", "dereg-returned", "sync CA_ADD", "sync CA_ADD",
                      "sync REG_COMPLETE", "reg-returned"]


def test_close_al_from_a_pnp_callback_of_another_al(mgr: AlManager, ci: FakeCi) -> None:
    closing = mgr.open_al()
    ca = closing.open_ca(ci.guid)
    destroyed: list[str] = []
    ca.create_cq(8, context="cq")
    watcher = mgr.open_al()
    result: list[Any] = []

    def pnp_cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.REG_COMPLETE:
            ca.alloc_pd(context="pd").dealloc(lambda c: destroyed.append(c))
            closing.close()
            result.append(closing.closed)

    watcher.reg_pnp(PnpClass.CA, pnp_cb)
    assert mgr.queues.flush(WAIT)
    assert result == [True] and destroyed == ["pd"]
    assert ci.live_kinds() == []


def test_a_blocked_completion_callback_holds_up_no_other_queue(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    running, release = threading.Event(), threading.Event()

    def comp_cb(cq: Cq, ctx: Any) -> None:
        running.set()
        release.wait(3 * WAIT)  # longer than the waits below

    cq = ca.create_cq(8, comp_cb=comp_cb)
    _fire(ci, cq)
    assert running.wait(WAIT)
    try:
        t = Threads()
        other_cq = ca.create_cq(8)
        qp = _qp(pd, other_cq, event_cb=t.cb("event"))
        ci.qp_event(qp._h)
        # Before the destroy: an event still queued for a destroying QP is dropped.
        t.wait("event")
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, t.cb("pnp"))
        qp.destroy(t.cb("destroy"))
        t.wait("event", "pnp", "destroy")
        for q in (mgr.queues.misc, mgr.queues.pnp, mgr.queues.teardown):
            assert q.flush(WAIT)
    finally:
        release.set()


def test_destroy_callback_after_callbacks_running_on_two_queues(
    ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    """A CQ with a completion callback and an event callback both running: destroy waits for both;
    a completion queued after the destroy is dropped."""
    started = threading.Barrier(3)
    release = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def note(s: str) -> None:
        with lock:
            order.append(s)

    def comp_cb(cq: Cq, ctx: Any) -> None:
        note("comp")
        started.wait(WAIT)
        release.wait(WAIT)
        note("comp-end")

    def event_cb(rec: AsyncEventRec) -> None:
        note("event")
        started.wait(WAIT)
        release.wait(WAIT)
        note("event-end")

    cq = ca.create_cq(8, comp_cb=comp_cb, event_cb=event_cb, context="cq")
    _fire(ci, cq)
    ci.raise_event(AsyncEvent.CQ_ERROR, cq)
    started.wait(WAIT)
    done = threading.Event()
    cq.rearm()
    h = cq._h
    cq.destroy(lambda c: (note(f"destroy {c}"), done.set()))
    ci.complete(h, Wc(2, WcType.SEND))  # armed: an upcall, queued behind the running one
    release.set()
    assert done.wait(WAIT)
    assert ca._mgr.queues.flush(WAIT)
    assert order[-1] == "destroy cq"
    assert sorted(order[:-1]) == ["comp", "comp-end", "event", "event-end"]


def test_pnp_order_holds_with_port_events_racing_a_registration(
    mgr: AlManager, al: AccessLayer, ci: FakeCi
) -> None:
    """Port events are turned into PnP events on the misc queue, registrations replay on the
    PnP queue: a new registration still sees its replay before any live event."""
    hold, release = threading.Event(), threading.Event()
    seen: dict[str, list[PnpEvent]] = {"a": [], "b": []}

    def a(rec: PnpRec) -> None:
        seen["a"].append(rec.event)
        if rec.event is PnpEvent.REG_COMPLETE:
            hold.set()
            release.wait(WAIT)  # keep the PnP queue busy while events pile up behind

    def b(rec: PnpRec) -> None:
        if rec.guid in (0, ci.attr.ports[0].port_guid):
            seen["b"].append(rec.event)

    al.reg_pnp(PnpClass.PORT, a)
    assert hold.wait(WAIT)
    ci.set_port_state(1, LinkState.DOWN)
    assert mgr.queues.misc.flush(WAIT)  # the PORT_DOWN is now queued for "a"
    al.reg_pnp(PnpClass.PORT, b)
    ci.set_port_state(1, LinkState.ACTIVE)
    assert mgr.queues.misc.flush(WAIT)  # both changes queued before "a" returns
    release.set()
    assert mgr.queues.flush(WAIT)
    assert seen["b"] == [PnpEvent.PORT_ADD, PnpEvent.PORT_DOWN, PnpEvent.REG_COMPLETE,
                         PnpEvent.PORT_ACTIVE]
    # "a" was busy: its queued PORT_DOWN was replaced by the newer state (flaps coalesce).
    live = seen["a"][seen["a"].index(PnpEvent.REG_COMPLETE) + 1:]
    assert live == [PnpEvent.PORT_ACTIVE]


def test_removes_reach_registrations_in_reverse_across_als(mgr: AlManager,
                                                           provider: FakeProvider) -> None:
    order: list[tuple[str, PnpEvent]] = []
    als = [mgr.open_al() for _ in range(3)]
    for i, al in enumerate(als):
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC,
                   lambda rec, i=i: order.append((f"r{i}", rec.event)))
    order.clear()
    mgr.deregister_ca(provider.cis[1].guid)
    assert order == [("r2", PnpEvent.CA_REMOVE), ("r1", PnpEvent.CA_REMOVE),
                     ("r0", PnpEvent.CA_REMOVE)]


def test_manager_close_from_its_callback_raises_but_another_managers_is_fine(
    mgr: AlManager, ca: Ca, ci: FakeCi
) -> None:
    other = AlManager()
    other.add_provider(FakeProvider(1, base_guid=0x9000))
    seen: list[Any] = []

    def comp_cb(cq: Cq, ctx: Any) -> None:
        try:
            mgr.close()
        except InvalidState:
            seen.append(InvalidState)
        other.close(timeout=WAIT)
        seen.append(other.closed)

    cq = ca.create_cq(8, comp_cb=comp_cb)
    _fire(ci, cq)
    assert mgr.queues.flush(WAIT)
    assert seen == [InvalidState, True]


def test_waiting_destroy_of_a_pd_from_its_qps_event_callback_raises(
    ca: Ca, pd: Pd, cq: Cq, ci: FakeCi
) -> None:
    seen: list[Any] = []

    def event_cb(rec: AsyncEventRec) -> None:
        try:
            pd.dealloc(wait=True)  # takes the QP along, whose callback this is
        except InvalidState:
            seen.append(InvalidState)

    qp = _qp(pd, cq, event_cb=event_cb)
    ci.qp_event(qp._h)
    assert ca._mgr.queues.flush(WAIT)
    assert seen == [InvalidState]
    pd.dealloc(wait=True)  # the PD survived the refusal; from here it goes
    with pytest.raises(InvalidPdHandle):
        pd.create_qp(QpCreate(QpType.RC, cq, cq))


def test_no_object_stays_held_after_its_callback(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    """The per-thread record of running callbacks (what makes waits raise) empties again."""
    from ibal.al.dispatcher import held

    inside: list[list[Any]] = []
    cq = ca.create_cq(8, comp_cb=lambda cq, ctx: inside.append(list(held())))
    qp = _qp(pd, cq, event_cb=lambda rec: inside.append(list(held())))
    _fire(ci, cq)
    ci.qp_event(qp._h)
    assert mgr.queues.flush(WAIT)
    assert sorted(map(repr, (o[0] for o in inside))) == sorted([repr(cq), repr(qp)])
    after: list[list[Any]] = []
    for q in (mgr.queues.completion, mgr.queues.misc):
        q.post(lambda: after.append(list(held())))
    assert mgr.queues.flush(WAIT)
    assert after == [[], []]
    qp.destroy(wait=True)  # not held any more: the wait is allowed from here
