"""IBMF alternate QPs: a service's own UD QP (its P_Key and Q_Key), on the mock and on rxe."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from mad_world import GET, GET_RESP, SEND, VENDOR, WAIT, Inbox, Net, Side, _mock, _sides, mad

from ibal.al import AlManager
from ibal.clock import ManualClock
from ibal.mad import MadElement, MadService, put_mad
from ibal.mad.altqp import AltQp, AltQpAttr, AltQpFlags, alloc_qp
from ibal.status import (
    InvalidHandle,
    InvalidParameter,
    InvalidPkey,
    InvalidQpHandle,
    InvalidSetting,
    Unsupported,
)
from ibal.testing.helpers import wait_until
from ibal.types import DEFAULT_PKEY, MadAddr, WcStatus

QKEY, OTHER_QKEY = 0x0000_1234, 0x0000_5678


def _rxe() -> Iterator[Net]:
    if os.geteuid() != 0:
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail("rxe needs root (raw sockets) and IBAL_LAB_REQUIRED is set")
        pytest.skip("rxe needs root (raw sockets need CAP_NET_RAW)")
    from ibal.providers.rxe.provider import RxeProvider

    clock = ManualClock()
    mgr = AlManager(clock=clock)
    try:
        # A range of its own: the service tests use 127.0.9.x, the core tests 127.0.0.x.
        mgr.add_provider(RxeProvider({"devices": "rxe_q0=127.0.11.2,rxe_q1=127.0.11.3"}))
        sides = _sides(mgr, roce=True)
        assert len(sides) == 2, f"rxe registered {len(sides)} CAs (addresses in use?)"
        yield Net("rxe", mgr, clock, *sides)
    finally:
        mgr.close(timeout=WAIT)


@pytest.fixture(params=["mock", "rxe"])
def net(request: pytest.FixtureRequest) -> Iterator[Net]:
    yield from (_mock() if request.param == "mock" else _rxe())


def alt(net: Net, side: Side, *, qkey: int = QKEY, serve: bool = True
        ) -> tuple[MadService, AltQp, Inbox]:
    service, _ = net.service(side)
    inbox = Inbox()
    qp = alloc_qp(service, DEFAULT_PKEY, qkey, recv_cb=inbox.on_recv if serve else None,
                  send_cb=inbox.on_send)
    return service, qp, inbox


def to(side: Side, qp: AltQp, qkey: int = QKEY) -> MadAddr:
    grh = side.addr().grh
    return MadAddr(remote_qp=qp.query().qp_num, remote_qkey=qkey, dlid=side.port.lid, grh=grh)


def request(svc: MadService, addr: MadAddr, m: bytearray, *, timeout_ms: int = 100,
            retries: int = 0) -> MadElement:
    e = svc.pool_key.get_mad()
    e.mad[:] = m
    e.addr, e.resp_expected, e.timeout_ms, e.retry_cnt = addr, True, timeout_ms, retries
    e.context1 = "ctx"
    return e


def test_request_and_response_on_alternate_qps(net: Net) -> None:
    a_svc, a_qp, a_in = alt(net, net.a)
    b_svc, b_qp, b_in = alt(net, net.b)
    attr = a_qp.query()
    assert attr == AltQpAttr(attr.qp_num, DEFAULT_PKEY, QKEY, net.a.port.port_num)
    assert attr.qp_num > 1  # not QP0/QP1
    req = request(a_svc, to(net.b, b_qp), mad(VENDOR, GET, payload=b"question"))
    a_qp.send(req)
    assert req.tid != 0
    got = b_in.recv()
    assert bytes(got.mad) == bytes(req.mad) and got.request is None
    assert (got.qp_num, got.addr.remote_qp) == (b_qp.query().qp_num, attr.qp_num)
    got.mad[3] = GET_RESP
    got.mad[24:30] = b"answer"
    b_qp.send(got)  # the request's address is the reply's
    assert b_in.sent() is got and got.status is WcStatus.SUCCESS
    assert a_in.sent() is req and req.status is WcStatus.SUCCESS
    resp = a_in.recv()
    assert a_in.order == [("send", req), ("recv", resp)]
    assert resp.request is req and resp.send_context1 == "ctx" and resp.tid == req.tid
    assert bytes(resp.mad[24:30]) == b"answer"
    put_mad([resp, got, req])
    for svc, qp in ((a_svc, a_qp), (b_svc, b_qp)):
        qp.free()
        assert svc.pool_key.outstanding == 0
    # QP1 saw none of it
    assert net.b.alias.transport_stats == {}


def test_a_vendor_range2_service_takes_only_requests_with_its_oui(net: Net) -> None:
    cls = 0x31  # vendor range 2: the class header's OUI names the vendor
    a_svc, _ = net.service(net.a, cls)
    b_svc, _ = net.service(net.b, cls, oui=0x0002C9)
    a_in, b_in = Inbox(), Inbox()
    a_qp = alloc_qp(a_svc, DEFAULT_PKEY, QKEY, recv_cb=a_in.on_recv, send_cb=a_in.on_send)
    b_qp = alloc_qp(b_svc, DEFAULT_PKEY, QKEY, recv_cb=b_in.on_recv, send_cb=b_in.on_send)
    for low, oui in ((1, b"\x00\x14\x05"), (2, b"\x00\x02\xc9")):  # OpenIB's, then b's
        e = request(a_svc, to(net.b, b_qp), mad(cls, SEND, tid=low, payload=bytes(13) + oui))
        e.resp_expected = False
        a_qp.send(e)
        assert a_in.sent() is e and e.status is WcStatus.SUCCESS
    got = b_in.recv()
    assert got.tid & 0xFFFFFFFF == 2 and bytes(got.mad[37:40]) == b"\x00\x02\xc9"
    assert b_qp.stats["dropped_wrong_oui"] == 1 and b_in.recvs.empty()


def test_unanswered_request_times_out_after_its_retries(net: Net) -> None:
    a_svc, a_qp, a_in = alt(net, net.a)
    _b_svc, b_qp, _b_in = alt(net, net.b, serve=False)  # no recv_cb: requests dropped
    req = request(a_svc, to(net.b, b_qp), mad(VENDOR, SEND), timeout_ms=100, retries=2)
    a_qp.send(req)
    for copies in (1, 2, 3):
        wait_until(lambda c=copies: b_qp.stats["dropped_unsolicited"] == c, f"{copies} copies")
        assert a_in.sends.empty() and a_qp.outstanding == 1
        net.step(0.1)
    assert a_in.sent() is req and req.status is WcStatus.TIMEOUT_RETRY_ERR
    net.step(1.0)
    assert b_qp.stats["dropped_unsolicited"] == 3 and a_qp.outstanding == 0
    put_mad(req)


def test_a_retried_request_ends_at_the_first_answer_and_the_second_is_counted(net: Net) -> None:
    a_svc, a_qp, a_in = alt(net, net.a)
    _b_svc, b_qp, b_in = alt(net, net.b)
    req = request(a_svc, to(net.b, b_qp), mad(VENDOR, GET), timeout_ms=100, retries=2)
    a_qp.send(req)
    first = b_in.recv()
    net.step(0.1)  # no answer yet: the retry goes out
    second = b_in.recv()
    assert first.tid == second.tid == req.tid
    for copy in (first, second):
        copy.mad[3] = GET_RESP
        b_qp.send(copy)
    assert a_in.sent() is req and req.status is WcStatus.SUCCESS
    resp = a_in.recv()
    assert resp.request is req
    wait_until(lambda: a_qp.stats["dropped_unmatched_response"] == 1, "the second answer")
    net.step(1.0)  # no time-out after the answer
    assert a_in.sends.empty() and a_in.recvs.empty() and a_qp.outstanding == 0
    assert {id(b_in.sent()), id(b_in.sent())} == {id(first), id(second)}
    put_mad([resp, req, first, second])


def test_qkey_mismatch_is_dropped_until_modify_sets_that_qkey(net: Net) -> None:
    a_svc, a_qp, a_in = alt(net, net.a)
    _b_svc, b_qp, b_in = alt(net, net.b)
    before = net.b.ca.query().ports[0].qkey_violations
    lost = request(a_svc, to(net.b, b_qp, OTHER_QKEY), mad(VENDOR, SEND), timeout_ms=0)
    lost.resp_expected = False
    a_qp.send(lost)
    assert a_in.sent() is lost and lost.status is WcStatus.SUCCESS  # UD: sent is all it knows
    net.settle()
    assert b_in.recvs.empty()
    if net.kind == "mock":  # the port counts the violation (rxe drops it silently)
        assert net.b.ca.query().ports[0].qkey_violations == before + 1
    b_qp.modify(DEFAULT_PKEY, OTHER_QKEY)
    assert b_qp.query().qkey == OTHER_QKEY
    again = request(a_svc, to(net.b, b_qp, OTHER_QKEY), mad(VENDOR, SEND, tid=7), timeout_ms=0)
    again.resp_expected = False
    a_qp.send(again)
    got = b_in.recv()
    assert got.tid == 7 and got.addr is not None and got.addr.remote_qkey == OTHER_QKEY
    put_mad([got, a_in.sent(), lost])


def test_free_with_sends_pending_completes_them_canceled(net: Net) -> None:
    a_svc, a_qp, a_in = alt(net, net.a)
    _b_svc, b_qp, _b_in = alt(net, net.b, serve=False)
    reqs = [request(a_svc, to(net.b, b_qp), mad(VENDOR, GET, tid=i + 1), timeout_ms=100,
                    retries=5) for i in range(3)]
    for r in reqs:
        a_qp.send(r)
    net.settle()
    a_qp.free()
    assert [a_in.sent() for _ in reqs] == reqs
    assert {r.status for r in reqs} == {WcStatus.CANCELED}
    net.step(1.0)  # no retry goes out after the free
    assert a_in.sends.empty()
    with pytest.raises(InvalidQpHandle):
        a_qp.send(reqs[0])
    with pytest.raises(InvalidQpHandle):
        a_qp.query()
    with pytest.raises(InvalidQpHandle):
        a_qp.free()
    put_mad(reqs)


def test_alloc_and_send_refusals(mock_net: Net) -> None:
    net = mock_net
    svc, _ = net.service(net.a)
    with pytest.raises(InvalidSetting):
        alloc_qp(svc, DEFAULT_PKEY, QKEY, AltQpFlags.MAD_NO_RMPP | AltQpFlags.MAD_RMPP)
    with pytest.raises(InvalidSetting):
        alloc_qp(svc, DEFAULT_PKEY, QKEY, AltQpFlags(0))
    for flags in (AltQpFlags.MAD_RMPP, AltQpFlags.RAW_ONLY):
        with pytest.raises(Unsupported):
            alloc_qp(svc, DEFAULT_PKEY, QKEY, flags)
    with pytest.raises(InvalidPkey):
        alloc_qp(svc, 0x8123, QKEY)
    with pytest.raises(InvalidParameter):
        alloc_qp(svc, DEFAULT_PKEY, 1 << 32)
    with pytest.raises(InvalidHandle):
        alloc_qp(object(), DEFAULT_PKEY, QKEY)  # type: ignore[arg-type]
    qp = alloc_qp(svc, DEFAULT_PKEY, QKEY)
    e = svc.pool_key.get_mad()
    with pytest.raises(InvalidParameter):  # no address
        qp.send(e)
    e.addr, e.resp_expected = MadAddr(remote_qp=qp.query().qp_num, remote_qkey=QKEY), True
    with pytest.raises(InvalidParameter):  # waits for an answer without a time-out
        qp.send(e)
    with pytest.raises(InvalidPkey):
        qp.modify(0x8123, QKEY)
    qp.free()
    put_mad(e)
    svc.deregister(wait=True)
    with pytest.raises(InvalidHandle):
        alloc_qp(svc, DEFAULT_PKEY, QKEY)


def test_modify_to_another_pkey_changes_the_partition() -> None:
    """A new P_Key takes the QP through RESET; a peer in another partition is not heard."""
    from ibal.providers.mock import MockFabric, MockProvider

    clock = ManualClock()
    fabric = MockFabric(seed=0)
    for _ in range(2):
        fabric.add_ca(pkeys=[0x8001])
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        net = Net("mock", mgr, clock, *_sides(mgr, roce=False), fabric)
        a_svc, a_qp, a_in = alt(net, net.a)
        _b_svc, b_qp, b_in = alt(net, net.b)
        b_qp.modify(0x8001, QKEY)
        a_qp.modify(0x8001, QKEY)  # both full members of partition 1
        assert a_qp.query().pkey == 0x8001
        a_qp.modify(DEFAULT_PKEY, QKEY)  # back to the default partition: B not reachable
        violations = net.b.ca.query().ports[0].pkey_violations
        lost = request(a_svc, to(net.b, b_qp), mad(VENDOR, SEND, tid=1), timeout_ms=0)
        lost.resp_expected = False
        lost.addr = MadAddr(remote_qp=b_qp.query().qp_num, remote_qkey=QKEY,
                            dlid=net.b.port.lid, pkey_index=0)
        a_qp.send(lost)
        assert a_in.sent() is lost
        net.settle()
        assert b_in.recvs.empty()
        assert net.b.ca.query().ports[0].pkey_violations == violations + 1
        a_qp.modify(0x8001, QKEY)
        again = request(a_svc, to(net.b, b_qp), mad(VENDOR, SEND, tid=2), timeout_ms=0)
        again.resp_expected = False
        a_qp.send(again)
        got = b_in.recv()
        assert got.tid == 2 and got.addr is not None and got.addr.pkey_index == 1
        put_mad([got, lost, a_in.sent()])
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def test_pending_table_matches_by_tid_and_class() -> None:
    from ibal.wire.mad.tid import Pending

    p: Pending[str] = Pending(VENDOR)
    k = p.add("req", 0x42, retries=1)
    serial = p.add("resp", None)
    assert k == 0x42 and serial < 0 and len(p) == 2
    with pytest.raises(InvalidParameter):
        p.add("dup", 0x42)
    assert p.awaits("req") and not p.awaits("resp")
    assert p.retry(k) and not p.retry(k)  # one retry, then none
    assert p.answer(0x42, bytes(mad(VENDOR + 1, GET_RESP, 0x42))) is None  # other class
    assert p.answer(0x43, bytes(mad(VENDOR, GET_RESP, 0x43))) is None  # nobody waits
    assert p.answer(0x42, bytes(mad(VENDOR, GET_RESP, 0x42))) == "req"
    assert p.answer(0x42, bytes(mad(VENDOR, GET_RESP, 0x42))) is None  # once only
    assert p.remove("resp") and not p.remove("resp") and len(p) == 0
