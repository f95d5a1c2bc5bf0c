"""RMPP sender and receiver back to back: exact delivery under loss, aborts, malformed input."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rmpp_sim import SA_LIKE_HEADER, Sim

from ibal.transport.rmpp import TRANSITIONS, Fail, RmppReceiver, RmppSender, State, Transmit
from ibal.wire.mad.rmpp import (
    RMPP_HEADER,
    SEGMENT_AREA,
    RmppFlags,
    RmppHeader,
    RmppStatus,
    RmppType,
    with_rmpp,
)

HDR = SA_LIKE_HEADER


def sender(data: bytes, ch: bytes = b"", **kw: object) -> RmppSender:
    return RmppSender(header=HDR, data=data, class_header=ch, **kw)  # type: ignore[arg-type]


def test_header_table_layout() -> None:
    raw = RMPP_HEADER.encode(
        version=1, type=RmppType.DATA, resp_time=0x1F, flags=RmppFlags.ACTIVE | RmppFlags.FIRST,
        status=0, segment_number=1, payload_length=0x1234,
    )  # fmt: skip
    assert raw == bytes([1, 1, 0xFB, 0]) + (1).to_bytes(4, "big") + (0x1234).to_bytes(4, "big")
    assert "RMPPType: DATA (0x1)" in RMPP_HEADER.dump(raw)


@pytest.mark.parametrize(("size", "ch"), [(0, 0), (1, 0), (220, 0), (221, 0), (0, 20), (200, 20),
                                          (201, 20), (5000, 20)])  # fmt: skip
def test_segment_headers(size: int, ch: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    s = sender(data[:size], bytes(range(100, 100 + ch)))
    per = SEGMENT_AREA - ch
    n = max(1, -(-size // per))
    assert s.count == n
    pad = n * per - size
    for i in range(1, n + 1):
        seg = s.segment(i)
        h = RmppHeader.of(seg)
        assert (h.version, h.type, h.segment_number, h.status) == (1, RmppType.DATA, i, 0)
        assert bool(h.flags & RmppFlags.FIRST) == (i == 1)
        assert bool(h.flags & RmppFlags.LAST) == (i == n)
        assert h.flags & RmppFlags.ACTIVE
        if i == n:
            assert h.payload_length == SEGMENT_AREA - pad
        elif i == 1:
            assert h.payload_length == n * SEGMENT_AREA - pad
        else:
            assert h.payload_length == 0
        assert seg[:24] == HDR
        assert seg[36 : 36 + ch] == bytes(range(100, 100 + ch))
        chunk = data[:size][(i - 1) * per : i * per]
        assert seg[36 + ch :] == chunk + bytes(per - len(chunk))


def _check_run(sim: Sim, data: bytes, ch: bytes) -> None:
    a, b = sim.a, sim.b
    s = sim.sender
    assert s.finished
    assert len(b.delivered) <= 1
    for d in b.delivered:
        assert d.data == data and d.class_header == ch and d.header == HDR
    assert s.counters.malformed == 0
    if b.machine is not None:
        assert b.machine.counters.malformed == 0
        assert b.machine.state in (State.DONE, State.CLOSED, State.FAILED)
    if a.completed:
        assert s.state is State.COMPLETE and len(b.delivered) == 1 and not a.failed
    else:
        (fail,) = a.failed
        if b.delivered:
            # only lost ACKs can leave a delivered message unacknowledged
            assert fail.status in (RmppStatus.TOO_MANY_RETRIES, RmppStatus.TOTAL_TIME_TOO_LONG)
        elif b.machine is not None:
            (bf,) = b.failed
            if not bf.sent:
                assert bf.status == fail.status
            if not fail.sent:
                assert fail.status == bf.status


def test_clean_transfer_counts() -> None:
    data = bytes(range(256)) * 40
    sim = Sim(sender(data, bytes(20), resp_timeout=0.1), receiver_args={"class_header_size": 20})
    sim.run()
    _check_run(sim, data, bytes(20))
    assert sim.a.completed and sim.sender.counters.resent == 0
    n = sim.sender.count
    data_pkts = [m for f, m, _ in sim.wire if f == "a"]
    acks = [RmppHeader.of(m) for f, m, _ in sim.wire if f == "b"]
    assert len(data_pkts) == n
    # window opened by the first ACK, then one ACK per window of 16, and one for the last
    assert [(h.segment_number, h.payload_length) for h in acks][:2] == [(1, 17), (17, 33)]
    assert acks[-1].segment_number == n
    # ACKs answer in the other direction: response bit flipped
    assert all(m[3] == HDR[3] ^ 0x80 for f, m, _ in sim.wire if f == "b")


FATES = st.sampled_from(["ok", "ok", "ok", "drop", "dup", "late"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.one_of(st.integers(0, 1000), st.integers(1000, 70_000)),
    ch=st.sampled_from([0, 20]),
    fates=st.lists(FATES, max_size=80),
    window=st.integers(1, 40),
    retries=st.integers(0, 6),
)
def test_lossy_channel(size: int, ch: int, fates: list[str], window: int, retries: int) -> None:
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    chb = bytes(range(7, 7 + ch))
    s = sender(data, chb, resp_timeout=0.5, retries=retries, total_timeout=400.0)
    sim = Sim(
        s, fates,
        receiver_args={"class_header_size": ch, "window": window, "total_timeout": 400.0,
                       "linger": 500.0},
    )  # fmt: skip
    sim.run()
    _check_run(sim, data, chb)
    if set(fates) <= {"ok", "dup"}:  # no loss and no packet later than a time-out
        assert sim.a.completed and len(sim.b.delivered) == 1


def test_every_segment_lost_once_still_arrives() -> None:
    data = bytes(range(250)) * 12
    seen: set[int] = set()

    def first_copy_lost(frm: str, mad: bytes) -> str:
        seg = RmppHeader.of(mad).segment_number
        if frm == "a" and seg not in seen:
            seen.add(seg)
            return "drop"
        return "ok"

    sim = Sim(sender(data, resp_timeout=0.2, retries=3), receiver_args={"window": 4},
              policy=first_copy_lost)  # fmt: skip
    sim.run()
    _check_run(sim, data, b"")
    assert sim.a.completed and sim.sender.counters.resent > 0


def test_retries_exhausted_both_fail_same_status() -> None:
    sim = Sim(sender(bytes(1000), resp_timeout=0.2, retries=2), ["ok"] + ["drop"] * 3)
    sim.run()
    (af,) = sim.a.failed
    assert af == Fail(RmppStatus.TOO_MANY_RETRIES, True)
    (bf,) = sim.b.failed
    assert bf.status == RmppStatus.TOO_MANY_RETRIES and not bf.sent
    aborts = [RmppHeader.of(m) for f, m, _ in sim.wire if f == "a" and m[25] == RmppType.ABORT]
    assert [h.status for h in aborts] == [RmppStatus.TOO_MANY_RETRIES]


def test_receiver_total_timeout_aborts() -> None:
    # the sender goes quiet after the first segment: the receiver gives up first
    sim = Sim(
        sender(bytes(2000), resp_timeout=5.0, retries=100, total_timeout=1000.0),
        ["ok", "drop"] + ["drop"] * 1000,
        {"total_timeout": 3.0},
    )
    sim.run()
    (bf,) = sim.b.failed
    assert bf == type(bf)(RmppStatus.TOTAL_TIME_TOO_LONG, True)
    (af,) = sim.a.failed
    assert af.status == RmppStatus.TOO_MANY_RETRIES or af.status == RmppStatus.TOTAL_TIME_TOO_LONG


def test_receiver_stop_when_too_large() -> None:
    sim = Sim(sender(bytes(5000)), receiver_args={"max_size": 1000})
    sim.run()
    stop = [RmppHeader.of(m) for f, m, _ in sim.wire if f == "b"][-1]
    assert (stop.type, stop.status) == (RmppType.STOP, RmppStatus.RESOURCES_EXHAUSTED)
    assert sim.a.failed[0] == type(sim.a.failed[0])(RmppStatus.RESOURCES_EXHAUSTED, False)
    assert sim.b.failed[0].sent and not sim.b.delivered


def _rx() -> RmppReceiver:
    rx = RmppReceiver(class_header_size=0)
    rx.start(0.0)
    return rx


def _abort_status(actions: list[object]) -> tuple[int, int]:
    (send,) = [a for a in actions if isinstance(a, Transmit)]
    h = RmppHeader.of(send.mad)
    return h.type, h.status


SEG1 = sender(bytes(1000)).segment(1)


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"type": 9}, RmppStatus.BAD_TYPE),
        ({"type": RmppType.ACK}, RmppStatus.BAD_TYPE),
        ({"version": 2}, RmppStatus.UNSUPPORTED_VERSION),
        ({"segment_number": 0}, RmppStatus.INCONSISTENT_FIRST_SEGMENT),
        ({"segment_number": 2}, RmppStatus.INCONSISTENT_FIRST_SEGMENT),
        ({"flags": RmppFlags.ACTIVE}, RmppStatus.INCONSISTENT_FIRST_SEGMENT),
        ({"flags": 7}, RmppStatus.INCONSISTENT_LAST_LENGTH),  # Last but PayloadLength says 5 segs
        ({"flags": 7, "payload_length": 300}, RmppStatus.INCONSISTENT_LAST_LENGTH),
        ({"status": 5}, RmppStatus.ILLEGAL_STATUS),
    ],
)
def test_malformed_first_segment_is_aborted(fields: dict[str, int], status: RmppStatus) -> None:
    h = RmppHeader.of(SEG1)
    vals = {n: getattr(h, n) for n in RMPP_HEADER.names} | fields
    raw = bytearray(SEG1)
    RMPP_HEADER.pack_into(raw, 24, *(vals[n] for n in RMPP_HEADER.names))
    rx = _rx()
    acts = rx.handle(bytes(raw), 0.1)
    assert _abort_status(acts) == (RmppType.ABORT, status)
    assert rx.state is State.FAILED and rx.counters.malformed == 1
    assert rx.handle(SEG1, 0.2) == []  # a failed receiver stays quiet


def test_segment_beyond_window_and_short_mads() -> None:
    rx = _rx()
    s = sender(bytes(5000))
    rx.handle(s.segment(1), 0.0)  # window now 1..17
    assert rx.handle(s.segment(5), 0.0) == []  # a gap: dropped, not fatal
    assert rx.counters.dropped == 1
    assert _abort_status(rx.handle(s.segment(20), 0.0)) == (RmppType.ABORT,
                                                             RmppStatus.SEGMENT_TOO_BIG)
    rx2 = _rx()
    for junk in (b"", bytes(10), bytes(256)):
        assert rx2.handle(junk, 0.0) == []
    assert rx2.state is State.RECEIVING


def test_sender_rejects_bad_acks() -> None:
    s = sender(bytes(1000))
    s.start(0.0)
    ack = with_rmpp(bytearray(SEG1), version=1, type=RmppType.ACK, flags=1, segment_number=3,
                    payload_length=5)  # fmt: skip
    acts = s.handle(ack, 0.1)  # segment 3 was never sent
    assert _abort_status(acts) == (RmppType.ABORT, RmppStatus.SEGMENT_TOO_BIG)
    s2 = sender(bytes(1000))
    s2.start(0.0)
    ack = with_rmpp(bytearray(SEG1), version=1, type=RmppType.ACK, flags=1, segment_number=1,
                    payload_length=0)  # fmt: skip
    assert _abort_status(s2.handle(ack, 0.1)) == (RmppType.ABORT,
                                                  RmppStatus.WINDOW_LAST_TOO_SMALL)
    s3 = sender(bytes(1000))
    s3.start(0.0)
    ab = with_rmpp(bytearray(SEG1), version=1, type=RmppType.ABORT, flags=1, status=3)
    assert s3.handle(ab, 0.1)[-1] == Fail(RmppStatus.UNSPECIFIED, False)  # status 3: illegal
    assert s3.handle(ab, 0.2) == [] and s3.counters.dropped == 1


@settings(deadline=None)
@given(st.binary(min_size=0, max_size=300), st.integers(0, 300))
def test_garbage_never_crashes(junk: bytes, at: int) -> None:
    rx = _rx()
    rx.handle(SEG1, 0.0)
    mad = bytearray(SEG1)
    mad[24 : 24 + len(junk)] = junk[: 232]
    rx.handle(bytes(mad[: max(at, 0)]), 0.1)
    s = sender(bytes(700))
    s.start(0.0)
    s.handle(bytes(mad), 0.1)
    assert rx.state in State and s.state in State


def test_double_sided_switch() -> None:
    s = sender(bytes(300))
    s.start(0.0)
    s.handle(with_rmpp(bytearray(SEG1), version=1, type=RmppType.ACK, flags=1,
                       segment_number=1, payload_length=2), 0.1)  # fmt: skip
    assert s.state is State.WAIT_LAST_ACK
    resp = bytearray(sender(bytes(10)).segment(1))
    resp[3] ^= 0x80  # the response's first DATA segment
    acts = s.handle(bytes(resp), 0.2)
    assert s.state is State.COMPLETE and acts[-1] == type(acts[-1])(switch=True)


def test_transition_table_is_closed() -> None:
    who = {w for w, *_ in TRANSITIONS}
    assert who == {"sender", "receiver"}
    assert all(isinstance(a, State) and isinstance(b, State) for _, a, _, b in TRANSITIONS)


def test_sender_total_timeout_before_retries_run_out() -> None:
    sim = Sim(sender(bytes(1000), resp_timeout=1.0, retries=50, total_timeout=3.5),
              ["drop"] * 100)  # fmt: skip
    sim.run()
    assert sim.a.failed == [Fail(RmppStatus.TOTAL_TIME_TOO_LONG, True)]
    assert sim.clock.now() == pytest.approx(3.5)
    assert sim.b.machine is None  # nothing ever arrived


def test_lost_final_ack_is_resent_not_redelivered() -> None:
    lost = {"n": 0}

    def drop_first_last_ack(frm: str, mad: bytes) -> str:
        h = RmppHeader.of(mad)
        if frm == "b" and h.segment_number == 5 and lost["n"] == 0:
            lost["n"] += 1
            return "drop"
        return "ok"

    s = sender(bytes(range(250)) * 4, resp_timeout=0.3)  # 5 segments
    sim = Sim(s, receiver_args={"window": 8, "linger": 10.0}, policy=drop_first_last_ack)
    sim.run()
    assert s.count == 5 and lost["n"] == 1
    assert sim.a.completed and len(sim.b.delivered) == 1
    assert s.counters.resent >= 1 and sim.b.machine is not None
    assert sim.b.machine.counters.duplicates >= 1 and sim.b.machine.state is State.CLOSED


def test_sender_drops_late_segments_of_the_other_direction() -> None:
    s = sender(bytes(3000))
    s.start(0.0)
    req = bytearray(sender(bytes(500)).segment(2))
    req[3] ^= 0x80  # a late segment of the request this sender answers
    assert s.handle(bytes(req), 0.1) == [] and s.state is State.SENDING
    assert s.counters.dropped == 1 and s.counters.malformed == 0
    own = sender(bytes(500)).segment(1)  # DATA in the sender's own direction
    assert _abort_status(s.handle(own, 0.2)) == (RmppType.ABORT, RmppStatus.BAD_TYPE)
