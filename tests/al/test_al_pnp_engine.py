"""PnP engine: flap coalescing, callback exceptions, asynchronous dereg and its fence."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from al_fakes import FakeCi

from ibal.al import AccessLayer, AlManager, PnpClass, PnpEvent, PnpRec, PnpRegistration, pnp_engine
from ibal.status import InvalidHandle
from ibal.types import LinkState

WAIT = 10.0
E = PnpEvent
SYNC = PnpClass.FLAG_REG_SYNC


def _sync(mgr: AlManager) -> None:
    assert mgr.queues.flush(WAIT)
    assert mgr.queues.flush(WAIT)  # port changes post their PnP events from the misc queue


def test_a_blocked_client_sees_the_latest_state_not_every_flap(mgr: AlManager, al: AccessLayer,
                                                               ci: FakeCi) -> None:
    blocked, release = threading.Event(), threading.Event()
    seen: list[tuple[PnpEvent, LinkState | None]] = []

    def slow(rec: PnpRec) -> None:
        seen.append((rec.event, rec.port_attr.link_state if rec.port_attr else None))
        if rec.event is E.PORT_DOWN and not blocked.is_set():
            blocked.set()
            assert release.wait(WAIT)

    other: list[PnpEvent] = []
    al.reg_pnp(PnpClass.PORT | SYNC, slow)
    al.reg_pnp(PnpClass.PORT | SYNC, lambda rec: other.append(rec.event))
    seen.clear()
    other.clear()
    before = mgr.pnp_coalesced
    ci.set_port_state(1, LinkState.DOWN)
    assert blocked.wait(WAIT)  # the PnP thread is inside the slow client
    for _ in range(1000):
        ci.set_port_state(1, LinkState.ACTIVE)
        ci.set_port_state(1, LinkState.DOWN)
    ci.set_port_state(1, LinkState.ACTIVE)
    assert mgr.queues.misc.flush(WAIT)  # every flap reached the PnP engine
    release.set()
    _sync(mgr)
    # 2001 state changes after the one being delivered: the latest reaches each registration
    # once; the other one's first DOWN had not started either, so the ACTIVE replaced it.
    assert seen == [(E.PORT_DOWN, LinkState.DOWN), (E.PORT_ACTIVE, LinkState.ACTIVE)]
    assert other == [E.PORT_ACTIVE]
    assert mgr.pnp_coalesced - before == 2000 + 2001


def test_coalescing_keeps_add_remove_order(mgr: AlManager, al: AccessLayer) -> None:
    seen: list[tuple[PnpEvent, int]] = []
    reg = al.reg_pnp(PnpClass.PORT | SYNC, lambda rec: seen.append((rec.event, rec.guid)))
    seen.clear()
    release = threading.Event()
    mgr.queues.pnp.post(release.wait, WAIT)  # hold the PnP queue: nothing starts
    key = ("port", 0x77)
    with mgr._lock:
        for event, lid in [(E.PORT_DOWN, 1), (E.LID_CHANGE, 2), (E.PORT_ACTIVE, 3),
                           (E.LID_CHANGE, 4), (E.PORT_REMOVE, 5), (E.PORT_ADD, 6),
                           (E.PORT_ACTIVE, 7), (E.PORT_DOWN, 8)]:
            pnp_engine.post(reg, event, key, guid=lid)
    release.set()
    _sync(mgr)
    # Before the REMOVE: the latest state after the latest LID (each once, newest last);
    # the new port's states never move before its ADD.
    assert seen == [(E.PORT_ACTIVE, 3), (E.LID_CHANGE, 4), (E.PORT_REMOVE, 5), (E.PORT_ADD, 6),
                    (E.PORT_DOWN, 8)]


def test_an_exception_in_one_callback_is_reported_and_the_others_go_on(
        mgr: AlManager, al: AccessLayer, ci: FakeCi, caplog: pytest.LogCaptureFixture) -> None:
    got: dict[str, list[PnpEvent]] = {"a": [], "b": [], "c": []}

    def make(tag: str) -> Any:
        def cb(rec: PnpRec) -> None:
            got[tag].append(rec.event)
            if tag == "b" and rec.event is not E.REG_COMPLETE:
                raise RuntimeError("client bug")

        return cb

    before = mgr.pnp_callback_errors
    regs = [al.reg_pnp(PnpClass.PORT | SYNC, make(t)) for t in "abc"]
    with caplog.at_level(logging.ERROR, logger="ibal"):
        ci.set_port_state(1, LinkState.DOWN)
        _sync(mgr)
        ci.set_port_state(1, LinkState.ACTIVE)
        _sync(mgr)
    assert got["a"][-2:] == got["b"][-2:] == got["c"][-2:] == [E.PORT_DOWN, E.PORT_ACTIVE]
    assert mgr.pnp_callback_errors - before == 2 * 2 * 2 + 2  # 2 CAs x 2 ports x (ADD, state)
    report = [r for r in caplog.records if "PORT_DOWN" in r.getMessage()]
    assert len(report) == 1 and repr(regs[1]) in report[0].getMessage()
    assert report[0].exc_info is not None and "client bug" in str(report[0].exc_info[1])


def test_dereg_with_destroy_cb_returns_at_once_and_the_cb_is_the_fence(
        mgr: AlManager, al: AccessLayer, ci: FakeCi) -> None:
    running, release = threading.Event(), threading.Event()
    order: list[str] = []

    def cb(rec: PnpRec) -> None:
        if rec.event is E.PORT_DOWN:
            running.set()
            assert release.wait(WAIT)
            order.append("callback returned")

    reg = al.reg_pnp(PnpClass.PORT | SYNC, cb, context="ctx")
    ci.set_port_state(1, LinkState.DOWN)
    assert running.wait(WAIT)
    destroyed = threading.Event()
    reg.dereg(lambda ctx: (order.append(f"destroyed {ctx}"), destroyed.set()))
    order.append("dereg returned")  # while the callback still runs: asynchronous
    with pytest.raises(InvalidHandle):
        reg.dereg()
    release.set()
    assert destroyed.wait(WAIT)
    ci.set_port_state(1, LinkState.ACTIVE)
    _sync(mgr)
    assert order == ["dereg returned", "callback returned", "destroyed ctx"]


def test_dereg_from_another_registrations_callback(mgr: AlManager, al: AccessLayer,
                                                   ci: FakeCi) -> None:
    victim_seen: list[PnpEvent] = []
    victim = al.reg_pnp(PnpClass.PORT | SYNC, lambda rec: victim_seen.append(rec.event))
    destroyed = threading.Event()

    def killer(rec: PnpRec) -> None:
        if rec.event is E.PORT_DOWN:
            victim.dereg(lambda ctx: destroyed.set())

    from ibal.al import PnpOrder

    al.reg_pnp(PnpClass.PORT | SYNC, killer, order=PnpOrder.MAD)  # runs before the victim
    victim_seen.clear()
    ci.set_port_state(1, LinkState.DOWN)
    assert destroyed.wait(WAIT)
    _sync(mgr)
    assert victim_seen == []  # its PORT_DOWN was queued, then dropped by the dereg


def test_dereg_without_cb_from_a_misc_callback_is_a_fence(mgr: AlManager, al: AccessLayer,
                                                          ci: FakeCi) -> None:
    seen: list[PnpEvent] = []
    reg = al.reg_pnp(PnpClass.PORT | SYNC, lambda rec: seen.append(rec.event))
    done = threading.Event()
    n: list[int] = []

    def on_misc() -> None:
        reg.dereg()
        n.append(len(seen))
        done.set()

    ci.set_port_state(1, LinkState.DOWN)
    mgr.queues.misc.post(on_misc)
    assert done.wait(WAIT)
    ci.set_port_state(1, LinkState.ACTIVE)
    _sync(mgr)
    assert len(seen) == n[0]


def test_destroy_async(mgr: AlManager, al: AccessLayer, ci: FakeCi) -> None:
    seen: list[PnpEvent] = []
    reg: PnpRegistration = al.reg_pnp(PnpClass.PORT | SYNC, lambda rec: seen.append(rec.event))
    asyncio.run(reg.destroy_async())
    n = len(seen)
    ci.set_port_state(1, LinkState.DOWN)
    _sync(mgr)
    assert len(seen) == n
    with pytest.raises(InvalidHandle):
        reg.dereg()


def test_dereg_races_with_events_from_many_threads(mgr: AlManager, al: AccessLayer,
                                                   ci: FakeCi) -> None:
    after: list[str] = []
    regs: list[PnpRegistration] = []
    fenced = threading.Event()

    def cb(rec: PnpRec) -> None:
        if fenced.is_set() and rec.registration in regs:
            after.append(rec.event.name)

    regs.extend(al.reg_pnp(PnpClass.PORT, cb) for _ in range(8))

    def flapper() -> None:
        for i in range(200):
            ci.set_port_state(2, LinkState.DOWN if i % 2 == 0 else LinkState.ACTIVE)

    t = threading.Thread(target=flapper)
    t.start()
    threads = [threading.Thread(target=r.dereg) for r in regs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    fenced.set()  # every dereg returned: none of their callbacks may run from here on
    t.join(WAIT)
    _sync(mgr)
    assert after == []
