"""MAD services between two CAs, on the mock fabric and on userspace rxe (QP1 over UDP),
and in the lab guest between two clients of kernel rxe's QP1 through libibumad (``umad``:
where the kernel, not the AL, owns QP1, ``net.al_owns_qp1`` says what differs)."""

from __future__ import annotations

import time

import pytest
from mad_world import GET, GET_RESP, SEND, SET, VENDOR, VENDOR2, Net, mad

from ibal.mad import ElementState, MadElement, MadService, put_mad
from ibal.status import InvalidHandle, InvalidParameter, NotFound, ResourceBusy
from ibal.types import WcStatus


def request(svc: MadService, to: Net | None, elem_mad: bytearray, *, timeout_ms: int = 100,
            retries: int = 0, resp: bool = True, ctx: object = None) -> MadElement:
    e = svc.pool_key.get_mad()
    e.mad[:] = elem_mad
    e.resp_expected, e.timeout_ms, e.retry_cnt = resp, timeout_ms, retries
    e.context1, e.context2 = ctx, "c2"
    return e


def answer(svc: MadService, req: MadElement, payload: bytes) -> MadElement:
    """Reuse the received request as its response (as IBAL allows)."""
    req.mad[3] = GET_RESP
    req.mad[24 : 24 + len(payload)] = payload
    svc.send(req)
    return req


def test_request_and_response_between_two_services(net: Net) -> None:
    asker, a_in = net.service(net.a)
    server, s_in = net.service(net.b, methods={GET})
    req = request(asker, net, mad(VENDOR, GET, payload=b"question"), ctx="ctx1")
    req.addr = net.b.addr()
    asker.send(req)
    hi = asker.hi_tid
    if net.al_owns_qp1:
        assert hi is not None and req.tid >> 32 == hi and req.tid & 0xFFFFFFFF != 0
    else:  # the kernel writes its agent id on the wire, not in the element
        assert hi is None and req.tid >> 32 == 0 and req.tid & 0xFFFFFFFF != 0
    got = s_in.recv()
    assert net.same_tid(got.tid, req.tid)
    assert bytes(got.mad[:8] + got.mad[16:]) == bytes(req.mad[:8] + req.mad[16:])
    assert got.request is None and got.send_context1 is None  # unsolicited
    answer(server, got, b"answer")
    assert s_in.sent() is got and got.status is WcStatus.SUCCESS
    done = a_in.sent()
    assert done is req and done.status is WcStatus.SUCCESS
    resp = a_in.recv()
    assert a_in.order == [("send", req), ("recv", resp)]  # completion before response
    assert bytes(resp.mad) == bytes(got.mad)
    assert resp.tid == got.tid and net.same_tid(resp.tid, req.tid)
    assert resp.mad[3] == GET_RESP and resp.mad[4:6] == b"\0\0"
    assert resp.request is req and (resp.send_context1, resp.send_context2) == ("ctx1", "c2")
    put_mad([resp, got, req])
    assert asker.pool_key.outstanding == 0 and server.pool_key.outstanding == 0


def test_unanswered_request_times_out_after_its_retries_on_the_clock(net: Net) -> None:
    asker, a_in = net.service(net.a)
    req = request(asker, net, mad(VENDOR, SEND), timeout_ms=100, retries=2)
    req.addr = net.b.addr()  # b's QP1 exists (its alias) but serves nothing: Sends drop
    started = time.monotonic()
    asker.send(req)
    if not net.al_owns_qp1:
        # The kernel sends and retries on its own clock, which no test steps: the
        # completion comes after its 1 + 2 tries of 100 ms each, never before.
        done = a_in.sent()
        assert done is req and done.status is WcStatus.TIMEOUT_RETRY_ERR
        assert time.monotonic() - started >= 0.3 * 0.95  # jiffies may round down a little
        assert done.state is ElementState.USER and asker.stats == {}
        put_mad(done)
        return
    net.settle()
    net.b_stats(dropped_unclaimed=1)
    net.step(0.099)
    assert net.b.alias.transport_stats == {"dropped_unclaimed": 1} and a_in.sends.empty()
    net.step(0.002)
    net.b_stats(dropped_unclaimed=2)
    net.step(0.1)
    net.b_stats(dropped_unclaimed=3)
    assert a_in.sends.empty()
    net.step(0.1)
    done = a_in.sent()
    assert done is req and done.status is WcStatus.TIMEOUT_RETRY_ERR
    assert net.b.alias.transport_stats == {"dropped_unclaimed": 3}  # 1 try + 2 retries
    assert done.state is ElementState.USER
    put_mad(done)


def test_cancel_reports_canceled_and_stops_the_retries(net: Net) -> None:
    asker, a_in = net.service(net.a)
    req = request(asker, net, mad(VENDOR, SEND), timeout_ms=100, retries=3)
    req.addr = net.b.addr()
    asker.send(req)
    net.b_stats(dropped_unclaimed=1)
    asker.cancel(req)
    done = a_in.sent()
    assert done is req and done.status is WcStatus.CANCELED
    with pytest.raises(NotFound):
        asker.cancel(req)
    if net.al_owns_qp1:
        net.step(1.0)
        assert net.b.alias.transport_stats == {"dropped_unclaimed": 1}  # no retry went out
    else:
        # libibumad cannot stop a send: the kernel retries and then reports its time-out
        # (4 x 100 ms), which the service counts and keeps from the caller.
        from ibal.testing.helpers import wait_until

        wait_until(lambda: asker.stats == {"late_completion": 1}, "the kernel's time-out")
    assert a_in.sends.empty()
    put_mad(req)
    never = asker.pool_key.get_mad()
    with pytest.raises(NotFound):
        asker.cancel(never)


def test_deregister_completes_pending_sends_canceled_before_the_destroy_callback(
    net: Net,
) -> None:
    asker, a_in = net.service(net.a)
    reqs = []
    for low in (1, 2, 3):
        r = request(asker, net, mad(VENDOR, SEND, tid=low), timeout_ms=500)
        r.addr = net.b.addr()
        reqs.append(r)
    asker.send(reqs)
    net.settle()
    assert asker.outstanding == 3
    marker = asker.pool_key.get_mad()  # stands for "the destroy callback ran"
    asker.deregister(lambda _ctx: a_in.order.append(("destroyed", marker)), wait=True)
    assert [(what, e.status, e.tid & 0xFFFFFFFF) for what, e in a_in.order[:3]] == [
        ("send", WcStatus.CANCELED, low) for low in (1, 2, 3)
    ]
    assert a_in.order[3:] == [("destroyed", marker)]
    assert all(r.state is ElementState.USER for r in reqs)
    with pytest.raises(InvalidHandle):
        asker.send(reqs[0])
    with pytest.raises(InvalidHandle):
        asker.deregister()
    net.b_stats(dropped_unclaimed=3)
    net.step(1.0)  # nothing of it is left on the clock or the wire
    net.settle()
    assert a_in.sends.qsize() == 3 and len(a_in.order) == 4  # no late completion came
    if net.al_owns_qp1:
        assert net.b.alias.transport_stats == {"dropped_unclaimed": 3}


def test_unsolicited_requests_route_by_method(net: Net) -> None:
    sender, _ = net.service(net.a)
    _getter, g_in = net.service(net.b, methods={GET})
    _setter, s_in = net.service(net.b, methods={SET})
    with pytest.raises(ResourceBusy):  # one service per (class, version, method) on a port
        net.service(net.b, methods={SET})
    for method, low in ((SET, 7), (GET, 8)):
        e = request(sender, net, mad(VENDOR, method, tid=low), resp=False)
        e.addr = net.b.addr()
        sender.send(e)
    assert g_in.recv().tid & 0xFFFFFFFF == 8
    assert s_in.recv().tid & 0xFFFFFFFF == 7
    assert g_in.recvs.empty() and s_in.recvs.empty()


@pytest.mark.parametrize(
    ("served_class", "served_version", "sent_class", "sent_version", "method", "status"),
    [
        (VENDOR, 1, VENDOR, 1, SET, 0x0008),  # class served, method not
        (VENDOR, 1, VENDOR2, 1, GET, 0x0004),  # nobody serves the class
        (VENDOR, 1, VENDOR, 2, GET, 0x0004),  # the class, not at that version
    ],
)
def test_unserved_requests_get_the_status_iba_requires(
    net: Net, served_class: int, served_version: int, sent_class: int, sent_version: int,
    method: int, status: int,
) -> None:
    net.service(net.b, served_class, methods={GET}, version=served_version)
    asker, a_in = net.service(net.a, sent_class, version=sent_version)
    req = request(asker, net, mad(sent_class, method, attr=0x15, version=sent_version,
                                  payload=b"keep me"))
    req.addr = net.b.addr()
    asker.send(req)
    assert a_in.sent().status is WcStatus.SUCCESS
    resp = a_in.recv()
    if not net.al_owns_qp1:
        # The kernel answers every unserved Get/Set 0x000C (docs/decisions.md: IBA asks
        # 0x0004/0x0008 here); the AL's transport never sees the request.
        status = 0x000C
    expect = bytearray(req.mad)
    expect[3] = GET_RESP
    expect[4:6] = status.to_bytes(2, "big")
    assert net.same_tid(resp.tid, req.tid) and resp.request is req
    expect[8:16] = resp.mad[8:16]
    assert bytes(resp.mad) == bytes(expect)  # the request echoed, method and status set
    if net.al_owns_qp1:
        net.b_stats(**{f"answered_0x{status:04x}": 1})
    else:
        net.b_stats()


VENDOR_R2 = 0x31  # a vendor range 2 class: its requests are routed by the OUI too
OPENIB, OTHER_OUI, NOBODY_OUI = b"\x00\x14\x05", b"\x00\x02\xc9", b"\x12\x34\x56"


def test_vendor_range2_requests_route_by_the_oui(net: Net) -> None:
    from ibal.mad import MadSvc, reg_mad_svc

    for cls, oui in ((VENDOR, 0x0002C9), (VENDOR_R2, 1 << 24), (VENDOR_R2, -1)):
        with pytest.raises(InvalidParameter):  # an OUI only for 0x30..0x4f, 24 bits
            reg_mad_svc(net.b.alias, MadSvc(cls, 1, lambda _e: None, oui=oui))
    _openib, o_in = net.service(net.b, VENDOR_R2, methods={GET})  # OUI 0: OpenIB's
    _other, x_in = net.service(net.b, VENDOR_R2, methods={GET}, oui=0x0002C9)
    with pytest.raises(ResourceBusy):  # one service per (class, version, method, OUI)
        net.service(net.b, VENDOR_R2, methods={GET}, oui=0x0002C9)
    asker, a_in = net.service(net.a, VENDOR_R2)
    for oui, low in ((OTHER_OUI, 7), (OPENIB, 8)):
        e = request(asker, net, mad(VENDOR_R2, GET, tid=low, payload=bytes(13) + oui),
                    resp=False)
        e.addr = net.b.addr()
        asker.send(e)
    got_x, got_o = x_in.recv(), o_in.recv()
    assert (got_x.tid & 0xFFFFFFFF, bytes(got_x.mad[37:40])) == (7, OTHER_OUI)
    assert (got_o.tid & 0xFFFFFFFF, bytes(got_o.mad[37:40])) == (8, OPENIB)
    stray = request(asker, net, mad(VENDOR_R2, GET, tid=9, payload=bytes(13) + NOBODY_OUI))
    stray.addr = net.b.addr()
    asker.send(stray)
    resp = a_in.recv()
    assert resp.request is stray
    # Another vendor's class is not served at all (IBA 13.4.7: 0x0004); the kernel
    # answers every unserved Get 0x000C (docs/decisions.md).
    status = b"\x00\x04" if net.al_owns_qp1 else b"\x00\x0c"
    assert resp.mad[3] == GET_RESP and resp.mad[4:6] == status
    assert bytes(resp.mad[37:40]) == NOBODY_OUI
    assert o_in.recvs.empty() and x_in.recvs.empty()
    if net.al_owns_qp1:
        net.b_stats(answered_0x0004=1)


def test_unserved_attribute_is_answered_0x000c_by_the_service(net: Net) -> None:
    server, s_in = net.service(net.b, methods={GET}, attributes={GET: frozenset({0x10})})
    asker, a_in = net.service(net.a)
    for attr in (0x11, 0x10):
        req = request(asker, net, mad(VENDOR, GET, attr=attr))
        req.addr = net.b.addr()
        asker.send(req)
    served = s_in.recv()
    assert int.from_bytes(served.mad[16:18], "big") == 0x10
    resp = a_in.recv()
    assert resp.mad[3] == GET_RESP and resp.mad[4:6] == b"\x00\x0c"
    assert int.from_bytes(resp.mad[16:18], "big") == 0x11
    assert server.stats == {"answered_0x000c": 1}


def test_answers_go_only_to_get_and_set_not_to_traps_sends_or_responses(net: Net) -> None:
    asker, a_in = net.service(net.a, VENDOR2)
    for method in (SEND, 0x05, GET_RESP):  # a Send, a Trap, a stray response
        e = request(asker, net, mad(VENDOR2, method, tid=1), resp=False)
        e.addr = net.b.addr()
        asker.send(e)
        assert a_in.sent().status is WcStatus.SUCCESS
    probe = request(asker, net, mad(VENDOR2, GET))  # a Get behind them is answered
    probe.addr = net.b.addr()
    asker.send(probe)
    answer = a_in.recv()
    assert answer.request is probe
    if net.al_owns_qp1:
        assert answer.mad[4:6] == b"\x00\x04"
        net.b_stats(dropped_unclaimed=2, dropped_unmatched_response=1, answered_0x0004=1)
    else:  # the kernel's answer (0x000C for all); it answered none of the three
        assert answer.mad[4:6] == b"\x00\x0c"
        assert a_in.recvs.empty() and asker.stats == {}
        net.b_stats()


def test_registration_rules(net: Net) -> None:
    from ibal.mad import MadSvc, reg_mad_svc

    def cb(_e: MadElement) -> None:
        return None

    with pytest.raises(InvalidParameter):  # unsolicited needs methods
        reg_mad_svc(net.a.alias, MadSvc(VENDOR, 1, cb, support_unsol=True))
    with pytest.raises(InvalidParameter):  # SMPs live on QP0
        reg_mad_svc(net.a.alias, MadSvc(0x01, 1, cb))
    with pytest.raises(InvalidParameter):
        reg_mad_svc(object(), MadSvc(VENDOR, 1, cb))  # type: ignore[arg-type]
    svc = reg_mad_svc(net.a.alias, MadSvc(VENDOR, 1, cb))
    e = svc.pool_key.get_mad()
    with pytest.raises(InvalidParameter):  # no address
        svc.send(e)
    e.addr = net.b.addr()
    e.mad[:] = mad(VENDOR2, GET)
    with pytest.raises(InvalidParameter):  # not the service's class
        svc.send(e)
    e.mad[1] = VENDOR
    e.resp_expected = True
    with pytest.raises(InvalidParameter):  # waits for an answer without a time-out
        svc.send(e)


def test_sequenced_transactions_block_until_the_response(net: Net) -> None:
    """IBMF's sequenced msg_transport without a callback: transact() returns the answer."""
    import threading

    from ibal.mad import transact
    from ibal.status import Timeout

    server, s_in = net.service(net.b, methods={GET})
    asker, a_in = net.service(net.a)

    def serve() -> None:
        got = s_in.recv()
        answer(server, got, b"seq")

    t = threading.Thread(target=serve)
    t.start()
    req = request(asker, net, mad(VENDOR, GET), timeout_ms=100)
    req.addr = net.b.addr()
    resp = transact(asker, req, timeout=10)
    t.join()
    assert resp.request is req and bytes(resp.mad[24:27]) == b"seq"
    assert a_in.sends.empty() and a_in.recvs.empty()  # the caller got it, not the callbacks
    # No answer: the retries run out on the manual clock while transact waits.
    lost = request(asker, net, mad(VENDOR, SEND), timeout_ms=100, retries=1)
    lost.addr = net.b.addr()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            transact(asker, lost)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=ask)
    t.start()
    from ibal.testing.helpers import wait_until

    if net.al_owns_qp1:
        # Its first copy has landed (so its time-out timer runs) before the clock moves.
        wait_until(lambda: net.b.alias.transport_stats.get("dropped_unclaimed") == 1, "a copy")
        net.step(0.25)
    # (umad: the kernel's own clock runs the two tries out)
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], Timeout)
    net.b_stats(dropped_unclaimed=2)


def test_a_lost_request_is_retried_and_a_duplicated_answer_counted_once(mock_net: Net) -> None:
    """The mock's fault injection: the first copy of the request is lost, the answer doubled."""
    net = mock_net
    faults = net.fabric.faults
    lost = faults.drop(predicate=lambda p: bytes(p.payload[:4]) == bytes([1, VENDOR, 1, GET]),
                       nth=1)
    doubled = faults.duplicate(
        predicate=lambda p: bytes(p.payload[:4]) == bytes([1, VENDOR, 1, GET_RESP]), nth=1)
    server, s_in = net.service(net.b, methods={GET})
    asker, a_in = net.service(net.a)
    req = request(asker, net, mad(VENDOR, GET), timeout_ms=100, retries=2)
    req.addr = net.b.addr()
    asker.send(req)
    net.settle()
    assert lost.fired == 1 and s_in.recvs.empty()
    net.step(0.1)  # the retry
    answer(server, s_in.recv(), b"once")
    resp = a_in.recv()
    assert resp.request is req and a_in.sent() is req and req.status is WcStatus.SUCCESS
    from ibal.testing.helpers import wait_until

    wait_until(lambda: net.a.alias.transport_stats == {"dropped_unmatched_response": 1},
               "the copy dropped")
    net.settle()
    assert doubled.fired == 1 and a_in.recvs.empty()  # the copy reached nobody
    assert s_in.recvs.empty()  # the retry's request was the only one that arrived


def test_the_pd_going_away_ends_the_service_and_cancels_its_sends(net: Net) -> None:
    asker, a_in = net.service(net.a)
    req = request(asker, net, mad(VENDOR, SEND), timeout_ms=500)
    req.addr = net.b.addr()
    asker.send(req)
    net.a.pd.dealloc(wait=True)  # takes the alias QP and the service's agent with it
    done = a_in.sent()
    assert done is req and done.status is WcStatus.CANCELED
    with pytest.raises(InvalidHandle):
        asker.send(req)
    with pytest.raises(InvalidHandle):
        asker.deregister()


def test_a_completion_queued_when_the_al_goes_comes_once_and_the_service_knows(
    mock_net: Net,
) -> None:
    """The AL tears the service down while its send's completion waits on the misc
    queue: the send still ends exactly once, and the service reports itself gone."""
    import threading

    from ibal.mad import MadSvc, reg_mad_svc
    from ibal.types import QpType

    net = mock_net
    al = net.mgr.open_al()
    ca = al.open_ca(net.a.ca.query().ca_guid)
    port = ca.query().ports[0]
    alias = ca.alloc_pd().get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
    sent: list[tuple[MadElement, WcStatus]] = []
    svc = reg_mad_svc(alias, MadSvc(VENDOR, 1, put_mad, lambda e: sent.append((e, e.status))))
    gate, blocked = threading.Event(), threading.Event()

    def hold_the_misc_queue() -> None:
        blocked.set()
        gate.wait(30)

    net.mgr.queues.misc.post(hold_the_misc_queue)
    assert blocked.wait(30)
    req = svc.pool_key.get_mad()
    req.mad[:] = mad(VENDOR, SEND)
    req.addr = net.b.addr()
    svc.send(req)  # its completion queues behind the held misc queue
    closer = threading.Thread(target=al.close)
    closer.start()
    closer.join(30)  # the teardown does not wait for the misc queue
    assert not closer.is_alive() and not svc.alive
    gate.set()
    net.settle()
    assert [(e, s) for e, s in sent] == [(req, WcStatus.CANCELED)]
    assert req.state is ElementState.USER and svc.outstanding == 0
    with pytest.raises(InvalidHandle):
        svc.send(req)


def test_an_answer_with_no_pool_element_left_ends_its_request_with_an_error(
        mock_net: Net) -> None:
    """The asker's pool is exhausted when the answer arrives: the answer is dropped and
    counted, and the request ends with an error instead of waiting for ever."""
    import threading

    from ibal.mad import MadPool, MadSvc, reg_mad_svc, transact
    from ibal.status import IbError

    net = mock_net
    server, s_in = net.service(net.b, methods={GET})
    key = MadPool(None, 1, 1, 0).register(net.a.pd)  # one element: the request's own
    asker = reg_mad_svc(net.a.alias, MadSvc(VENDOR, 1, recv_cb=put_mad, send_cb=put_mad), key)
    req = request(asker, net, mad(VENDOR, GET), timeout_ms=100)
    req.addr = net.b.addr()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            transact(asker, req, timeout=10)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=ask)
    t.start()
    answer(server, s_in.recv(), b"no room for me")
    t.join(10)
    assert not t.is_alive(), (dict(asker.stats), req.state, req.status)
    assert len(errors) == 1 and type(errors[0]) is IbError and "GENERAL_ERR" in str(errors[0])
    assert asker.stats["dropped_no_element"] == 1
    assert req.status is WcStatus.GENERAL_ERR


def test_an_answer_in_another_class_version_never_leaves_transact_waiting(net: Net) -> None:
    """A version-2 answer to a version-1 service's request: the service drops it. Where
    the AL's transport matches answers it does not end the request on it (it retries,
    then times out on the clock); where the kernel's MAD layer matched it by TID and
    class and ended the send (umad), the service ends the request ``GENERAL_ERR``."""
    import threading

    from ibal.mad import transact
    from ibal.status import IbError, Timeout

    server, s_in = net.service(net.b, methods={GET})
    asker, _a_in = net.service(net.a)
    req = request(asker, net, mad(VENDOR, GET), timeout_ms=100, retries=1)
    req.addr = net.b.addr()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            transact(asker, req)  # no wall-clock time-out: only the service can end it
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=ask)
    t.start()
    got = s_in.recv()
    got.mad[2] = 2  # the answer's class version
    answer(server, got, b"v2")
    if net.al_owns_qp1:
        from ibal.testing.helpers import wait_until

        wait_until(lambda: net.a.alias.transport_stats.get("dropped_mismatched_response") == 1,
                   "the v2 answer dropped")  # fmt: skip
        net.step(0.1)
        s_in.recv()  # the retry: the request's timer survived the answer
        net.step(0.15)
    t.join(10)
    assert not t.is_alive() and len(errors) == 1
    if net.al_owns_qp1:
        assert isinstance(errors[0], Timeout)
    else:
        assert type(errors[0]) is IbError and "GENERAL_ERR" in str(errors[0])
        assert asker.stats["dropped_bad_class_version"] == 1
