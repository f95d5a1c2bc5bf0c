"""IBAL_CAPTURE for RoCEv2: frames written, read back, and decoded clean by tshark."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibal.providers.rxe import wire
from ibal.wire import packet as pk
from ibal.wire.packet import Opcode, Packet
from ibal.wire.pcap import LINKTYPE_ETHERNET, close_captures, read_pcap
from ibal.wire.tshark import tshark_decode, tshark_path

V4 = (bytes((10, 99, 0, 2)), bytes((10, 99, 0, 1)))
V6 = (bytes.fromhex("fd000000000000000000000000000002"),
      bytes.fromhex("fd000000000000000000000000000001"))  # fmt: skip


def require_tshark() -> None:
    if tshark_path() is None:
        msg = "tshark not installed (Debian package tshark)"
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def capture_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "roce.pcap"
    monkeypatch.setenv("IBAL_CAPTURE", str(path))
    yield path
    close_captures()


def every_opcode() -> list[Packet]:
    out = []
    for op in Opcode:
        payload = bytes(range(61)) if pk.OP_FLAGS[op] & pk.PAYLOAD else b""
        p = Packet(op, 0x000123, 0xFFFFFF, payload, ack_req=True)
        p.va, p.rkey, p.dma_len, p.qkey, p.src_qpn = 0x7F00_0000_1000, 0x1234, 61, 0x11111111, 7
        p.syndrome, p.msn, p.imm, p.inv_rkey, p.orig = 0x1F, 9, 0xCAFE, 0x4321, 5
        out.append(p)
    return out


def test_capture_of_every_opcode_reads_back_and_decodes_clean(capture_file: Path) -> None:
    w = wire.rxe_capture()
    assert w is not None and w is wire.rxe_capture()  # one writer per file
    sent = []
    for src, dst in (V4, V6):
        for p in every_opcode():
            n = pk.HDR_LEN[p.opcode] + len(p.payload) + (-len(p.payload) & 3) + pk.ICRC_LEN
            sport = wire.qp_udp_sport(p.dest_qpn)
            prefix = (wire.icrc_prefix_ipv4 if len(src) == 4 else wire.icrc_prefix_ipv6)(
                src, dst, n, sport
            )
            raw = wire.encode_bytes(p, prefix)
            w.write(wire.capture_frame(raw, src, dst, sport))
            sent.append((src, p.opcode, raw))
    close_captures()

    linktype, records = read_pcap(capture_file)
    assert linktype == LINKTYPE_ETHERNET and len(records) == len(sent)
    for rec, (src, op, raw) in zip(records, sent, strict=True):
        frame = wire.split_ethernet(rec.data)
        assert frame is not None and bytes(frame.udp_payload) == raw
        got = wire.decode_frame(frame)  # checks the ICRC over the captured IP header
        assert (got.opcode, got.src_ip) == (op, src)

    require_tshark()
    seen = tshark_decode(capture_file)
    assert [s.opcode for s in seen] == [op for _, op, _ in sent]
    assert [s for s in seen if not s.clean] == []
    assert {s.psn for s in seen} == {0xFFFFFF} and {s.dest_qp for s in seen} == {0x123}


def test_no_capture_without_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IBAL_CAPTURE", raising=False)
    assert wire.rxe_capture() is None
    w = wire.rxe_capture(str(tmp_path / "opt.pcap"))  # a device option needs no variable
    assert w is not None
    close_captures()
    assert read_pcap(tmp_path / "opt.pcap") == (LINKTYPE_ETHERNET, [])
