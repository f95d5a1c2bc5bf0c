"""``subscribe``/``ib_subscribe`` on the mock AL with a scripted SA: the Sets it gets, the
callbacks' order, reports routed by filter, unsubscribe, renewals, teardown.

The SA here is a small requester that records each request, answers when the
test says and hands the port's Reports to the listeners; the SA side itself is
proved against OpenSM in test_inform_ibsim.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ibal import compat
from ibal.al import AccessLayer, AlManager
from ibal.clock import ManualClock
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa.inform import (
    FLAGS_SYNC,
    ReportRec,
    SubRec,
    SubReq,
    Subscription,
    ib_subscribe,
    ib_unsubscribe,
    subscribe,
)
from ibal.sa.inform_fsm import InformInfo, SubPhase
from ibal.status import InvalidAlHandle, InvalidHandle, InvalidParameter, Status, Timeout
from ibal.types import AsyncEvent, EventRecord, MadAddr
from ibal.wire.mad import sa as sa_tables
from ibal.wire.mad.consts import Method, SaAttr

WAIT = 10.0
GID_A = bytes.fromhex("fe800000000000000000000000100005")
SM_GID = bytes.fromhex("fe800000000000000000000000100001")
SM = MadAddr(remote_qp=1, dlid=1)


@dataclass
class Req:
    method: int
    attr_id: int
    data: bytes
    callback: Callable[[Any], None] | None
    canceled: bool = False

    def cancel(self) -> None:
        self.canceled = True

    @property
    def info(self) -> dict[str, Any]:
        return sa_tables.INFORM_INFO.decode(self.data)


@dataclass(frozen=True)
class Answer:
    status: Status
    mad_status: int = 0
    records: tuple[bytes, ...] = ()


@dataclass
class ScriptedSa:
    """An ``SaPort``-shaped requester: records requests, answers and reports on demand."""

    port_guid: int
    requests: list[Req] = field(default_factory=list)
    listeners: dict[int, Callable[[bytes, MadAddr], object]] = field(default_factory=dict)
    closed: int = 0

    def request(self, method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0, *,
                attr_mod: int = 0, timeout_ms: int = 1000, retry_cnt: int = 3,
                callback: Callable[[Any], None] | None = None) -> Req:  # fmt: skip
        r = Req(method, attr_id, bytes(data), callback)
        self.requests.append(r)
        return r

    def answer(self, r: Req, status: Status = Status.SUCCESS, mad_status: int = 0) -> None:
        records = (r.data + bytes(4),) if status is Status.SUCCESS else ()
        assert r.callback is not None
        r.callback(Answer(status, mad_status, records))

    def add_report_listener(self, fn: Callable[[bytes, MadAddr], object]) -> Callable[[], None]:
        key = len(self.listeners) + 1000 * self.closed + id(fn)
        self.listeners[key] = fn
        return lambda: self.listeners.pop(key, None)  # type: ignore[func-returns-value]

    def report(self, notice: bytes) -> None:
        for fn in list(self.listeners.values()):
            fn(notice, SM)

    def close(self) -> None:
        self.closed += 1


def notice(trap: int, subject: bytes = GID_A) -> bytes:
    if trap in (64, 65):
        dd = sa_tables.TRAP_64_65_DETAILS.encode(gid=subject)
    else:
        dd = sa_tables.TRAP_128_DETAILS.encode(lid=2)
    return sa_tables.NOTICE.encode(
        is_generic=1, type=1 if trap == 128 else 4, producer_type=2 if trap == 128 else 4,
        trap_number=trap, issuer_lid=1 if trap != 128 else 2, data_details=dd, issuer_gid=SM_GID,
    )  # fmt: skip


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fabric = MockFabric(seed=0)
    fabric.add_ca()
    yield fabric
    fabric.close()


@pytest.fixture
def al(clock: ManualClock, fabric: MockFabric) -> Iterator[AccessLayer]:
    mgr = AlManager(clock=clock)
    mgr.add_provider(MockProvider({"fabric": fabric}))
    yield mgr.open_al()
    mgr.close(timeout=WAIT)


@pytest.fixture
def sa(al: AccessLayer) -> ScriptedSa:
    ca = al.open_ca(al.get_ca_guids()[0])
    return ScriptedSa(ca.query().ports[0].port_guid)


def flush(al: AccessLayer) -> None:
    assert al.manager.queues.flush(WAIT)


def test_subscribe_sets_informinfo_then_sub_callback_then_matching_reports(
    al: AccessLayer, sa: ScriptedSa
) -> None:
    seen: list[Any] = []
    sub = subscribe(al, 64, sa=sa, callback=seen.append, report_cb=seen.append, context="ctx",
                    report_context="rctx")  # fmt: skip
    (req,) = sa.requests
    assert (req.method, req.attr_id) == (Method.SET, SaAttr.INFORM_INFO)
    assert (req.info["subscribe"], req.info["trap_number"], req.info["is_generic"]) == (1, 64, 1)
    assert req.info["lid_range_begin"] == 0xFFFF and req.info["type"] == 0xFFFF
    sa.report(notice(64))  # before the answer: held until the sub callback ran
    sa.answer(req)
    sa.report(notice(65))  # another trap: not this subscription's
    sa.report(notice(64, subject=SM_GID))
    flush(al)
    assert seen[0] == SubRec("ctx", Status.SUCCESS, sub) and sub.wait(0) is seen[0]
    assert all(isinstance(r, ReportRec) and r.context == "rctx" for r in seen[1:])
    assert [(r.notice.trap_number, r.notice.details["gid"]) for r in seen[1:]] == [
        (64, GID_A), (64, SM_GID)]  # fmt: skip
    assert sub.phase is SubPhase.ACTIVE and sub.stats["reports"] == 2


def test_unsubscribe_stops_reports_and_destroy_callback_follows_the_sets_answer(
    al: AccessLayer, sa: ScriptedSa
) -> None:
    reports: list[ReportRec] = []
    sub = subscribe(al, 128, sa=sa, report_cb=reports.append, context="c")
    sa.answer(sa.requests[0])
    destroyed = threading.Event()
    got: list[Any] = []
    sub.unsubscribe(lambda ctx: (got.append(ctx), destroyed.set()))
    assert not sub.alive
    with pytest.raises(InvalidHandle):
        sub.unsubscribe()
    undo = sa.requests[-1]
    assert (undo.method, undo.info["subscribe"], undo.info["trap_number"]) == (Method.SET, 0, 128)
    sa.report(notice(128))  # too late: no report callback once unsubscribe was called
    flush(al)
    assert not destroyed.is_set() and reports == []
    sa.answer(undo)
    assert destroyed.wait(WAIT) and got == ["c"]
    assert sub.unsubscribe_status is Status.SUCCESS
    assert sa.listeners == {} and sa.closed == 0  # the SA port given stays the caller's


def test_a_failed_subscribe_reports_once_and_delivers_nothing(
    al: AccessLayer, sa: ScriptedSa
) -> None:
    seen: list[Any] = []
    sub = subscribe(al, sa=sa, callback=seen.append, report_cb=seen.append)
    sa.answer(sa.requests[0], Status.REMOTE_ERROR, 0x0200)
    sa.report(notice(64))
    flush(al)
    assert seen == [SubRec(None, Status.REMOTE_ERROR, sub, 0x0200)]
    assert sub.phase is SubPhase.FAILED
    sub.unsubscribe(wait=True, timeout=WAIT)  # nothing to undo: no Set goes out
    assert len(sa.requests) == 1


def test_client_reregister_renews_and_a_refused_renewal_is_retried(
    al: AccessLayer, sa: ScriptedSa, fabric: MockFabric, clock: ManualClock
) -> None:
    sub = subscribe(al, 64, sa=sa)
    sa.answer(sa.requests[0])
    flush(al)
    fabric.cas[0].inject_async_event(EventRecord(AsyncEvent.CLIENT_REREGISTER, None, 0, 1))
    flush(al)
    renew = sa.requests[-1]
    assert len(sa.requests) == 2 and renew.info["subscribe"] == 1
    sa.answer(renew, Status.TIMEOUT)
    clock.advance(0.9)
    flush(al)
    assert len(sa.requests) == 2
    clock.advance(0.2)
    flush(al)
    assert len(sa.requests) == 3
    sa.answer(sa.requests[-1])
    assert sub.renewals == 1
    sa.report(notice(64))
    assert sub.get_report(WAIT).notice.trap_number == 64  # no report_cb: kept for get_report
    with pytest.raises(Timeout):
        sub.get_report(0)


def test_closing_the_al_cancels_a_pending_subscription(al: AccessLayer, sa: ScriptedSa) -> None:
    seen: list[Any] = []
    sub = subscribe(al, 65, sa=sa, callback=seen.append)
    al.close()
    assert not sub.alive and sub.wait(0).status is Status.CANCELED
    assert seen == [] and sa.requests[0].canceled and sa.listeners == {}


def test_awaitable_outcome(al: AccessLayer, sa: ScriptedSa) -> None:
    sub = subscribe(al, 64, sa=sa)

    async def main() -> SubRec:
        loop = asyncio.get_running_loop()
        loop.call_soon(sa.answer, sa.requests[0])
        return await sub

    assert asyncio.run(main()).status is Status.SUCCESS


def test_ib_subscribe_sync_and_ib_unsubscribe(
    al: AccessLayer, sa: ScriptedSa, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ibal.sa.inform as inform

    monkeypatch.setattr(inform, "_open_sa", lambda _al, _guid: sa)
    order: list[str] = []
    answered = threading.Timer(0.05, lambda: sa.answer(sa.requests[0]))
    answered.start()
    req = SubReq(InformInfo(trap_number=64), lambda rec: order.append("report"),
                 port_guid=sa.port_guid, flags=FLAGS_SYNC, sub_context=7,
                 pfn_sub_cb=lambda rec: order.append(f"sub {rec.context} {rec.status.name}"))
    sub = compat.ib_subscribe(al, req)  # the C spelling: ibal.sa.ib_subscribe
    answered.join()
    assert order == ["sub 7 SUCCESS"] and isinstance(sub, Subscription)
    done = threading.Event()
    compat.ib_unsubscribe(sub, lambda ctx: done.set())
    sa.answer(sa.requests[-1])
    assert done.wait(WAIT) and sa.closed == 1  # the hold SaPort.open gave is dropped
    with pytest.raises(InvalidParameter):
        ib_subscribe(al, SubReq(InformInfo(), None))  # type: ignore[arg-type]
    with pytest.raises(InvalidHandle):
        ib_unsubscribe("not a subscription")  # type: ignore[arg-type]
    with pytest.raises(InvalidAlHandle):
        subscribe("not an AL", 64, sa=sa)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw",
    [{"trap": 0x10000}, {"trap": 64, "info": InformInfo()}, {"callback": 3},
     {"timeout_ms": 0}, {"retry_cnt": -1}, {"info": "x"}],
)  # fmt: skip
def test_bad_arguments_raise_invalid_parameter(
    al: AccessLayer, sa: ScriptedSa, kw: dict[str, Any]
) -> None:
    with pytest.raises(InvalidParameter):
        subscribe(al, sa=sa, **kw)
    assert sa.requests == []


def test_two_subscriptions_with_one_informinfo_share_the_sas_record(
    al: AccessLayer, sa: ScriptedSa
) -> None:
    """OpenSM keeps one record for both (test_inform_ibsim.py): the first to go leaves it,
    the last one sends Subscribe 0."""
    a = subscribe(al, 64, sa=sa)
    b = subscribe(al, 64, sa=sa)
    other = subscribe(al, 65, sa=sa)
    for r in list(sa.requests):
        sa.answer(r)
    a.unsubscribe(wait=True, timeout=WAIT)
    assert len(sa.requests) == 3 and a.unsubscribe_status is Status.SUCCESS
    sa.report(notice(64))
    assert b.get_report(WAIT).notice.trap_number == 64  # b still delivers
    b.unsubscribe()
    undo = sa.requests[-1]
    assert (len(sa.requests), undo.info["subscribe"], undo.info["trap_number"]) == (4, 0, 64)
    sa.answer(undo)
    assert other.phase is SubPhase.ACTIVE
