"""The access layer's timer service on a manual clock (stepped) and on real time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import ibal
from ibal.al import AlManager
from ibal.al.timer import TimerService
from ibal.clock import ManualClock, MonotonicClock
from ibal.status import InvalidParameter, InvalidState

WAIT = 10.0


class Queue:
    """A ``post`` that keeps what it is given until ``run()``: the test is the dispatcher."""

    def __init__(self) -> None:
        self.items: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.threads: set[int] = set()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.threads.add(threading.get_ident())
        self.items.append((fn, args))

    def run(self) -> None:
        items, self.items = self.items, []
        for fn, args in items:
            fn(*args)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def q() -> Queue:
    return Queue()


@pytest.fixture
def svc(clock: ManualClock, q: Queue) -> TimerService:
    return TimerService(q, clock)


def test_timers_fire_in_deadline_order_on_advance(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    fired: list[tuple[str, float]] = []

    def note(name: str) -> None:
        fired.append((name, clock.now()))

    svc.call_later(0.3, note, "c")
    svc.call_later(0.1, note, "a")
    svc.call_later(0.2, note, "b")
    svc.call_later(0.2, note, "b2")  # same deadline: arming order
    clock.advance(0.15)
    assert q.items and fired == []  # handed to post, not run by the clock
    q.run()
    assert fired == [("a", 0.15)]
    clock.advance(1.0, settle=q.run)  # settle runs callbacks at each step's time
    assert fired[1:] == [("b", 0.2), ("b2", 0.2), ("c", pytest.approx(0.3))]
    assert len(svc) == 0


def test_cancel_and_reschedule(svc: TimerService, clock: ManualClock, q: Queue) -> None:
    fired: list[str] = []
    a = svc.call_later(1.0, fired.append, "a")
    b = svc.call_later(1.0, fired.append, "b")
    assert a.due == 1.0 and a.pending
    assert a.cancel() is True
    assert a.cancel() is False and a.cancelled and a.due is None
    b.reschedule(3.0)
    assert b.due == 3.0
    clock.advance(2.0, settle=q.run)
    assert fired == []
    clock.advance(1.0, settle=q.run)
    assert fired == ["b"]
    b.reschedule(0.5)  # a fired timer can be armed again
    clock.advance(0.5, settle=q.run)
    assert fired == ["b", "b"]


def test_cancel_after_the_hand_off_still_stops_the_callback(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    fired: list[str] = []
    t = svc.call_later(0.1, fired.append, "x")
    clock.advance(0.1)
    assert len(q.items) == 1 and t.due is None  # posted, not run
    assert t.cancel() is True
    q.run()
    assert fired == []


def test_reschedule_after_the_hand_off_moves_the_run(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    fired: list[float] = []
    t = svc.call_later(0.1, lambda: fired.append(clock.now()))
    clock.advance(0.1)
    t.reschedule(0.4)
    q.run()  # the stale hand-off does nothing
    assert fired == []
    clock.advance(0.4, settle=q.run)
    assert fired == [pytest.approx(0.5)]


def test_a_callback_can_rearm_its_own_timer(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    times: list[float] = []
    holder: dict[str, Any] = {}

    def retry() -> None:
        times.append(clock.now())
        if len(times) < 4:
            holder["t"].reschedule(0.25)

    holder["t"] = svc.call_later(0.25, retry)
    clock.advance(10.0, settle=q.run)
    assert times == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert not holder["t"].pending


def test_many_timers_keep_order_and_cancelled_ones_do_not_leak(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    fired: list[int] = []
    timers = [svc.call_later((i * 7919 % 1000) / 1000.0, fired.append, i) for i in range(1000)]
    for t in timers[::2]:
        assert t.cancel()
    assert len(svc) == 500
    assert len(svc._heap) < 1000  # compacted
    clock.advance(1.0, settle=q.run)
    expected = sorted(range(1, 1000, 2), key=lambda i: (i * 7919 % 1000, i))
    assert fired == expected


def test_owner_and_scope_cancellation(svc: TimerService, clock: ManualClock, q: Queue) -> None:
    fired: list[str] = []
    owner_a, owner_b = object(), object()
    scope = svc.scope()
    svc.call_later(1, fired.append, "a1", owner=owner_a)
    scope.call_later(1, fired.append, "a2", owner=owner_a)
    scope.call_later(1, fired.append, "b", owner=owner_b)
    svc.call_later(1, fired.append, "free")
    assert svc.cancel_owner(owner_a) == 2
    assert len(scope) == 1
    assert scope.close() == 1
    with pytest.raises(InvalidState):
        scope.call_later(1, fired.append, "late")
    clock.advance(1, settle=q.run)
    assert fired == ["free"]


def test_bad_arguments_raise(svc: TimerService) -> None:
    with pytest.raises(InvalidParameter):
        svc.call_later("soon", print)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        svc.call_later(1, "not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        svc.call_later(1, print, owner=[])
    with pytest.raises(InvalidParameter):
        TimerService(print, clock=object())  # type: ignore[arg-type]


def test_closed_service_refuses_and_cancels(
    svc: TimerService, clock: ManualClock, q: Queue
) -> None:
    fired: list[str] = []
    t = svc.call_later(1, fired.append, "x")
    svc.close()
    assert t.cancelled
    with pytest.raises(InvalidState):
        svc.call_later(1, fired.append, "y")
    clock.advance(5, settle=q.run)
    assert fired == []


def test_advance_from_inside_a_listener_is_refused(clock: ManualClock) -> None:
    errors: list[BaseException] = []

    def nested(fn: Callable[..., Any], *args: Any) -> None:
        try:
            clock.advance(1)
        except RuntimeError as exc:
            errors.append(exc)

    svc = TimerService(nested, clock)
    svc.call_later(0.1, print)
    clock.advance(1)
    assert len(errors) == 1


# ---------------------------------------------------------------- the AL's service


def test_al_timers_run_on_the_misc_queue_and_die_with_the_al() -> None:
    clock = ManualClock()
    mgr = AlManager(clock=clock)
    try:
        assert mgr.clock is clock
        al = mgr.open_al()
        al2 = mgr.open_al()
        ran: list[tuple[str, bool]] = []
        al.timers.call_later(1, lambda: ran.append(("al", mgr.queues.misc.is_current())))
        al2.timers.call_later(1, lambda: ran.append(("al2", mgr.queues.misc.is_current())))
        al.timers.call_later(2, lambda: ran.append(("late", True)))
        clock.advance(1, settle=mgr.dispatcher.flush)
        assert sorted(ran) == [("al", True), ("al2", True)]
        al.close()
        assert al.timers.closed
        with pytest.raises(InvalidState):
            al.timers.call_later(1, print)
        clock.advance(5, settle=mgr.dispatcher.flush)
        assert ("late", True) not in ran
    finally:
        mgr.close(timeout=WAIT)
    assert len(mgr.timers) == 0


def test_a_dependent_objects_timers_die_with_it() -> None:
    """``Dependent.call_later``: runs while the object lives, cancelled as it starts dying
    (also when its AL closes), and never runs for a dying object."""
    from ibal.al.dependent import Dependent

    class Retry(Dependent):
        pass

    clock = ManualClock()
    mgr = AlManager(clock=clock)
    try:
        al = mgr.open_al()
        ran: list[str] = []
        a, b, c = Retry(al), Retry(al), Retry(al)
        a.call_later(1, ran.append, "a")
        ta = a.call_later(3, ran.append, "a-late")
        tb = b.call_later(2, ran.append, "b")
        tc = c.call_later(2, ran.append, "c")
        clock.advance(1, settle=mgr.queues.flush)
        assert ran == ["a"]
        b.destroy(wait=True)
        assert tb.cancelled and len(al.timers) == 2
        clock.advance(1, settle=mgr.queues.flush)
        assert ran == ["a", "c"] and not tc.pending
        al.close()
        assert ta.cancelled
        clock.advance(5, settle=mgr.queues.flush)
        assert ran == ["a", "c"]
    finally:
        mgr.close(timeout=WAIT)


def test_open_al_takes_a_clock_only_with_providers() -> None:
    with pytest.raises(InvalidParameter):
        ibal.open_al(clock=ManualClock())


def test_real_clock_timers_share_one_thread_and_fire() -> None:
    mgr = AlManager()
    try:
        assert isinstance(mgr.clock, MonotonicClock)
        al = mgr.open_al()
        done = threading.Event()
        got: list[int] = []
        threads: set[str] = set()
        on_misc: list[bool] = []

        def fire(i: int) -> None:
            threads.add(threading.current_thread().name)
            on_misc.append(mgr.queues.misc.is_current())
            got.append(i)
            if len(got) == 20:
                done.set()

        before = {t.name for t in threading.enumerate()}
        for i in range(20):
            al.timers.call_later(0.001 * (20 - i), fire, i)
        assert done.wait(WAIT)
        timer_threads = {t.name for t in threading.enumerate()} - before
        assert len([n for n in timer_threads if n.startswith("ibal-timer")]) == 1
        assert all(on_misc) and len(threads) == 1  # on the misc queue, never the timer thread
        assert not any(n.startswith("ibal-timer") for n in threads)
        assert sorted(got) == list(range(20))
        stop = al.timers.call_later(3600, fire, -1)
        al.close()
        assert stop.cancelled
    finally:
        mgr.close(timeout=WAIT)


# ------------------------------------------------------------ shared with the mock fabric

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


def test_one_advance_orders_fabric_rnr_retry_and_al_timers() -> None:
    """An RNR NAK arms the fabric's retry at +10.24 ms; AL timers at +5 ms and +20 ms
    bracket it: one ``clock.advance`` delivers all three in time order."""
    from ibal.al import Cq, QpCreate
    from ibal.testing.helpers import RcTiming, Side, connect, mr_access, send_wr
    from ibal.types import QpType, WcStatus

    clock = ManualClock()
    order: list[tuple[str, float]] = []

    def on_comp(cq: Cq, _ctx: Any) -> None:
        order.append(("completion", clock.now()))

    with ibal.open_al({"mock": {"cas": 2, "clock": clock}}, clock=clock) as al:
        mgr = al.manager
        fabric = mgr.providers[0].fabric  # type: ignore[attr-defined]
        assert fabric.shared_clock is clock
        sides = []
        for guid in al.get_ca_guids()[:2]:
            ca = al.open_ca(guid)
            pd = ca.alloc_pd()
            cq = ca.create_cq(64, comp_cb=on_comp)
            buf = bytearray(4096)
            mr = pd.reg_mem(buf, mr_access(ca.capabilities))
            qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
            sides.append(Side(ca, ca.query().ports[0], pd, cq, buf, mr, qp))
        a, b = sides
        connect(a, b, a.ca.capabilities, timing=RcTiming(rnr_nak_timeout=20))  # 10.24 ms
        a.cq.rearm()
        t0 = clock.now()
        al.timers.call_later(0.005, lambda: order.append(("al-early", clock.now())))
        al.timers.call_later(0.020, lambda: order.append(("al-late", clock.now())))
        a.put(0, b"late receiver")
        a.qp.post_send(send_wr(a, 0, 13))
        assert fabric.counters.rnr_naks == 1  # no receive yet: the fabric armed its retry
        b.recv(7, 1024)  # the receive the retry will find
        assert a.cq.poll() == []
        clock.advance(0.05, settle=mgr.dispatcher.flush)
        assert [name for name, _ in order] == ["al-early", "completion", "al-late"], (order, t0)
        assert [round(t - t0, 4) for _, t in order] == [0.005, 0.0102, 0.02]
        assert [w.status for w in a.cq.poll()] == [WcStatus.SUCCESS]
        assert [w.wr_id for w in b.cq.poll()] == [7]
        assert b.get(1024, 13) == b"late receiver"
