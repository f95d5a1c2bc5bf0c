"""RMPP transfers through MAD services (ibal.transport.rmpp behind the service's seam).

On umad (tests/mad/test_service_lab_umad.py) the kernel's MAD layer runs RMPP,
not ``service.rmpp`` (``service.transport_rmpp``; docs/mad.md), and the tests
say where that shows: the kernel runs it for the RMPP classes only (a vendor
range 1 class cannot go in segments there: ``Unsupported``), and it reports
only time-outs of a send, so an RMPP send without an answer completes
``SUCCESS`` when written, not when its last segment is ACKed.
"""

from __future__ import annotations

import pytest
from mad_world import GET, GET_RESP, SET, VENDOR, Net, mad

from ibal.mad import MadSvcType, enable_rmpp, put_mad
from ibal.mad.rmpp_service import RMPP_DATA_OFFSET
from ibal.status import Unsupported
from ibal.testing.helpers import wait_until
from ibal.types import WcStatus

RMPP_CLASS = 0x30  # vendor range 2: RMPP classes a DEFAULT service would treat as such
# A vendor range 2 MAD's class header: reserved, OUI.  The kernel routes those classes by
# the OUI, and libibumad's umad_register registers them under OpenIB's (00:14:05): a MAD
# with another OUI reaches no agent there (a Get is answered 0x000C by the kernel).
VENDOR2_HEADER = bytes([0, 0x00, 0x14, 0x05])


def payload(n: int) -> bytes:
    return bytes((i * 7 + 3) % 251 for i in range(n))


def test_a_request_carried_in_segments(net: Net) -> None:
    # svc_type RMPP makes a vendor range 1 class segment where the service does RMPP;
    # the kernel's MAD layer does it for the RMPP classes only.
    cls = VENDOR if net.al_owns_qp1 else RMPP_CLASS
    sender, s_in = net.service(net.a, cls, svc_type=MadSvcType.RMPP)
    receiver, r_in = net.service(net.b, cls, methods={SET}, svc_type=MadSvcType.RMPP)
    enable_rmpp(sender, net.mgr.timers)
    enable_rmpp(receiver, net.mgr.timers)
    assert [sender.transport_rmpp, receiver.transport_rmpp] == [not net.al_owns_qp1] * 2
    data = VENDOR2_HEADER + payload(1996)  # 10 segments of 220 bytes (216 after the OUI)
    e = sender.pool_key.get_mad(RMPP_DATA_OFFSET + len(data))
    e.mad[:24] = mad(cls, SET)[:24]
    e.mad[RMPP_DATA_OFFSET:] = data
    e.addr, e.rmpp_version = net.b.addr(), 1
    sender.send(e)
    # SUCCESS: every segment ACKed (on umad: written; the kernel reports only time-outs)
    assert s_in.sent() is e and e.status is WcStatus.SUCCESS
    got = r_in.recv()
    # the header as sent, but the TID's high half (the kernel's on umad)
    assert bytes(got.mad[:8]) + bytes(got.mad[12:24]) == bytes(e.mad[:8]) + bytes(e.mad[12:24])
    assert net.same_tid(got.tid, e.tid)
    assert bytes(got.mad[RMPP_DATA_OFFSET:]) == data and got.request is None
    put_mad([got, e])
    if not net.al_owns_qp1:
        vendor, _ = net.service(net.a, VENDOR, svc_type=MadSvcType.RMPP)
        enable_rmpp(vendor, net.mgr.timers)
        e = vendor.pool_key.get_mad(RMPP_DATA_OFFSET + len(data))
        e.mad[:24] = mad(VENDOR, SET)[:24]
        e.addr, e.rmpp_version = net.b.addr(), 1
        with pytest.raises(Unsupported, match="RMPP classes only"):
            vendor.send(e)
        put_mad(e)


def test_a_response_carried_in_segments_is_linked_to_its_request(net: Net) -> None:
    data = VENDOR2_HEADER + payload(2996)

    def answer(req: object) -> None:
        from ibal.mad import MadElement

        assert isinstance(req, MadElement)
        big = server.pool_key.get_mad(RMPP_DATA_OFFSET + len(data))
        big.mad[:24] = req.mad[:24]
        big.mad[3] = GET_RESP
        big.mad[RMPP_DATA_OFFSET:] = data
        big.addr, big.rmpp_version = req.addr, 1
        server.send(big)
        put_mad(req)

    from ibal.mad import MadSvc, reg_mad_svc

    server = reg_mad_svc(net.b.alias, MadSvc(RMPP_CLASS, 1, answer, put_mad,
                                             methods=frozenset({GET}), support_unsol=True))
    asker, a_in = net.service(net.a, RMPP_CLASS)  # DEFAULT: RMPP for this class
    enable_rmpp(server, net.mgr.timers)
    enable_rmpp(asker, net.mgr.timers)
    req = asker.pool_key.get_mad()
    req.mad[:] = mad(RMPP_CLASS, GET)
    req.mad[RMPP_DATA_OFFSET : RMPP_DATA_OFFSET + 4] = VENDOR2_HEADER
    req.addr, req.resp_expected, req.timeout_ms = net.b.addr(), True, 1000
    asker.send(req)
    assert [server.transport_rmpp, asker.transport_rmpp] == [not net.al_owns_qp1] * 2
    assert a_in.sent() is req and req.status is WcStatus.SUCCESS
    resp = a_in.recv()
    assert resp.request is req and net.same_tid(resp.tid, req.tid) and resp.mad[3] == GET_RESP
    assert bytes(resp.mad[RMPP_DATA_OFFSET:]) == data
    assert a_in.order == [("send", req), ("recv", resp)]


def test_a_lost_segment_is_resent_when_the_clock_says(mock_net: Net) -> None:
    net = mock_net
    lost = net.fabric.faults.drop(
        predicate=lambda p: bytes(p.payload[:4]) == bytes([1, VENDOR, 1, SET])
        and p.payload[24:26] == b"\x01\x01" and int.from_bytes(p.payload[28:32], "big") == 3,
        nth=1)
    sender, s_in = net.service(net.a, svc_type=MadSvcType.RMPP)
    receiver, r_in = net.service(net.b, methods={SET}, svc_type=MadSvcType.RMPP)
    tx = enable_rmpp(sender, net.mgr.timers)
    enable_rmpp(receiver, net.mgr.timers)
    data = payload(1500)
    e = sender.pool_key.get_mad(RMPP_DATA_OFFSET + len(data))
    e.mad[:24] = mad(VENDOR, SET)[:24]
    e.mad[RMPP_DATA_OFFSET:] = data
    e.addr, e.rmpp_version, e.timeout_ms, e.retry_cnt = net.b.addr(), 1, 200, 2
    sender.send(e)
    wait_until(lambda: lost.fired == 1, "segment 3 lost")
    net.settle()
    assert r_in.recvs.empty() and s_in.sends.empty()
    net.step(0.2)  # the sender's time-out: it resends from the hole
    assert bytes(r_in.recv().mad[RMPP_DATA_OFFSET:]) == data
    assert s_in.sent() is e and e.status is WcStatus.SUCCESS
    assert tx.transfers.totals.resent >= 1


def test_sa_style_table_and_set_both_ways(net: Net) -> None:
    """The lab's RMPP exchange (tests/mad/rmpp_peer.py) with ibal's RMPP at both ends; on
    umad both sides are one port, where one agent may serve SA GetTable/Set: one peer
    asks itself there, through the kernel's RMPP both ways."""
    import hashlib

    from rmpp_peer import SET_BYTES, TABLE_BYTES, RmppPeer, pattern

    a = RmppPeer(net.a.alias, seed=1, timers=net.mgr.timers)
    if net.al_owns_qp1:
        b = RmppPeer(net.b.alias, seed=2, timers=net.mgr.timers)
        rounds = ((a, b, net.b), (b, a, net.a))
    else:
        assert [s.transport_rmpp for s in a.services] == [True, True]
        rounds = ((a, a, net.a),)
    for asker, other, side in rounds:
        got = asker.ask(side.addr())
        assert (got["table_method"], got["table_len"]) == (0x92, TABLE_BYTES)
        assert got["table_sha"] == hashlib.sha256(pattern(TABLE_BYTES, other.seed)).hexdigest()
        assert got["table_rmpp_area"] == "00" * 12
        assert got["table_tid_match"] and got["table_linked"]
        assert got["set_method"] == 0x81 and got["set_reply"] == got["set_expected"]
        assert other.served == ["get_table:256", f"set:{SET_BYTES}"]
        other.served.clear()
