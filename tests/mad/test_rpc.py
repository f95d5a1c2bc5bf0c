"""ibal.mad.rpc.MadClient over a scripted port: matching, time-out, retries, window, addressing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from ibal.mad.rpc import MadClient, MadError, PortId, Request, parse_dr_path, parse_portid
from ibal.wire.mad import header, smp
from ibal.wire.mad.consts import MgmtClass, SmpAttr


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedPort:
    """Answers with NodeInfo (node GUID: the DR hop count or the LID); ``drop`` loses requests."""

    lid = 5
    sm_lid = 1

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.sent: list[bytes] = []
        self.drop = 0  # drop this many requests first
        self.on_mad: Callable[[bytes], None] | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.deferred: list[bytes] = []
        self.abandoned: list[int] = []

    def start(self, on_mad: Callable[[bytes], None]) -> None:
        self.on_mad = on_mad

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        self.sent.append(mad)
        assert qp == (0 if mad[1] in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR) else 1)
        if self.drop:
            self.drop -= 1
            self.clock.now += timeout_ms / 1000  # the client's deadline passes
            return
        data = smp.NODE_INFO.encode(node_guid=mad[7] if mad[1] == MgmtClass.SUBN_DR else to.lid)
        self.deferred.append(bytes(header.respond(mad, data=data)))
        self.max_in_flight = max(self.max_in_flight, len(self.deferred))

    def flush(self) -> None:
        assert self.on_mad is not None
        for mad in reversed(self.deferred):  # answers in the reverse order
            self.on_mad(mad)
        self.deferred.clear()

    def abandon(self, tid: int) -> None:
        self.abandoned.append(tid)

    def close(self) -> None:
        pass


def _client(retries: int = 2) -> tuple[MadClient, ScriptedPort, Clock]:
    clock = Clock()
    port = ScriptedPort(clock)
    return MadClient(port, timeout_ms=100, retries=retries, clock=clock), port, clock


def test_blocking_get_directed_route_and_lid() -> None:
    client, port, _ = _client()
    client.post(Request(MgmtClass.SUBN_DR, 1, SmpAttr.NODE_INFO, PortId(dr_path=(1, 3))))
    port.flush()
    (rep,) = client.poll()
    assert rep.ok and smp.NODE_INFO.decode(rep.data)["node_guid"] == 2  # hop count
    sent = header.header(port.sent[0])
    assert (sent.mgmt_class, sent.attr_id, port.sent[0][7]) == (MgmtClass.SUBN_DR, 0x11, 2)
    assert bytes(port.sent[0][128:131]) == b"\x00\x01\x03"  # initial path


def test_lost_request_is_retried_with_a_fresh_tid_then_given_up() -> None:
    client, port, _ = _client(retries=1)
    port.drop = 1
    client.post(Request(MgmtClass.SUBN_LID, 1, SmpAttr.NODE_INFO, PortId(7)))
    assert client.poll(timeout=0) == []  # nothing yet; the retry went out
    assert len(port.sent) == 2 and port.sent[0][12:16] != port.sent[1][12:16]
    assert port.abandoned == [int.from_bytes(port.sent[0][12:16], "big")]  # told to the port
    port.flush()
    (rep,) = client.poll()
    assert rep.ok and rep.tries == 2 and client.stats["retried"] == 1
    port.drop = 2
    with pytest.raises(MadError, match=r"no response .* after 2 tries"):
        client.smp_get(SmpAttr.NODE_INFO, PortId(7))


def test_late_answer_to_an_abandoned_try_is_dropped() -> None:
    client, port, _ = _client(retries=0)
    port.drop = 0
    client.post(Request(MgmtClass.SUBN_LID, 1, SmpAttr.NODE_INFO, PortId(7)))
    late = port.deferred.pop()
    port.clock.now += 1.0
    (rep,) = client.poll()
    assert rep.mad is None
    assert port.on_mad is not None
    port.on_mad(late)
    assert client.poll(timeout=0) == [] and client.stats["stale"] == 1


def test_window_bounds_requests_in_flight_and_keeps_order() -> None:
    client, port, _ = _client()

    reqs = [Request(MgmtClass.SUBN_LID, 1, SmpAttr.NODE_INFO, PortId(lid)) for lid in range(1, 41)]
    original = client.poll

    def poll(timeout: float | None = None) -> list:  # type: ignore[type-arg]
        port.flush()
        return original(timeout)

    client.poll = poll  # type: ignore[method-assign]
    replies = client.call_many(reqs, window=8)
    assert [smp.NODE_INFO.decode(r.data)["node_guid"] for r in replies] == list(range(1, 41))
    assert port.max_in_flight == 8


def test_addresses_as_the_tools_take_them() -> None:
    assert parse_dr_path("0,1,3") == (1, 3)
    assert parse_dr_path("0") == ()
    assert parse_portid("0x10") == PortId(16)
    assert str(parse_portid("0,1", directed=True)) == "DR path slid 65535; dlid 65535; 0,1"
    assert str(PortId(3)) == "Lid 3"
    for bad in ("1,2", "", "0,x"):
        with pytest.raises(ValueError):
            parse_dr_path(bad)
    with pytest.raises(ValueError):
        PortId(0)
    with pytest.raises(ValueError):
        PortId(dr_path=(0,))


def test_patched_template_equals_a_checked_build() -> None:
    from ibal.mad.rpc.request import build_mad

    for to in (PortId(dr_path=(1, 3, 5)), PortId(dr_path=()), PortId(9), PortId(dr_path=(2,))):
        for attr, mod in ((SmpAttr.PORT_INFO, 3), (SmpAttr.NODE_INFO, 0)):
            cls = MgmtClass.SUBN_DR if to.directed else MgmtClass.SUBN_LID
            r = Request(cls, 1, attr, to, mod)
            want = header.build(cls, 1, attr, tid=0xABCD0001, attr_mod=mod, dr_path=to.dr_path)
            assert build_mad(r, 0xABCD0001) == want
    r = Request(MgmtClass.PERF, 2, 0x12, PortId(4), 0, b"\x00\x01\xff\xff")
    assert build_mad(r, 7) == header.build(MgmtClass.PERF, 2, 0x12, tid=7, data=b"\x00\x01\xff\xff")


class AnsweringPort(ScriptedPort):
    """Answers inside ``send`` (a synchronous port), or from a thread of its own in batches."""

    def __init__(self, clock: Clock, threaded: bool) -> None:
        super().__init__(clock)
        self.threaded = threaded
        self.on_mads: Callable[[list[bytes]], None] | None = None
        self.threads: set[str] = set()

    def start_batches(self, on_mads: Callable[[list[bytes]], None]) -> None:
        self.on_mads = on_mads

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        super().send(mad, to, qp, timeout_ms)
        answers, self.deferred = self.deferred, []
        if not answers:
            return
        if not self.threaded:
            assert self.on_mad is not None
            self.on_mad(answers[0])
            return
        assert self.on_mads is not None
        t = threading.Thread(target=self.on_mads, args=(answers,))
        t.start()
        self.threads.add(t.name)


@pytest.mark.parametrize("threaded", [False, True])
def test_drive_runs_a_chain_of_requests_where_the_answers_arrive(threaded: bool) -> None:
    """Each reply leads to the next hop until 6 hops; a lost request is retried by the
    caller's thread; the replies run where the port delivers them."""
    clock = Clock()
    port = AnsweringPort(clock, threaded)
    client = MadClient(port, timeout_ms=100, retries=2, clock=clock)
    port.drop = 1  # the first try of the first request is lost
    seen: list[tuple[int, str]] = []

    def on_reply(rep: Any) -> list[Request]:
        hops = smp.NODE_INFO.decode(rep.data)["node_guid"]
        seen.append((hops, threading.current_thread().name))
        if hops >= 6:
            return []
        nxt = PortId(dr_path=(1,) * (hops + 1))
        return [Request(MgmtClass.SUBN_DR, 1, SmpAttr.NODE_INFO, nxt)] * (2 if hops == 3 else 1)

    first = Request(MgmtClass.SUBN_DR, 1, SmpAttr.NODE_INFO, PortId(dr_path=(1,)))
    client.drive([first], on_reply, window=2)
    assert sorted(h for h, _ in seen) == [1, 2, 3, 4, 4, 5, 5, 6, 6]
    assert client.stats["retried"] == 1 and client.outstanding == 0
    if threaded:  # answers ran on the port's threads, the retried one's too
        assert {name for _, name in seen} <= port.threads
    with pytest.raises(ValueError):
        client.drive([first], on_reply, window=0)
