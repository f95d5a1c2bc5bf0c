"""``Dependent``: upper layers' objects hung on AL, CA, port, PD and QP handles."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from al_fakes import FakeCi

import ibal
from ibal.al import (
    AccessLayer,
    AlManager,
    Ca,
    Cq,
    Dependent,
    Pd,
    PnpClass,
    PnpEvent,
    PnpRec,
    QpCreate,
)
from ibal.status import (
    InvalidCaHandle,
    InvalidHandle,
    InvalidParameter,
    InvalidPort,
    InvalidQpHandle,
    InvalidState,
)
from ibal.types import AsyncEvent, AsyncEventRec, QpType, Wc, WcType

WAIT = 10.0


class Journal:
    """One ordered log shared by every callback and hook of a test."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.lock = threading.Lock()

    def add(self, item: str) -> None:
        with self.lock:
            self.items.append(item)

    def cb(self, item: str) -> Any:
        return lambda *_: self.add(item)


class Toy(Dependent):
    """A toy "transaction": records its hooks, and answers through post_callback."""

    def __init__(self, owner: Any, journal: Journal, name: str, **kw: Any) -> None:
        self.journal = journal
        self.name = name
        self.answers: list[Any] = []
        super().__init__(owner, context=name, destroy_cb=journal.cb(f"{name} destroy-cb"), **kw)

    def on_destroying(self) -> None:
        self.journal.add(f"{self.name} cancelled")

    def cleanup(self) -> None:
        self.journal.add(f"{self.name} cleanup")

    def answer(self, value: Any) -> bool:
        return self.post_callback(self.answers.append, value)


def test_exported_from_ibal_and_ibal_al() -> None:
    assert ibal.Dependent is Dependent
    assert "Dependent" in ibal.__all__ and "Dependent" in ibal.al.__all__


def test_children_of_al_ca_port_pd_and_qp(al: AccessLayer, ca: Ca, pd: Pd, cq: Cq) -> None:
    j = Journal()
    qp = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    toys = {
        "al": Toy(al, j, "al"),
        "ca": Toy(ca, j, "ca"),
        "port": Toy((ca, 2), j, "port"),
        "pd": Toy(pd, j, "pd"),
        "qp": Toy(qp, j, "qp"),
        "cq": Toy(cq, j, "cq"),
    }
    nested = Toy(toys["qp"], j, "nested")
    assert {k: t.owner for k, t in toys.items()} == {
        "al": al, "ca": ca, "port": ca, "pd": pd, "qp": qp, "cq": cq}
    assert toys["port"].port_num == 2 and toys["ca"].port_num == 0
    assert nested.owner is toys["qp"] and nested.al is al and nested.context == "nested"
    assert all(t.alive for t in toys.values())


def test_bad_owners_are_refused(al: AccessLayer, ca: Ca, pd: Pd) -> None:
    j = Journal()
    with pytest.raises(InvalidParameter):
        Toy(object(), j, "x")
    with pytest.raises(InvalidParameter):
        Toy(pd.create_av(_av()), j, "x")  # a synchronously destroyed object cannot own
    with pytest.raises(InvalidParameter):
        Toy((pd, 1), j, "x")
    with pytest.raises(InvalidPort):
        Toy((ca, 3), j, "x")
    with pytest.raises(InvalidParameter):
        Dependent(ca, destroy_cb=42)  # type: ignore[arg-type]
    ca.close(wait=True)
    with pytest.raises(InvalidCaHandle):
        Toy(ca, j, "x")
    assert j.items == []


def _av() -> Any:
    from ibal.types import AvAttr

    return AvAttr(port_num=1, dlid=3)


def test_qp_destroy_cancels_its_dependents_before_its_own_destroy_callback(
    ca: Ca, pd: Pd, cq: Cq, ci: FakeCi
) -> None:
    """Cascade newest first; the toys' destroy callbacks come after the QP's running event
    callback returned and right before the QP's destroy callback."""
    j = Journal()
    running, release = threading.Event(), threading.Event()

    def event_cb(rec: AsyncEventRec) -> None:
        j.add("qp event")
        running.set()
        release.wait(WAIT)
        j.add("qp event returned")

    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=event_cb)
    older, newer = Toy(qp, j, "older"), Toy(qp, j, "newer")
    ci.qp_event(qp._h)
    assert running.wait(WAIT)
    done = threading.Event()
    qp.destroy(lambda _c: (j.add("qp destroy-cb"), done.set()))
    for toy in (older, newer):
        assert not toy.alive
        with pytest.raises(InvalidHandle):
            toy.check()
    with pytest.raises(InvalidQpHandle):
        qp.query()
    release.set()
    assert done.wait(WAIT)
    assert j.items == [
        "qp event",
        "newer cancelled", "newer cleanup",
        "older cancelled", "older cleanup",
        "qp event returned",
        "newer destroy-cb", "older destroy-cb",
        "qp destroy-cb",
    ]


def test_al_close_cancels_every_dependent(mgr: AlManager, ci: FakeCi) -> None:
    al = mgr.open_al()
    ca = al.open_ca(ci.guid)
    pd = ca.alloc_pd()
    j = Journal()
    toys = [Toy(al, j, "query"), Toy(ca, j, "mad"), Toy((ca, 1), j, "port"), Toy(pd, j, "pd")]
    al.close()  # returns after every destroy callback ran
    assert all(not t.alive for t in toys)
    for name in ("query", "mad", "port", "pd"):
        assert j.items.index(f"{name} cancelled") < j.items.index(f"{name} cleanup") \
            < j.items.index(f"{name} destroy-cb")
    assert sorted(i for i in j.items if i.endswith("destroy-cb")) == [
        "mad destroy-cb", "pd destroy-cb", "port destroy-cb", "query destroy-cb"]
    assert ci.live_kinds() == []


def test_ca_deregistration_tears_dependents_down_after_ca_remove(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    j = Journal()
    ca_toy, port_toy, pd_toy = Toy(ca, j, "ca"), Toy((ca, 1), j, "port"), Toy(pd, j, "pd")

    def pnp_cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_REMOVE:
            j.add(f"CA_REMOVE ca alive={ca_toy.alive}")

    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, pnp_cb)
    mgr.deregister_ca(ci.guid)
    assert mgr.queues.flush(WAIT)
    assert j.items[0] == "CA_REMOVE ca alive=True"
    assert {t.alive for t in (ca_toy, port_toy, pd_toy)} == {False}
    assert {"ca destroy-cb", "port destroy-cb", "pd destroy-cb"} <= set(j.items)
    assert ci.verbs()[-1] == "close_ca"


def test_port_dependents_go_when_the_port_disappears(
    mgr: AlManager, al: AccessLayer, ca: Ca, ci: FakeCi
) -> None:
    j = Journal()
    p1, p2, whole = Toy((ca, 1), j, "p1"), Toy((ca, 2), j, "p2"), Toy(ca, j, "ca")
    removed: list[int] = []

    def pnp_cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.PORT_REMOVE:
            removed.append(rec.port_attr.port_num if rec.port_attr else -1)
            j.add(f"PORT_REMOVE p2 alive={p2.alive}")

    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, pnp_cb)
    ci.attr = dataclasses.replace(ci.attr, ports=ci.attr.ports[:1])
    ci.raise_event(AsyncEvent.PORT_DOWN, port_num=2)
    assert mgr.queues.flush(WAIT)
    assert removed == [2]
    assert (p1.alive, p2.alive, whole.alive) == (True, False, True)
    assert j.items == ["PORT_REMOVE p2 alive=True", "p2 cancelled", "p2 cleanup",
                       "p2 destroy-cb"]


def test_post_callback_runs_on_misc_and_is_dropped_after_destroy(
    mgr: AlManager, al: AccessLayer
) -> None:
    j = Journal()
    toy = Toy(al, j, "toy")
    gate, release = threading.Event(), threading.Event()
    mgr.queues.misc.post(lambda: (gate.set(), release.wait(WAIT)))  # hold the misc queue
    assert gate.wait(WAIT)
    assert toy.answer("queued before destroy")
    toy.destroy()
    assert not toy.answer("posted after destroy")
    release.set()
    assert mgr.queues.flush(WAIT)
    assert toy.answers == []
    assert j.items == ["toy cancelled", "toy cleanup", "toy destroy-cb"]

    live = Toy(al, j, "live")
    threads: list[str] = []
    assert live.post_callback(lambda: threads.append(threading.current_thread().name))
    assert mgr.queues.flush(WAIT)
    assert threads == [mgr.queues.misc.name]


def test_destroy_waits_for_a_running_post_callback(mgr: AlManager, al: AccessLayer) -> None:
    j = Journal()
    toy = Toy(al, j, "toy")
    running, release = threading.Event(), threading.Event()
    errors: list[Any] = []

    def slow() -> None:
        j.add("callback")
        running.set()
        try:
            toy.destroy(wait=True)  # its own callback pins it: would wait for itself
        except InvalidState:
            errors.append(InvalidState)
        release.wait(WAIT)
        j.add("callback returned")

    toy.post_callback(slow)
    assert running.wait(WAIT)
    toy.destroy(j.cb("explicit destroy-cb"))
    release.set()
    assert mgr.queues.flush(WAIT)
    assert errors == [InvalidState]
    assert j.items == ["callback", "toy cancelled", "callback returned", "toy cleanup",
                       "explicit destroy-cb"]


def test_destroy_wait_and_twice(al: AccessLayer) -> None:
    j = Journal()
    toy = Toy(al, j, "toy")
    child = Toy(toy, j, "child")
    toy.destroy(wait=True)
    assert j.items == ["toy cancelled", "child cancelled", "child cleanup", "toy cleanup",
                       "child destroy-cb", "toy destroy-cb"]
    assert not child.alive
    with pytest.raises(InvalidHandle):
        toy.destroy()


def test_use_pins_the_object_until_the_block_ends(al: AccessLayer) -> None:
    j = Journal()
    toy = Toy(al, j, "toy")
    with toy.use():
        toy.destroy()
        assert j.items == ["toy cancelled"]  # no cleanup while a call is inside
    assert j.items == ["toy cancelled", "toy cleanup"]
    with pytest.raises(InvalidHandle), toy.use():
        pass


def test_waiting_destroy_of_a_dependent_inside_a_completion_callback(
    ca: Ca, ci: FakeCi
) -> None:
    j = Journal()
    toy = Toy(ca, j, "toy")

    def comp_cb(cq: Cq, ctx: Any) -> None:
        toy.destroy(wait=True)
        j.add("returned")

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert ca._mgr.queues.flush(WAIT)
    assert j.items == ["toy cancelled", "toy cleanup", "toy destroy-cb", "returned"]


def test_dependents_are_cancelled_before_the_qps_multicast_attachments(
    pd: Pd, cq: Cq, ci: FakeCi
) -> None:
    j = Journal()
    qp = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    qp.attach_mcast(_mgid(), 0xC001)

    class Join(Toy):
        def on_destroying(self) -> None:
            j.add(f"join cancelled, detached={'detach_mcast' in ci.verbs()}")

    Join(qp, j, "join")
    qp.destroy(wait=True)
    assert j.items[0] == "join cancelled, detached=False"
    assert "detach_mcast" in ci.verbs()


def _mgid() -> Any:
    from ibal.types import Gid

    return Gid("ff12:401b::1")


def test_destroy_async_keeps_the_creation_destroy_cb(al: AccessLayer) -> None:
    import asyncio

    j = Journal()
    toy = Toy(al, j, "toy")
    asyncio.run(toy.destroy_async())
    assert j.items == ["toy cancelled", "toy cleanup", "toy destroy-cb"]


def test_uses_objects_beside_the_owner_destroy_it_first(
    mgr: AlManager, al: AccessLayer, ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    """An AL's dependent that uses a CA handle (and one using it) dies with that handle,
    first, and the handle's destroy waits for it; the AL owns it otherwise."""
    j = Journal()
    port = Toy(al, j, "sa-port", uses=(ca,))
    sub = Toy(al, j, "subscription", uses=(port,))
    other = Toy(al, j, "unrelated")
    assert port.owner is al and sub.owner is al
    mgr.deregister_ca(ci.guid)
    assert mgr.queues.flush(WAIT)
    assert not port.alive and not sub.alive and other.alive
    assert j.items.index("sa-port cancelled") < j.items.index("subscription cancelled")
    assert j.items.index("subscription cleanup") < j.items.index("sa-port cleanup")
    assert j.items.index("subscription destroy-cb") < j.items.index("sa-port destroy-cb")
    assert ci.verbs()[-1] == "close_ca"
    with pytest.raises(InvalidHandle):
        port.check()
    with pytest.raises(InvalidHandle):  # a used object that is gone
        Toy(al, j, "late", uses=(port,))
    with pytest.raises(InvalidParameter):
        Toy(al, j, "bad", uses=(object(),))  # type: ignore[arg-type]
