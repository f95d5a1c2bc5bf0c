"""Delayed CM MADs on the mock fabric (stepped clock), what a callback sees of the outcome,
and a thousand connections set up and torn down that leave no endpoint, QP or timer."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from cm_world import WAIT, CmWorld, cm_world, is_cm, path

from ibal.cm import Connection, ConnectionRejected, connect, listen
from ibal.cm.fsm import CmState
from ibal.cm.service import agent_of
from ibal.status import Timeout
from ibal.types import QpState
from ibal.wire.mad.cm import RejReason

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = 0x78
FAST = {"remote_resp_timeout": 16, "max_cm_retries": 3}  # 2.3 s a try (life 18), 4 tries


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world(seed=5)


def assert_nothing_left(world: CmWorld, qps_before: int) -> None:
    agent = agent_of(world.mgr)
    assert agent.endpoints == 0 and agent.armed_timers() == 0
    assert sum(len(c.qps) for c in world.fabric.cas) == qps_before


def test_the_callback_sees_success_and_failure(world: CmWorld) -> None:
    """``conn.established.done`` and ``conn.error`` are set when the callback runs."""
    seen: list[tuple[bool, BaseException | None]] = []

    def cb(c: Connection) -> None:
        seen.append((c.established.done, c.error))

    lst = listen(world.a.al, SVC)
    ok = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=cb)
    lst.get(WAIT).accept(world.a.qp())
    ok.wait(WAIT)
    refused = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=cb)
    lst.get(WAIT).reject(RejReason.CONSUMER_DEFINED)
    world.settle()
    assert seen[0] == (True, None)
    done, err = seen[1]
    assert done and isinstance(err, ConnectionRejected)
    assert err.reason == RejReason.CONSUMER_DEFINED and refused.error is err
    lst.close()


def test_mads_delayed_past_one_try_still_connect(world: CmWorld) -> None:
    """Every CM MAD 1.5 s late (a try waits 2.3 s): the REQ is resent before the REP
    arrives, the duplicate REQ is answered again, the duplicate REP dropped; both sides
    end ESTABLISHED, and after the disconnect nothing is left."""
    qps_before = sum(len(c.qps) for c in world.fabric.cas)
    rule = world.fabric.faults.delay(1.5, predicate=is_cm)
    lst = listen(world.a.al, SVC)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=lambda c: None,
                 **FAST)  # type: ignore[arg-type]  # fmt: skip
    world.step(1.51)
    ca = lst.get(WAIT).accept(world.a.qp(), callback=lambda c: None)
    world.step(6.0)
    assert cb.established.done and cb.error is None and ca.established.done and ca.error is None
    assert cb.state is CmState.ESTABLISHED and ca.state is CmState.ESTABLISHED
    assert cb.qp is not None and cb.qp.state is QpState.RTS
    assert rule.fired > 3  # REQ, REP, RTU and at least one resent REQ
    cb.disconnect(wait=False)
    world.step(4.0)
    assert cb.closed.done and ca.closed.done
    lst.close()
    assert cb.qp is not None and ca.qp is not None
    cb.qp.destroy(wait=True)
    ca.qp.destroy(wait=True)
    world.step(60.0)  # timewait
    assert_nothing_left(world, qps_before)


def test_mads_delayed_past_every_try_fail_with_timeout_on_both_sides(world: CmWorld) -> None:
    """Every CM MAD 5 s late, four tries of 2.3 s: the client's callback gets ``Timeout``
    (REJ TIMEOUT sent); the server, whose REQ came late, accepts and its REP's tries end
    before that REJ (5 s late too) arrives: its callback gets ``Timeout`` as well."""
    qps_before = sum(len(c.qps) for c in world.fabric.cas)
    world.fabric.faults.delay(5.0, predicate=is_cm)
    lst = listen(world.a.al, SVC)
    seen: list[BaseException | None] = []
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC,
                 callback=lambda c: seen.append(c.error), **FAST)  # type: ignore[arg-type]  # fmt: skip
    world.step(5.01)
    ca = lst.get(WAIT).accept(world.a.qp(), callback=lambda c: None)  # the first REQ, 5 s late
    assert seen == []
    world.step(4.3)
    assert len(seen) == 1 and isinstance(seen[0], Timeout) and cb.closed.done
    world.step(30.0)
    assert isinstance(ca.error, Timeout) and ca.closed.done
    lst.close()
    for q in (cb.qp, ca.qp):
        assert q is not None
        q.destroy(wait=True)
    with pytest.raises(Timeout):
        lst.get(0)  # the resent REQs were duplicates of the first, not new requests
    world.step(60.0)
    assert_nothing_left(world, qps_before)


def test_a_thousand_connections_leave_nothing(world: CmWorld) -> None:
    """1,000 connections set up, used for nothing, torn down, their QPs destroyed: no
    endpoint, timer, QP (provider side) or connection object survives."""
    qps_before = sum(len(c.qps) for c in world.fabric.cas)
    timers_before = len(world.mgr.timers)
    lst = listen(world.a.al, SVC)
    pr = path(world.b, world.a)
    handles: list[weakref.ref[object]] = []
    for _ in range(1000):
        qa, qb = world.a.qp(), world.b.qp()
        cb = connect(world.b.al, qb, pr, SVC, callback=lambda c: None)
        ca = lst.get(WAIT).accept(qa, callback=lambda c: None)
        cb.wait(WAIT)
        ca.wait(WAIT)
        cb.disconnect(timeout=WAIT)
        ca.wait_closed(WAIT)
        handles += [weakref.ref(cb.handle), weakref.ref(ca.handle)]
        qa.destroy(wait=True)
        qb.destroy(wait=True)
    lst.close()
    world.step(60.0)  # every timewait ends
    del cb, ca
    gc.collect()
    assert_nothing_left(world, qps_before)
    assert len(world.mgr.timers) == timers_before
    assert [h for h in handles if h() is not None] == []
    agent = agent_of(world.mgr)
    assert [k for k in agent.stats if k.startswith("dropped")] == []
