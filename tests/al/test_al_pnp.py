"""PnP: replay, REG_COMPLETE, FIFO add / reverse remove, port changes, contexts, the fence."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AccessLayer, AlManager, PnpClass, PnpEvent, PnpRec, PnpRegistration
from ibal.al.pnp import PnpEventBit
from ibal.status import InvalidHandle, InvalidParameter, Status
from ibal.types import AsyncEvent, AsyncEventRec, LinkState

WAIT = 10.0
E = PnpEvent


class Log:
    """Every PnP callback, as (tag, event, guid, context seen)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, PnpEvent, int, Any]] = []
        self.cond = threading.Condition()

    def cb(self, tag: str, result: Any = None, store: Any = None) -> Any:
        def record(rec: PnpRec) -> Any:
            with self.cond:
                self.items.append((tag, rec.event, rec.guid, rec.context))
                self.cond.notify_all()
            if store is not None:
                rec.context = store
            return result(rec) if callable(result) else result

        return record

    def wait_for(self, pred: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.items), WAIT), self.items

    def events(self, tag: str | None = None) -> list[tuple[PnpEvent, int]]:
        with self.cond:
            return [(e, g) for t, e, g, _ in self.items if tag is None or t == tag]


def _sync(mgr: AlManager) -> None:
    assert mgr.dispatcher.flush(WAIT)


def test_values_are_ibals() -> None:
    assert (E.CA_ADD, E.PORT_ACTIVE, E.IOC_PATH_REMOVE, E.REG_COMPLETE) == (
        0x1001, 0x20002, 0x2808, 0x80000000)
    assert E.PORT_DOWN == PnpClass.PORT | PnpEventBit.DOWN
    assert PnpClass.FLAG_REG_SYNC == 0x40000000


def test_ca_class_replays_then_reg_complete(mgr: AlManager, al: AccessLayer,
                                            provider: FakeProvider) -> None:
    log = Log()
    reg = al.reg_pnp(PnpClass.CA, log.cb("r"), context="pnp-ctx")
    log.wait_for(lambda items: len(items) == 3)
    assert log.events() == [(E.CA_ADD, provider.cis[0].guid), (E.CA_ADD, provider.cis[1].guid),
                            (E.REG_COMPLETE, 0)]
    assert reg.context == "pnp-ctx"


def test_port_class_replays_each_port_with_its_state(mgr: AlManager, al: AccessLayer,
                                                     provider: FakeProvider) -> None:
    provider.cis[1].set_port_state(2, LinkState.DOWN)
    _sync(mgr)
    log = Log()
    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log.cb("r"))
    a, b = provider.cis
    assert log.events() == [
        (E.PORT_ADD, a.guid + 1), (E.PORT_ACTIVE, a.guid + 1),
        (E.PORT_ADD, a.guid + 2), (E.PORT_ACTIVE, a.guid + 2),
        (E.PORT_ADD, b.guid + 1), (E.PORT_ACTIVE, b.guid + 1),
        (E.PORT_ADD, b.guid + 2), (E.PORT_DOWN, b.guid + 2),
        (E.REG_COMPLETE, 0),
    ]


def test_record_fields(al: AccessLayer, ci: FakeCi) -> None:
    recs: list[PnpRec] = []
    reg = al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, recs.append, context=7)
    first = recs[0]
    assert first.registration is reg  # IBAL: h_pnp is the handle reg_pnp returns
    assert (first.pnp_context, first.ca_guid, first.guid) == (7, ci.guid, ci.guid + 1)
    assert first.ca_attr is not None and first.port_attr is not None
    assert first.port_attr.port_num == 1


def test_add_in_registration_order_remove_in_reverse(mgr: AlManager, al: AccessLayer) -> None:
    log = Log()
    regs = [al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log.cb(t)) for t in "abc"]
    port = al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log.cb("p"))
    log.items.clear()
    hot = FakeCi(0x5000, "hot", ports=1)
    mgr.register_ca(hot)
    mgr.deregister_ca(hot.guid)
    _sync(mgr)
    assert [(t, e) for t, e, _, _ in log.items] == [
        ("a", E.CA_ADD), ("b", E.CA_ADD), ("c", E.CA_ADD),
        ("p", E.PORT_ADD), ("p", E.PORT_ACTIVE),
        ("p", E.PORT_REMOVE),  # the CA's ports go before the CA
        ("c", E.CA_REMOVE), ("b", E.CA_REMOVE), ("a", E.CA_REMOVE),
    ]
    del regs, port


def test_port_events_feed_pnp_and_ca_event_callbacks(mgr: AlManager, al: AccessLayer,
                                                      ci: FakeCi) -> None:
    log = Log()
    ca_events: list[AsyncEventRec] = []
    al.open_ca(ci.guid, event_cb=ca_events.append)
    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log.cb("p"))
    log.items.clear()
    for port, state in ((1, LinkState.DOWN), (1, LinkState.ACTIVE), (2, LinkState.INIT)):
        ci.set_port_state(port, state)
        _sync(mgr)
        _sync(mgr)  # port changes queue their PnP events behind the routing task; one by
        # one, else the newer state of port 1 may replace the older (flaps coalesce)
    assert log.events() == [(E.PORT_DOWN, ci.guid + 1), (E.PORT_ACTIVE, ci.guid + 1),
                            (E.PORT_INIT, ci.guid + 2)]
    assert [(r.code, r.port_num) for r in ca_events] == [
        (AsyncEvent.PORT_DOWN, 1), (AsyncEvent.PORT_ACTIVE, 1), (AsyncEvent.PORT_DOWN, 2)]


def test_device_context_persists_until_removal(mgr: AlManager, al: AccessLayer) -> None:
    log = Log()
    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log.cb("p", store="mine"))
    hot = FakeCi(0x6000, "hot", ports=1)
    log.items.clear()
    mgr.register_ca(hot)
    _sync(mgr)  # else the ACTIVE of the add and the DOWN below coalesce into one DOWN
    hot.set_port_state(1, LinkState.DOWN)
    _sync(mgr)
    _sync(mgr)
    mgr.deregister_ca(hot.guid)
    mgr.register_ca(hot)
    _sync(mgr)
    seen = [(e, ctx) for _, e, _, ctx in log.items]
    assert seen == [
        (E.PORT_ADD, None), (E.PORT_ACTIVE, "mine"), (E.PORT_DOWN, "mine"),
        (E.PORT_REMOVE, "mine"),
        (E.PORT_ADD, None), (E.PORT_DOWN, "mine"),  # a new device starts afresh (still down)
    ]
    mgr.deregister_ca(hot.guid)


def test_rejecting_a_device_stops_its_events(mgr: AlManager, al: AccessLayer) -> None:
    log = Log()
    hot = FakeCi(0x7000, "hot", ports=1)

    def verdict(rec: PnpRec) -> Any:
        return Status.INSUFFICIENT_RESOURCES if rec.ca_guid == hot.guid else Status.SUCCESS

    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log.cb("p", result=verdict))
    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log.cb("c", result=False))
    log.items.clear()
    mgr.register_ca(hot)
    _sync(mgr)  # else the ACTIVE of the add and the DOWN below coalesce into one DOWN
    hot.set_port_state(1, LinkState.DOWN)
    _sync(mgr)
    _sync(mgr)
    mgr.deregister_ca(hot.guid)
    _sync(mgr)
    # One callback per device, then silence: no PORT_ACTIVE/DOWN/REMOVE, no CA_REMOVE.
    assert [(t, e) for t, e, _, _ in log.items] == [("c", E.CA_ADD), ("p", E.PORT_ADD)]


def test_dereg_is_a_fence(mgr: AlManager, al: AccessLayer, ci: FakeCi) -> None:
    running, release = threading.Event(), threading.Event()
    order: list[str] = []

    def cb(rec: PnpRec) -> None:
        if rec.event is E.PORT_DOWN:
            running.set()
            assert release.wait(WAIT)
            order.append("callback returned")

    reg = al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, cb)
    marked = threading.Event()
    real_mark = reg._mark

    def mark(*args: Any) -> Any:
        out = real_mark(*args)
        marked.set()
        return out

    reg._mark = mark  # type: ignore[method-assign]
    ci.set_port_state(1, LinkState.DOWN)
    assert running.wait(WAIT)

    def dereg() -> None:
        reg.dereg()
        order.append("dereg returned")

    t = threading.Thread(target=dereg)
    t.start()
    assert marked.wait(WAIT)  # dereg is under way while the callback still runs
    release.set()
    t.join(WAIT)
    assert order == ["callback returned", "dereg returned"]
    ci.set_port_state(1, LinkState.ACTIVE)
    _sync(mgr)
    _sync(mgr)
    assert order == ["callback returned", "dereg returned"]  # nothing after the fence
    with pytest.raises(InvalidHandle):
        reg.dereg()


def test_dereg_from_its_own_callback_and_destroy_cb(mgr: AlManager, al: AccessLayer) -> None:
    calls: list[str] = []
    done = threading.Event()
    holder: list[PnpRegistration] = []

    def cb(rec: PnpRec) -> None:
        calls.append(rec.event.name)
        if rec.event is E.CA_ADD and holder:
            holder[0].dereg(lambda ctx: (calls.append(f"destroyed {ctx}"), done.set()))

    holder.append(al.reg_pnp(PnpClass.CA, cb, context="x"))
    assert done.wait(WAIT)
    _sync(mgr)
    assert calls[-1] == "destroyed x"
    assert "REG_COMPLETE" not in calls  # dropped: the registration was destroying


@pytest.mark.parametrize(
    "bad", [0, PnpClass.CA | PnpClass.PORT, 0x100, 0x20000000, 0x20000001, "CA", -1, True]
)
def test_bad_classes_are_refused(al: AccessLayer, bad: Any) -> None:
    with pytest.raises(InvalidParameter):
        al.reg_pnp(bad, lambda rec: None)


def test_callback_must_be_callable(al: AccessLayer) -> None:
    with pytest.raises(InvalidParameter):
        al.reg_pnp(PnpClass.CA, None)  # type: ignore[arg-type]


def test_iou_and_ioc_classes_with_no_io_devices_get_only_reg_complete(al: AccessLayer) -> None:
    recs: list[PnpRec] = []
    al.reg_pnp(PnpClass.IOC | PnpClass.FLAG_REG_SYNC, recs.append)
    al.reg_pnp(PnpClass.IOU | PnpClass.FLAG_REG_SYNC, recs.append)
    assert [r.event for r in recs] == [E.REG_COMPLETE, E.REG_COMPLETE]


def test_close_al_ends_its_registrations(mgr: AlManager, ci: FakeCi) -> None:
    al = mgr.open_al()
    log = Log()
    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log.cb("r"))
    al.close()
    n = len(log.items)
    mgr.register_ca(FakeCi(0x8000, "late"))
    _sync(mgr)
    assert len(log.items) == n
