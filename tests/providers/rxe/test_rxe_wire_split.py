"""``wire.split_ip`` / ``split_ethernet`` on what is not a frame: ``None``, never an error.

Issue 25 §2: an IPv4 total length below 26 raised ``struct.error``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.providers.rxe import wire
from ibal.wire.packet import Opcode, Packet

SRC4, DST4 = b"\x0a\0\0\x01", b"\x0a\0\0\x02"


def _datagram() -> bytes:
    p = Packet(Opcode.RC_SEND_ONLY, 0x12, 7, b"payload!", ack_req=True)
    raw = wire.encode_bytes(p, wire.icrc_prefix(wire.ip_udp_headers(SRC4, DST4, 0xC000, 0)))
    return wire.ip_udp_headers(SRC4, DST4, 0xC000, len(raw)) + raw


@pytest.mark.parametrize("total", [0, 1, 20, 25, 26, 27])
def test_an_ipv4_total_length_below_the_headers_is_not_a_frame(total: int) -> None:
    bad = bytearray(_datagram())
    bad[2:4] = total.to_bytes(2, "big")
    assert wire.split_ip(bytes(bad)) is None
    assert wire.split_ethernet(b"\0" * 12 + b"\x08\x00" + bytes(bad)) is None


def test_a_udp_length_past_the_end_is_not_a_frame() -> None:
    bad = bytearray(_datagram())
    bad[24:26] = (len(bad) - 20 + 1).to_bytes(2, "big")
    assert wire.split_ip(bytes(bad)) is None
    assert wire.split_ip(_datagram()) is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.sampled_from([0x45, 0x60, 0x46, 0x00]), st.integers(0, 80))
def test_any_bytes_split_to_a_frame_or_none(tail: bytes, first: int, cut: int) -> None:
    data = (bytes([first]) + tail)[: cut + 1]
    f = wire.split_ip(data)
    assert f is None or len(f.ip_udp) in (28, 48)
    g = wire.split_ethernet(b"\0" * 12 + (b"\x86\xdd" if first == 0x60 else b"\x08\x00") + data)
    assert (g is None) == (f is None)
