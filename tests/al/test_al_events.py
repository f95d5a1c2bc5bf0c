"""Upcall routing: completions and async events reach the right object, on the dispatcher."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from al_fakes import FakeCi

from ibal.al import AccessLayer, AlManager, Ca, Cq, Pd, QpCreate, in_callback
from ibal.status import InvalidParameter, InvalidQpHandle
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AsyncEventRec,
    AvAttr,
    Mtu,
    QpMod,
    QpState,
    QpType,
    SendWr,
    SrqAttr,
    Wc,
    WcType,
)

WAIT = 10.0


class Recorder:
    """Collects callback calls with the thread they ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[int] = set()
        self.cond = threading.Condition()

    def cb(self, name: str) -> Any:
        def record(*args: Any) -> None:
            with self.cond:
                self.calls.append((name, args))
                self.threads.add(threading.get_ident())
                assert in_callback()
                self.cond.notify_all()

        return record

    def wait(self, n: int) -> list[tuple[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, WAIT), self.calls
            return list(self.calls)


def _rts(qp: Any) -> None:
    qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=1, access=AccessFlags.LOCAL_WRITE))
    qp.modify(QpMod(QpState.RTR, primary_av=AvAttr(port_num=1, dlid=2), path_mtu=Mtu.MTU_1024,
                    dest_qp=9, rq_psn=0, resp_res=1, rnr_nak_timeout=1))
    qp.modify(QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=1, retry_cnt=1, rnr_retry_cnt=1,
                    init_depth=1))


def test_completion_from_inside_post_send_runs_on_the_dispatcher(ca: Ca, pd: Pd) -> None:
    rec = Recorder()
    cq = ca.create_cq(16, comp_cb=rec.cb("comp"), context="cq-ctx")
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
    _rts(qp)
    cq.rearm()
    qp.post_send(SendWr(wr_id=1))  # the fake upcalls from inside post_send
    calls = rec.wait(1)
    assert calls == [("comp", (cq, "cq-ctx"))]
    assert threading.get_ident() not in rec.threads
    assert [w.wr_id for w in cq.poll()] == [1]


def test_rearm_semantics_are_the_providers(ca: Ca, ci: FakeCi) -> None:
    rec = Recorder()
    cq = ca.create_cq(16, comp_cb=rec.cb("comp"))
    ci.complete(cq._h, Wc(1, WcType.SEND))  # not armed: no callback
    cq.rearm_n(2)
    ci.complete(cq._h, Wc(2, WcType.SEND))
    ci.complete(cq._h, Wc(3, WcType.SEND))  # the second one fires
    rec.wait(1)
    assert ca._mgr.dispatcher.flush(WAIT)
    assert len(rec.calls) == 1
    assert [w.wr_id for w in cq.poll(8)] == [1, 2, 3]


def test_qp_cq_srq_events_reach_their_object_with_its_context(
    ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    rec = Recorder()
    cq = ca.create_cq(8, event_cb=rec.cb("cq"), context="cq-ctx")
    srq = pd.create_srq(SrqAttr(max_wr=4), event_cb=rec.cb("srq"), context="srq-ctx")
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=rec.cb("qp"), context="qp-ctx")
    other = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=rec.cb("other"))
    ci.qp_event(qp._h, AsyncEvent.QP_FATAL)
    ci.raise_event(AsyncEvent.CQ_ERROR, cq)
    ci.raise_event(AsyncEvent.SRQ_LIMIT_REACHED, srq)
    calls = rec.wait(3)
    assert [name for name, _ in calls] == ["qp", "cq", "srq"]
    recs: list[AsyncEventRec] = [args[0] for _, args in calls]
    assert [(r.code, r.context, r.handle) for r in recs] == [
        (AsyncEvent.QP_FATAL, "qp-ctx", qp),
        (AsyncEvent.CQ_ERROR, "cq-ctx", cq),
        (AsyncEvent.SRQ_LIMIT_REACHED, "srq-ctx", srq),
    ]
    del other


def test_ca_events_reach_every_open_ca_with_its_own_context(
    mgr: AlManager, ci: FakeCi
) -> None:
    rec = Recorder()
    al1, al2 = mgr.open_al(), mgr.open_al()
    ca1 = al1.open_ca(ci.guid, event_cb=rec.cb("ca1"), context="one")
    ca2 = al2.open_ca(ci.guid, event_cb=rec.cb("ca2"), context="two")
    ci.raise_event(AsyncEvent.LOCAL_FATAL, port_num=2)
    calls = rec.wait(2)
    got = {name: args[0] for name, args in calls}
    assert (got["ca1"].context, got["ca1"].handle, got["ca1"].port_num) == ("one", ca1, 2)
    assert (got["ca2"].context, got["ca2"].handle) == ("two", ca2)
    al1.close()
    al2.close()


def test_events_for_destroyed_objects_are_dropped(ca: Ca, pd: Pd, ci: FakeCi) -> None:
    rec = Recorder()
    cq = ca.create_cq(8)
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=rec.cb("qp"))
    h = qp._h
    ctx = h.data["ctx"]
    qp.destroy(wait=True)
    ci.raise_event(AsyncEvent.QP_FATAL, ctx)  # a late upcall for the destroyed QP
    assert ca._mgr.dispatcher.flush(WAIT)
    assert rec.calls == []


def test_no_callback_after_destroy_callback_under_a_storm(ca: Ca, ci: FakeCi) -> None:
    order: list[str] = []
    lock = threading.Lock()
    enough, done = threading.Event(), threading.Event()

    def comp(cq: Cq, ctx: Any) -> None:
        with lock:
            order.append("comp")
            if len(order) > 20:
                enough.set()
        cq.rearm()

    cq = ca.create_cq(1024, comp_cb=comp)
    cq.rearm()
    h = cq._h

    def storm() -> None:
        i = 0
        while h.alive:  # completions keep coming until the provider CQ is gone
            try:
                ci.complete(h, Wc(i, WcType.SEND))
            except Exception:
                return
            if i % 512 == 511:
                ci.poll_cq(h, 512)
            i += 1

    def destroyed(_: Any) -> None:
        with lock:
            order.append("destroy")
        done.set()

    t = threading.Thread(target=storm)
    t.start()
    try:
        assert enough.wait(WAIT)
        cq.destroy(destroyed)
        assert done.wait(WAIT)
    finally:
        t.join(WAIT)
    assert ca._mgr.dispatcher.flush(WAIT)
    assert order[-1] == "destroy"
    assert order.count("destroy") == 1


def test_unknown_event_codes_do_not_break_routing(ca: Ca, ci: FakeCi) -> None:
    rec = Recorder()
    al: AccessLayer = ca._al  # type: ignore[assignment]
    ca2 = al.open_ca(ci.guid, event_cb=rec.cb("ca"))
    from ibal.types import EventRecord

    assert ci.event_cb is not None
    ci.event_cb(EventRecord(999, ci.ca_context))  # type: ignore[arg-type]
    calls = rec.wait(1)
    assert calls[0][1][0].code is AsyncEvent.UNKNOWN
    assert calls[0][1][0].handle is ca2


def test_a_raising_callback_does_not_stop_the_dispatcher(ca: Ca, ci: FakeCi) -> None:
    rec = Recorder()

    def bad(cq: Cq, ctx: Any) -> None:
        raise RuntimeError("consumer bug")

    cq1 = ca.create_cq(8, comp_cb=bad)
    cq2 = ca.create_cq(8, comp_cb=rec.cb("good"))
    cq1.rearm()
    cq2.rearm()
    ci.complete(cq1._h, Wc(1, WcType.SEND))
    ci.complete(cq2._h, Wc(2, WcType.SEND))
    assert rec.wait(1)[0][0] == "good"


@pytest.mark.parametrize("n", [1, 3])
def test_events_before_create_returns_reach_the_new_handle(
    pd: Pd, cq: Cq, ci: FakeCi, n: int
) -> None:
    rec = Recorder()
    real = ci.create_qp

    def create_and_fire(*args: Any) -> Any:
        created = real(*args)
        for _ in range(n):
            ci.raise_event(AsyncEvent.QP_COMM, created.handle.data["ctx"])
        return created

    ci.create_qp = create_and_fire  # type: ignore[method-assign]
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=rec.cb("qp"), context="early")
    calls = rec.wait(n)
    assert all(args[0].handle is qp and args[0].context == "early" for _, args in calls)


def test_event_listeners_see_a_qps_events_before_its_event_cb(
    ca: Ca, pd: Pd, ci: FakeCi
) -> None:
    rec = Recorder()
    cq = ca.create_cq(8)
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq), event_cb=rec.cb("qp"), context="ctx")
    other = pd.create_qp(QpCreate(QpType.RC, cq, cq))
    remove_one = qp.add_event_listener(rec.cb("one"))
    remove_two = qp.add_event_listener(rec.cb("two"))
    ci.qp_event(other._h, AsyncEvent.QP_FATAL)  # not this QP's: no listener runs
    ci.qp_event(qp._h, AsyncEvent.QP_COMM)
    calls = rec.wait(3)
    assert [name for name, _ in calls] == ["one", "two", "qp"]
    assert all((a[0].code, a[0].context, a[0].handle) == (AsyncEvent.QP_COMM, "ctx", qp)
               for _, a in calls)  # fmt: skip
    remove_one()
    remove_one()  # harmless
    ci.qp_event(qp._h, AsyncEvent.QP_COMM)
    assert [name for name, _ in rec.wait(5)[3:]] == ["two", "qp"]
    remove_two()
    with pytest.raises(InvalidParameter):
        qp.add_event_listener("not callable")  # type: ignore[arg-type]
    qp.destroy(wait=True)
    with pytest.raises(InvalidQpHandle):
        qp.add_event_listener(rec.cb("late"))
