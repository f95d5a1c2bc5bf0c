"""ServiceRegistration's I/O layer on the mock fabric's AL, with a stepped clock and a
scripted SA (a requester shaped like ``SaPort``: it records requests; the test answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import ibal
from ibal.al import AccessLayer, PnpClass
from ibal.clock import ManualClock
from ibal.sa.service import (
    Attempt,
    RegSvcRec,
    ServiceRecord,
    ServiceRegistration,
    service_mask,
)
from ibal.sa.txn import SaAnswer
from ibal.status import InvalidHandle, InvalidParameter, RemoteError, Status
from ibal.types import AsyncEvent, Gid
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.sa import SERVICE_RECORD

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

GID = Gid("fe80::2:c903:0:1")
SA_REQ_INVALID = 0x0200


@dataclass
class Req:
    method: int
    attr_id: int
    data: bytes
    comp_mask: int
    timeout_ms: int
    retry_cnt: int
    callback: Callable[[SaAnswer], None] | None
    cancelled: bool = False
    done: bool = False

    def cancel(self) -> None:
        if not self.done:
            self.cancelled = True
            self.answer(SaAnswer(Status.CANCELED))

    def answer(self, ans: SaAnswer) -> None:
        assert not self.done
        self.done = True
        if self.callback is not None:
            self.callback(ans)

    def ok(self, record: bytes | None = None) -> None:
        rec = self.data if record is None else record
        self.answer(SaAnswer(Status.SUCCESS, method=0x81, attr_id=SaAttr.SERVICE_RECORD,
                             records=(rec,)))  # fmt: skip


FAKES: list[FakeSa] = []


@dataclass
class FakeSa:
    """Like ``SaPort``: requests end once (answered, cancelled, or CANCELED as the AL closes)."""

    port_guid: int
    sent: list[Req] = field(default_factory=list)
    closed: int = 0

    def __post_init__(self) -> None:
        FAKES.append(self)

    def request(self, method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0, *,
                attr_mod: int = 0, timeout_ms: int = 1000, retry_cnt: int = 3,
                callback: Callable[[SaAnswer], None] | None = None) -> Req:  # fmt: skip
        r = Req(method, attr_id, bytes(data), comp_mask, timeout_ms, retry_cnt, callback)
        self.sent.append(r)
        return r

    def close(self) -> None:
        self.closed += 1

    def pending(self) -> list[Req]:
        return [r for r in self.sent if not r.done]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def al(clock: ManualClock) -> Iterator[AccessLayer]:
    al = ibal.open_al({"mock": {"cas": 1, "clock": clock}}, clock=clock)
    yield al
    for sa in FAKES:  # what the real SaPort does as its AL closes
        for r in sa.pending():
            r.cancel()
    FAKES.clear()
    al.close(timeout=30)


@pytest.fixture
def port_guid(al: AccessLayer) -> int:
    return al.query_ca_by_guid(al.get_ca_guids()[0]).ports[0].port_guid


def record(lease: int = 60) -> ServiceRecord:
    return ServiceRecord(service_id=0x1234, service_gid=GID, service_lease=lease,
                         service_name=b"svc", data8=(7,) + (0,) * 15)  # fmt: skip


def flush(al: AccessLayer) -> None:
    al.manager.queues.flush()


class Log:
    def __init__(self) -> None:
        self.recs: list[RegSvcRec] = []

    def __call__(self, rec: RegSvcRec) -> None:
        self.recs.append(rec)


def make(
    al: AccessLayer, sa: FakeSa, lease: int = 60, **kw: Any
) -> tuple[ServiceRegistration, Log]:
    log = Log()
    reg = ServiceRegistration(al, sa, record(lease), service_mask(data=("data8_0",)),
                              callback=log, context="ctx", **kw)  # fmt: skip
    return reg, log


def step(clock: ManualClock, al: AccessLayer, seconds: float) -> None:
    clock.advance(seconds, settle=al.manager.queues.flush)


def test_set_carries_the_record_and_mask_and_the_outcome_reaches_callback_and_wait(
    al: AccessLayer, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    reg, log = make(al, sa, timeout_ms=250, retry_cnt=2)
    (s,) = sa.sent
    assert (s.method, s.attr_id, s.timeout_ms, s.retry_cnt) == (Method.SET, 0x0031, 250, 2)
    assert s.data == record().encode() and len(s.data) == SERVICE_RECORD.size
    assert s.comp_mask == service_mask(data=("data8_0",))
    answered = record().encode()[:-1] + b"\x09"  # the SA's copy differs: it is what we report
    s.ok(answered)
    got = reg.wait(5)
    assert got is log.recs[0]
    assert (got.req_status, got.resp_status, got.svc_context, got.reg) == (
        Status.SUCCESS, 0, "ctx", reg)  # fmt: skip
    assert got.svc_rec == ServiceRecord.decode(answered) and got.svc_rec.name == "svc"
    assert reg.record.data64 == (0, 9)
    reg.dereg(wait=False)


def test_renewal_goes_out_at_half_the_lease_on_the_stepped_clock(
    al: AccessLayer, clock: ManualClock, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    reg, log = make(al, sa, lease=10)
    sa.sent[0].ok()
    flush(al)
    assert reg.renew_at == 5.0 and reg.expires == 10.0
    step(clock, al, 4.9)
    assert len(sa.sent) == 1
    step(clock, al, 0.1)
    assert [r.method for r in sa.sent] == [Method.SET, Method.SET]
    assert sa.sent[1].data == sa.sent[0].data
    clock.advance(0.2)
    sa.sent[1].ok()
    flush(al)
    assert reg.expires == 15.0 and len(log.recs) == 1  # a renewal that worked is quiet
    # A failed renewal is reported, then retried before the lease ends.
    step(clock, al, 4.8)
    assert len(sa.sent) == 3
    clock.advance(2.0)  # t = 12: the SA did not answer
    sa.sent[2].answer(SaAnswer(Status.TIMEOUT))
    flush(al)
    assert [(r.attempt, r.req_status, r.reg) for r in log.recs[1:]] == [
        (Attempt.RENEW, Status.TIMEOUT, reg)]  # fmt: skip
    assert reg.renew_at == 13.5  # halfway to 15
    step(clock, al, 1.5)
    assert len(sa.sent) == 4
    sa.sent[3].ok()
    flush(al)
    assert [(r.attempt, r.req_status) for r in log.recs[2:]] == [(Attempt.RENEW, Status.SUCCESS)]
    reg.dereg()
    flush(al)


def test_infinite_lease_is_never_renewed(
    al: AccessLayer, clock: ManualClock, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    reg, _ = make(al, sa, lease=0xFFFFFFFF)
    sa.sent[0].ok()
    step(clock, al, 1e6)
    assert len(sa.sent) == 1 and reg.renew_at is None and reg.expires is None
    reg.dereg()


def test_dereg_deletes_and_the_destroy_callback_waits_for_the_answer(
    al: AccessLayer, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    destroyed: list[object] = []
    reg, log = make(al, sa, destroy_cb=destroyed.append)
    sa.sent[0].ok()
    flush(al)
    reg.dereg()
    flush(al)
    (d,) = sa.pending()
    assert (d.method, d.data, d.comp_mask) == (Method.DELETE, sa.sent[0].data, sa.sent[0].comp_mask)
    assert destroyed == [] and sa.closed == 0  # the Delete is in flight
    with pytest.raises(InvalidHandle):
        reg.dereg()
    d.ok()
    flush(al)
    assert destroyed == ["ctx"] and sa.closed == 1 and reg.deleted is Status.SUCCESS
    assert reg.deleted_mad_status == 0
    assert len(log.recs) == 1


def test_dereg_while_registering_reports_canceled_before_the_destroy_callback(
    al: AccessLayer, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    order: list[str] = []
    reg = ServiceRegistration(al, sa, record(), service_mask(),
                              callback=lambda r: order.append(r.req_status.name),
                              destroy_cb=lambda c: order.append("destroyed"))  # fmt: skip
    reg.dereg()
    flush(al)
    assert sa.sent[0].cancelled
    (d,) = sa.pending()
    assert d.method == Method.DELETE
    d.answer(SaAnswer(Status.REMOTE_ERROR, mad_status=0x0300))  # NO_RECORDS: never stored
    flush(al)
    assert order == ["CANCELED", "destroyed"] and reg.deleted is Status.REMOTE_ERROR
    assert reg.deleted_mad_status == 0x0300
    with pytest.raises(ibal.status.Canceled):
        reg.wait(0)


def test_a_failed_first_set_ends_the_registration(al: AccessLayer, port_guid: int) -> None:
    sa = FakeSa(port_guid)
    destroyed: list[object] = []
    reg, log = make(al, sa, destroy_cb=destroyed.append)
    sa.sent[0].answer(SaAnswer(Status.REMOTE_ERROR, mad_status=SA_REQ_INVALID))
    flush(al)
    (rec,) = log.recs
    assert (rec.req_status, rec.resp_status, rec.reg) == (Status.REMOTE_ERROR, SA_REQ_INVALID,
                                                          None)  # fmt: skip
    with pytest.raises(RemoteError, match="0x0200"):
        reg.wait(0)
    assert not reg.alive and destroyed == ["ctx"] and len(sa.sent) == 1 and sa.closed == 1


def test_client_reregister_on_the_port_sets_the_record_again(
    al: AccessLayer, port_guid: int
) -> None:
    sa = FakeSa(port_guid)
    reg, log = make(al, sa)
    sa.sent[0].ok()
    flush(al)
    fabric = al.manager.providers[0].fabric  # type: ignore[attr-defined]
    port = next(p for ca in fabric.cas for p in ca.ports if p.guid == port_guid)
    fabric.raise_event(port, AsyncEvent.CLIENT_REREGISTER)
    flush(al)
    assert [r.method for r in sa.sent] == [Method.SET, Method.SET]
    sa.sent[1].answer(SaAnswer(Status.TIMEOUT))
    flush(al)
    assert [(r.attempt, r.req_status) for r in log.recs[1:]] == [
        (Attempt.REREGISTER, Status.TIMEOUT)]  # fmt: skip
    reg.dereg()


def test_closing_the_al_deletes_the_record(clock: ManualClock) -> None:
    al = ibal.open_al({"mock": {"cas": 1, "clock": clock}}, clock=clock)
    guid = al.query_ca_by_guid(al.get_ca_guids()[0]).ports[0].port_guid
    sa = FakeSa(guid)
    destroyed: list[object] = []
    reg, _ = make(al, sa, destroy_cb=destroyed.append)
    sa.sent[0].ok()
    flush(al)

    def answer_the_delete() -> None:  # the SA answers while close() waits
        (d,) = sa.pending()
        assert d.method == Method.DELETE
        d.ok()

    import threading

    t = threading.Timer(0.2, answer_the_delete)
    t.start()
    al.close(timeout=30)
    t.join()
    assert destroyed == ["ctx"] and not reg.alive and sa.closed == 1


def test_await_gives_the_outcome(al: AccessLayer, port_guid: int) -> None:
    sa = FakeSa(port_guid)
    reg, _ = make(al, sa)

    async def main() -> RegSvcRec:
        asyncio.get_running_loop().call_soon(sa.sent[0].ok)
        return await reg

    rec = asyncio.run(main())
    assert rec.ok and rec.reg is reg
    reg.dereg()


def test_bad_arguments_raise(al: AccessLayer, port_guid: int) -> None:
    sa = FakeSa(port_guid)
    with pytest.raises(InvalidParameter):
        ServiceRegistration(al, sa, record(), service_mask(), timeout_ms=0)
    with pytest.raises(InvalidParameter):
        ServiceRegistration(al, sa, ServiceRecord(service_name=b"x" * 65), service_mask())
    with pytest.raises(InvalidParameter):
        service_mask(data=("data8_16",))
    assert sa.closed == 2 and sa.sent == []
    assert PnpClass.PORT  # the registrations listen to PORT events


def test_service_record_round_trips() -> None:
    r = ServiceRecord(service_id=1 << 63, service_gid=GID, service_p_key=0x8001,
                      service_lease=30, service_key=bytes(range(16)), service_name=b"name",
                      data8=tuple(range(16)), data16=tuple(range(8)), data32=(1, 2, 3, 4),
                      data64=(1 << 63, 5))  # fmt: skip
    raw = r.encode()
    assert ServiceRecord.decode(raw) == r and raw[48:112].rstrip(b"\0") == b"name"


def test_gids_and_ports_that_are_not_here_raise(al: AccessLayer, port_guid: int) -> None:
    from ibal import compat
    from ibal.sa import RegSvcReq, reg_svc, register_service
    from ibal.status import InvalidAlHandle, InvalidGid, InvalidGuid, NotFound

    with pytest.raises(NotFound):  # no local CA has the GID
        register_service(al, name="x", service_id=1, gid="fe80::dead:beef")
    with pytest.raises(InvalidGid):  # the port named does not have it
        register_service(al, name="x", service_id=1, gid="fe80::dead:beef", port_guid=port_guid)
    with pytest.raises(InvalidGuid):
        register_service(al, name="x", service_id=1, port_guid=0x1234)
    with pytest.raises(InvalidParameter):
        register_service(al, name="x", service_id=1, data={"data8_16": 1})
    with pytest.raises(InvalidParameter):
        register_service(al, name="x", service_id=1, lease=0)
    with pytest.raises(NotFound):
        reg_svc(al, RegSvcReq(ServiceRecord(service_gid=GID)))
    with pytest.raises(InvalidAlHandle):
        compat.ib_reg_svc(object(), RegSvcReq(ServiceRecord()))  # type: ignore[arg-type]
    with pytest.raises(InvalidHandle):
        compat.ib_dereg_svc(object())


def test_register_service_sets_the_ports_gid_and_a_mask_of_what_was_given(
    al: AccessLayer, port_guid: int
) -> None:
    from ibal.sa import SaPort, register_service
    from ibal.wire.mad.sa import component_mask

    sa = SaPort.open(al, port_guid)
    sent: list[tuple[int, bytes, int]] = []
    real = sa.request

    def spy(method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0,
            **kw: Any) -> Any:  # fmt: skip
        sent.append((method, bytes(data), comp_mask))
        return real(method, attr_id, data, comp_mask, **kw)

    sa.request = spy  # type: ignore[method-assign]
    reg = register_service(al, name="svc", service_id=0x42, lease=30, key=b"k" * 16,
                           data={"data16_7": 9})  # fmt: skip
    gid = al.query_ca_by_guid(al.get_ca_guids()[0]).ports[0].gids[0]
    ((method, data, mask),) = sent
    r = ServiceRecord.decode(data)
    assert (method, r.service_gid, r.service_lease, r.service_key, r.data16[7]) == (
        Method.SET, gid, 30, b"k" * 16, 9)  # fmt: skip
    assert mask == component_mask(SERVICE_RECORD, [
        "service_id", "service_gid", "service_p_key", "service_name", "service_lease",
        "service_key", "service_data16_7"])  # fmt: skip
    assert reg.port_guid == port_guid
    reg.dereg()
    sa.close()


def test_ats_records_carry_the_address_at_servicedata8_12() -> None:
    from ibal.sa.ats import ATS_NAME, ATS_SERVICE_ID, ats_address, ats_query
    from ibal.wire.mad.sa import component_mask

    data, mask = ats_query("192.168.7.9")
    r = ServiceRecord.decode(data)
    assert (r.service_id, r.name, r.data8[12:16]) == (ATS_SERVICE_ID, ATS_NAME, (192, 168, 7, 9))
    assert str(ats_address(r)) == "192.168.7.9"
    assert mask == component_mask(SERVICE_RECORD, [
        "service_id", "service_name", *(f"service_data8_{i}" for i in range(16))])  # fmt: skip
    assert mask == 0x7FFFC1  # the ATS "get GID for an IP" mask of the OpenIB stack
    with pytest.raises(InvalidParameter):
        ats_query("fe80::1")


class InlineSa(FakeSa):
    """Answers inside ``request`` on the caller's thread (as SaPort does for a port that
    is closing): the registration must queue the answer behind the event that sent it."""

    def request(self, method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0, *,
                attr_mod: int = 0, timeout_ms: int = 1000, retry_cnt: int = 3,
                callback: Callable[[SaAnswer], None] | None = None) -> Req:  # fmt: skip
        r = super().request(method, attr_id, data, comp_mask, timeout_ms=timeout_ms,
                            retry_cnt=retry_cnt, callback=callback)  # fmt: skip
        r.ok()
        return r


def test_answers_delivered_inside_request_are_handled_in_order(
    al: AccessLayer, clock: ManualClock, port_guid: int
) -> None:
    sa = InlineSa(port_guid)
    destroyed: list[object] = []
    reg, log = make(al, sa, lease=10, destroy_cb=destroyed.append)
    assert reg.wait(5).ok and reg.renew_at == 5.0
    step(clock, al, 5.0)
    assert [r.method for r in sa.sent] == [Method.SET, Method.SET] and reg.renew_at == 10.0
    reg.dereg(wait=True, timeout=10)
    assert [r.method for r in sa.sent][-1] == Method.DELETE and destroyed == ["ctx"]
    assert reg.deleted is Status.SUCCESS and len(log.recs) == 1


def test_blocking_waits_refuse_the_al_threads(al: AccessLayer, port_guid: int) -> None:
    from ibal.status import InvalidState

    sa = FakeSa(port_guid)
    reg, _ = make(al, sa)
    errors: list[type[BaseException]] = []

    def on_misc() -> None:
        for call in (lambda: reg.wait(1), lambda: reg.dereg(wait=True)):
            try:
                call()
            except Exception as exc:
                errors.append(type(exc))

    al.manager.queues.misc.post(on_misc)
    flush(al)
    assert errors == [InvalidState, InvalidState] and reg.alive
    sa.sent[0].ok()
    assert reg.wait(5).ok
    reg.dereg()
