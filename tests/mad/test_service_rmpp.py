"""RMPP transfers through MAD services (ibal.mad.rmpp behind the service's seam)."""

from __future__ import annotations

import pytest
from mad_world import GET, GET_RESP, SET, VENDOR, Net, mad

from ibal.mad import MadSvcType, enable_rmpp, put_mad
from ibal.mad.rmpp_service import RMPP_DATA_OFFSET
from ibal.testing.helpers import wait_until
from ibal.types import WcStatus

RMPP_CLASS = 0x30  # vendor range 2: RMPP classes a DEFAULT service would treat as such


@pytest.fixture
def net(net: Net) -> Net:
    if not net.al_owns_qp1:
        pytest.skip("umad: RMPP through libibumad needs the kernel's RMPP registration "
                    "(rmpp_version in umad_register), not on main yet")
    return net


def payload(n: int) -> bytes:
    return bytes((i * 7 + 3) % 251 for i in range(n))


def test_a_request_carried_in_segments(net: Net) -> None:
    sender, s_in = net.service(net.a, svc_type=MadSvcType.RMPP)
    receiver, r_in = net.service(net.b, methods={SET}, svc_type=MadSvcType.RMPP)
    enable_rmpp(sender, net.mgr.timers)
    enable_rmpp(receiver, net.mgr.timers)
    data = payload(2000)  # 10 segments of 220 bytes
    e = sender.pool_key.get_mad(RMPP_DATA_OFFSET + len(data))
    e.mad[:24] = mad(VENDOR, SET)[:24]
    e.mad[RMPP_DATA_OFFSET:] = data
    e.addr, e.rmpp_version = net.b.addr(), 1
    sender.send(e)
    assert s_in.sent() is e and e.status is WcStatus.SUCCESS  # every segment ACKed
    got = r_in.recv()
    assert bytes(got.mad[:24]) == bytes(e.mad[:24])
    assert bytes(got.mad[RMPP_DATA_OFFSET:]) == data and got.request is None
    put_mad([got, e])


def test_a_response_carried_in_segments_is_linked_to_its_request(net: Net) -> None:
    data = payload(3000)

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
    req.addr, req.resp_expected, req.timeout_ms = net.b.addr(), True, 1000
    asker.send(req)
    assert a_in.sent() is req and req.status is WcStatus.SUCCESS
    resp = a_in.recv()
    assert resp.request is req and resp.tid == req.tid and resp.mad[3] == GET_RESP
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
    """The lab's RMPP exchange (tests/mad/rmpp_peer.py) with ibal's RMPP at both ends."""
    import hashlib

    from rmpp_peer import SET_BYTES, TABLE_BYTES, RmppPeer, pattern

    a = RmppPeer(net.a.alias, seed=1, timers=net.mgr.timers)
    b = RmppPeer(net.b.alias, seed=2, timers=net.mgr.timers)
    for asker, other, side in ((a, b, net.b), (b, a, net.a)):
        got = asker.ask(side.addr())
        assert (got["table_method"], got["table_len"]) == (0x92, TABLE_BYTES)
        assert got["table_sha"] == hashlib.sha256(pattern(TABLE_BYTES, other.seed)).hexdigest()
        assert got["table_rmpp_area"] == "00" * 12
        assert got["table_tid_match"] and got["table_linked"]
        assert got["set_method"] == 0x81 and got["set_reply"] == got["set_expected"]
        assert other.served == ["get_table:256", f"set:{SET_BYTES}"]
        other.served.clear()
