"""A MAD service against a raw peer and under a flood: exact bytes, drops counted."""

from __future__ import annotations

import dataclasses

import pytest
from mad_world import GET, GET_RESP, SET, VENDOR, Net, Side, mad

from ibal.mad import MadElement, put_mad
from ibal.testing.helpers import GRH_BYTES, av_to, make_side, wait_until, wait_wc
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    DgrmInfo,
    QpType,
    SendWr,
    UdDest,
    WcStatus,
)

SLOT = GRH_BYTES + MAD_SIZE


class RawPeer:
    """A plain UD QP on one side that speaks to the other side's QP1 byte by byte."""

    def __init__(self, me: Side, peer: Side) -> None:
        self.side = make_side(me.ca, me.port, QpType.UD, buf_size=SLOT * 9)
        self.side.qp.init_dgrm_svc(DgrmInfo(port_guid=me.port.port_guid,
                                            qkey=QP1_WELL_KNOWN_QKEY))
        av = self.side.pd.create_av(av_to(peer.port, me.port.port_num))
        self.dest = UdDest(av=av, remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY)
        self.me = me
        self._early: list[int] = []
        for slot in range(1, 9):
            self.side.recv(slot, slot * SLOT, SLOT)

    @property
    def addr(self) -> object:
        """This QP as a MAD element's destination."""
        return dataclasses.replace(self.me.addr(), remote_qp=self.side.qp.num)

    def send(self, data: bytes | bytearray) -> None:
        self.side.put(0, bytes(data))
        self.side.qp.post_send(SendWr(wr_id=0, sg_list=[self.side.sge(0, len(data))],
                                      ud=self.dest))
        while True:  # its send completion (receives may be queued around it)
            wc = wait_wc(self.side.cq)
            if wc.wr_id == 0:
                assert wc.status is WcStatus.SUCCESS
                return
            self._early.append(wc.wr_id)

    def recv(self) -> bytes:
        slot = self._early.pop(0) if self._early else wait_wc(self.side.cq).wr_id
        data = self.side.get(slot * SLOT + GRH_BYTES, MAD_SIZE)
        self.side.recv(slot, slot * SLOT, SLOT)
        return data


def test_malformed_mads_are_dropped_and_counted_and_answers_are_exact(net: Net) -> None:
    if not net.al_owns_qp1:
        pytest.skip("umad: the kernel's MAD layer checks and drops malformed MADs before "
                    "user space (uncounted there) and ends a transaction on the first "
                    "response with its TID, forged or not; these counters are the AL's QP1's")
    server, s_in = net.service(net.b, methods={GET})
    raw = RawPeer(net.a, net.b)
    bad = mad(VENDOR, GET, 1)
    bad[0] = 2
    raw.send(bad)  # base version 2
    raw.send(mad(VENDOR, GET, 2)[:100])  # a short datagram
    garbage = mad(VENDOR, GET, 3)
    garbage[18] = 0x5A
    raw.send(garbage)  # the header's reserved bits set
    raw.send(mad(0x01, GET, 4))  # an SMP on QP1
    raw.send(mad(VENDOR, GET, 5, version=2))  # a class version nobody serves: answered
    answer = raw.recv()
    expect = mad(VENDOR, GET_RESP, 5, version=2)
    expect[4:6] = b"\x00\x04"
    assert answer == bytes(expect)  # the exact status on the wire, TID and attribute kept
    good = mad(VENDOR, GET, 6, payload=b"fine")
    raw.send(good)
    got = s_in.recv()
    assert bytes(got.mad) == bytes(good)
    assert s_in.recvs.empty()
    assert server.all_stats() == {
        "dropped_bad_version": 1, "dropped_short": 1, "dropped_reserved": 1,
        "dropped_wrong_qp": 1, "answered_0x0004": 1,
    }
    # Responses: a forged class version or garbage does not end the transaction.
    req = server.pool_key.get_mad()
    req.mad[:] = mad(VENDOR, GET)
    req.addr = raw.addr  # type: ignore[assignment]
    req.resp_expected, req.timeout_ms = True, 1000
    server.send(req)
    asked = raw.recv()
    assert asked == bytes(req.mad)
    for mutate in ("version", "reserved", None):
        resp = bytearray(asked)
        resp[3] = GET_RESP
        if mutate == "version":
            resp[2] = 2
        elif mutate == "reserved":
            resp[19] = 1
        raw.send(resp)
    assert s_in.sent() is req and req.status is WcStatus.SUCCESS
    answered = s_in.recv()
    assert answered.request is req and answered.mad[2] == 1 and answered.mad[19] == 0
    stats = server.all_stats()
    assert (stats["dropped_mismatched_response"], stats["dropped_reserved"]) == (1, 2)


def test_a_flood_of_unsolicited_mads_does_not_starve_a_waiting_transaction(net: Net) -> None:
    """Thousands of unsolicited Gets at a service that holds every one it gets: past its
    bound they are dropped and counted; the answer to its own request still arrives."""
    bound, flood, chunk = 64, 3000, 32
    if net.kind == "umad":  # the lab guest runs under TCG emulation: a smaller flood
        bound, flood, chunk = 16, 400, 16
    target, t_in = net.service(net.b, methods={GET}, max_unsolicited=bound)
    responder, r_in = net.service(net.a, methods={SET})
    flooder, f_in = net.service(net.a)  # the same class, serving nothing
    # The target asks the responder something; the answer comes in the middle of the flood.
    req = target.pool_key.get_mad()
    req.mad[:] = mad(VENDOR, SET, payload=b"while flooded")
    # (The AL's clock does not move here; the kernel's does, and the guest is slow.)
    req.addr, req.resp_expected = net.a.addr(), True
    req.timeout_ms = 1000 if net.al_owns_qp1 else 120_000
    target.send(req)
    question = r_in.recv()

    held: list[MadElement] = []
    f_elems = [flooder.pool_key.get_mad() for _ in range(chunk)]
    sent = 0

    def accounted() -> int:
        while not t_in.recvs.empty():
            held.append(t_in.recvs.get_nowait())
        return len([e for e in held if e.request is None]) + target.stats["dropped_backlog"]

    for n in range(flood // chunk + 1):
        batch = min(chunk, flood - sent)
        if batch <= 0:
            break
        for e in f_elems[:batch]:
            e.mad[:] = mad(VENDOR, GET, payload=b"flood")
            e.addr = net.b.addr()
        flooder.send(f_elems[:batch])
        for _ in range(batch):
            assert f_in.sent().status is WcStatus.SUCCESS
        sent += batch
        if n == (flood // chunk) // 2:  # halfway: the answer goes out
            question.mad[3] = GET_RESP
            question.mad[24:30] = b"answer"
            responder.send(question)
        wait_until(lambda s=sent: accounted() >= s, f"{sent} flood MADs at the target")
    wait_until(lambda: any(e.request is req for e in held), "the answer at the target")
    answer = next(e for e in held if e.request is req)
    assert bytes(answer.mad[24:30]) == b"answer" and net.same_tid(answer.tid, req.tid)
    assert req.status is WcStatus.SUCCESS and t_in.sent() is req
    unsolicited = [e for e in held if e.request is None]
    assert len(unsolicited) == bound
    assert target.stats["dropped_backlog"] == flood - bound
    # Giving elements back makes room again.
    put_mad(unsolicited[:2])
    for e in f_elems[:3]:
        e.mad[:] = mad(VENDOR, GET)
        e.addr = net.b.addr()
    flooder.send(f_elems[:3])
    wait_until(lambda: accounted() >= bound + 2 + flood - bound + 1, "two more accepted")
    assert target.stats["dropped_backlog"] == flood - bound + 1
