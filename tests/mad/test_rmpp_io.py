"""The RMPP driver over the AL timer service on a ManualClock: two agents, a lossy link."""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rmpp_sim import SA_LIKE_HEADER

from ibal.al.timer import TimerService
from ibal.clock import ManualClock
from ibal.transport.rmpp import Complete, Deliver, Fail, RmppSender
from ibal.transport.rmpp_io import Result, RmppTransfers
from ibal.wire.mad.rmpp import RmppStatus

LATENCY = 0.002


class Link:
    """Two RmppTransfers joined by timers that model the wire (loss by a seeded RNG)."""

    def __init__(self, loss: float, seed: int, ch: int = 20) -> None:
        self.clock = ManualClock()
        self.timers = TimerService(lambda fn, *a: fn(*a), self.clock)
        self.rng = random.Random(seed)
        self.loss = loss
        self.results: dict[str, list[tuple[Hashable, Result]]] = {"a": [], "b": []}
        opts: dict[str, Any] = {"total_timeout": 120.0, "linger": 200.0, "window": 8}
        self.a = RmppTransfers(self.timers, lambda k, r: self.results["a"].append((k, r)), ch,
                               opts)  # fmt: skip
        self.b = RmppTransfers(self.timers, lambda k, r: self.results["b"].append((k, r)), ch,
                               opts)  # fmt: skip
        self.packets = 0
        self.drop: Any = None  # optional (side, mad) -> bool, on top of the random loss

    def to(self, side: str) -> Any:
        dst = self.b if side == "b" else self.a
        back = "a" if side == "b" else "b"

        def send(mad: bytes) -> None:
            self.packets += 1
            if self.rng.random() < self.loss or (self.drop and self.drop(side, mad)):
                return
            self.timers.call_later(LATENCY, dst.feed, "t1", mad, self.to(back))

        return send


@settings(max_examples=25, deadline=None)
@given(size=st.integers(0, 66_000), loss=st.sampled_from([0.0, 0.05, 0.2]), seed=st.integers())
def test_transfer_over_timer_service(size: int, loss: float, seed: int) -> None:
    link = Link(loss, seed)
    data = random.Random(seed).randbytes(size)
    s = RmppSender(header=SA_LIKE_HEADER, data=data, class_header=bytes(range(20)),
                   resp_timeout=0.05, retries=20, total_timeout=100.0)  # fmt: skip
    link.a.send("t1", s, link.to("b"))
    link.clock.settle(max_seconds=1000)
    ra, rb = link.results["a"], link.results["b"]
    delivered = [r for _, r in rb if isinstance(r, Deliver)]
    assert len(delivered) <= 1
    if delivered:
        assert delivered[0].data == data and delivered[0].class_header == bytes(range(20))
    (res,) = [r for _, r in ra]
    if isinstance(res, Complete):
        assert len(delivered) == 1
    else:
        assert isinstance(res, Fail)
    if loss == 0.0:
        assert isinstance(res, Complete) and s.counters.resent == 0
    assert len(link.a) == 0 and len(link.timers) == 0  # everything retired, no timer left
    assert link.a.totals.malformed == 0 and link.b.totals.malformed == 0


def test_receiver_lingers_then_retires() -> None:
    link = Link(0.0, 1, ch=0)
    s = RmppSender(header=SA_LIKE_HEADER, data=bytes(1000), resp_timeout=0.05)
    link.a.send("t1", s, link.to("b"))
    link.clock.advance(1.0)
    assert [type(r) for _, r in link.results["a"]] == [Complete]
    assert len(link.b) == 1  # still answering duplicates
    link.clock.advance(300.0)
    assert len(link.b) == 0 and len(link.timers) == 0


def test_all_lost_fails_with_too_many_retries() -> None:
    link = Link(1.0, 1)
    s = RmppSender(header=SA_LIKE_HEADER, data=bytes(500), resp_timeout=0.1, retries=3)
    link.a.send("t1", s, link.to("b"))
    link.clock.settle()
    assert link.results["a"] == [("t1", Fail(RmppStatus.TOO_MANY_RETRIES, True))]
    assert link.packets == 4 + 1  # 1 + 3 retries of segment 1, then the ABORT
    assert link.results["b"] == []


def test_double_sided_request_and_response() -> None:
    """An RMPP request answered by an RMPP response on the same TID (e.g. SA GetMulti)."""
    link = Link(0.0, 3)
    req_hdr = bytes([1, 0x03, 2, 0x14]) + SA_LIKE_HEADER[4:]
    request, response = bytes(range(200)) * 3, bytes(range(100, 200)) * 30

    def answer() -> None:
        (_, d), = [(k, r) for k, r in link.results["b"] if isinstance(r, Deliver)]
        assert d.data == request and d.header[3] == 0x14
        hdr = d.header[:3] + bytes([0x94]) + d.header[4:]
        link.b.send("t1", RmppSender(header=hdr, data=response, class_header=bytes(20),
                                     resp_timeout=0.05), link.to("a"))  # fmt: skip

    # B's ACK of the request's last segment is lost: the response's first segment
    # acknowledges the request instead (the sender's switch)
    link.drop = lambda side, mad: (
        side == "a" and mad[25] == 2 and mad[28:32] == (3).to_bytes(4, "big"))
    link.b.on_result = lambda k, r: (
        link.results["b"].append((k, r)),
        isinstance(r, Deliver) and link.timers.call_later(0.01, answer),
    )
    s = RmppSender(header=req_hdr, data=request, class_header=bytes(20), resp_timeout=0.05)
    link.a.send("t1", s, link.to("b"))
    link.clock.settle(max_seconds=1000)
    ra = [r for _, r in link.results["a"]]
    assert ra[0] == Complete(switch=True)
    (got,) = [r for r in ra if isinstance(r, Deliver)]
    assert got.data == response and got.header[3] == 0x94
    assert [type(r) for _, r in link.results["b"]] == [Deliver, Complete]
    assert len(link.timers) == 0
