"""The seam where RMPP sessions (ibal.transport.rmpp) plug into a MAD service."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
from mad_world import SET, VENDOR, Net, mad

from ibal.mad import MadElement, MadService, MadSvcType
from ibal.status import InvalidSetting, Unsupported
from ibal.testing.helpers import wait_until
from ibal.types import MAD_SIZE, MadAddr, WcStatus

HALF = MAD_SIZE - 36  # payload per segment after the MAD and RMPP headers


class TwoSegments:
    """A stand-in for the RMPP sessions: cuts a 2-segment message, glues it back."""

    def __init__(self) -> None:
        self.service: MadService | None = None
        self.started: list[Hashable] = []
        self.segments: dict[Hashable, list[bytes]] = {}

    def start(self, key: Hashable, element: MadElement, send: Callable[[bytes], None]) -> None:
        self.started.append(key)
        head, body = bytes(element.mad[:36]), bytes(element.mad[36:])
        for i, flags in ((0, 0x03), (1, 0x05)):  # active|first, active|last
            seg = bytearray(head + body[i * HALF : (i + 1) * HALF])
            seg[24:28] = bytes([1, 1, flags, 0])
            send(bytes(seg))
        assert self.service is not None
        self.service.rmpp_send_done(element, WcStatus.SUCCESS)

    def feed(self, key: Hashable, mad: bytes, addr: MadAddr, send: Callable[[bytes], None]
             ) -> bool:
        got = self.segments.setdefault(key, [])
        got.append(mad)
        if len(got) == 2:
            whole = got[0][:36] + got[0][36:] + got[1][36:]
            assert self.service is not None
            self.service.rmpp_message_in(whole, addr)
        return True


def test_an_rmpp_service_hands_segments_to_its_sessions_and_back(mock_net: Net) -> None:
    net = mock_net
    sender, s_in = net.service(net.a, svc_type=MadSvcType.RMPP)
    receiver, r_in = net.service(net.b, methods={SET}, svc_type=MadSvcType.RMPP)
    e = sender.pool_key.get_mad(36 + 2 * HALF)
    e.mad[:MAD_SIZE] = mad(VENDOR, SET, tid=5)
    e.mad[36:] = bytes(i % 251 for i in range(2 * HALF))
    e.addr, e.rmpp_version = net.b.addr(), 1
    with pytest.raises(Unsupported):  # no sessions plugged in yet
        sender.send(e)
    e.rmpp_version = 2
    with pytest.raises(InvalidSetting):
        sender.send(e)
    e.rmpp_version = 1
    # Without sessions at the receiver, RMPP segments are dropped and counted.
    seg = mad(VENDOR, SET, tid=9)
    seg[24:28] = bytes([1, 1, 0x03, 0])
    plain = net.service(net.a)[0]
    one = plain.pool_key.get_mad()
    one.mad[:], one.addr = seg, net.b.addr()
    plain.send(one)
    wait_until(lambda: receiver.stats["dropped_rmpp_unsupported"] == 1, "the drop")
    tx, rx = TwoSegments(), TwoSegments()
    tx.service, rx.service = sender, receiver
    sender.rmpp, receiver.rmpp = tx, rx
    sender.send(e)
    assert s_in.sent() is e and e.status is WcStatus.SUCCESS
    got = r_in.recv()
    assert got.size == e.size and bytes(got.mad[36:]) == bytes(e.mad[36:])
    assert len(tx.started) == 1 and len(rx.segments) == 1
