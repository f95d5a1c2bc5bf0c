"""Golden frames from kernel rxe (tests/data/rxe-golden, made by tests/data/make_rxe_golden.py).

One frame per request opcode, as the lab guest's rdma_rxe put them on the
wire: the decoder must read them, the ICRC must match over the kernel's own
IP header (its IP ID included), and the encoder must rebuild them byte for byte.
Its answers (ACK, READ responses, atomic ACK; NAKs, the RNR NAK and duplicates'
answers) are checked the same way, and ibal's responder core, fed the same
requests, must give the same AETH syndromes, MSNs and PSNs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rxeharness import RW, Node, Region, make_node

from ibal.providers.rxe import wire
from ibal.types import QpState, QpType
from ibal.wire.packet import GSI_QKEY, Opcode, Packet, rnr_nak_syndrome
from ibal.wire.pcap import LINKTYPE_ETHERNET, read_pcap
from ibal.wire.tshark import tshark_decode, tshark_path

DATA = Path(__file__).resolve().parents[2] / "data" / "rxe-golden"
GOLDEN = DATA / "kernel-rxe-requests.pcap"
RESPONSES_PCAP = DATA / "kernel-rxe-responses.pcap"
NAKS_PCAP = DATA / "kernel-rxe-naks.pcap"  # with kernel-rxe-naks.json, its manifest
RESPONSES = {
    Opcode.RC_RDMA_READ_RESPONSE_FIRST, Opcode.RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode.RC_RDMA_READ_RESPONSE_LAST, Opcode.RC_RDMA_READ_RESPONSE_ONLY,
    Opcode.RC_ACKNOWLEDGE, Opcode.RC_ATOMIC_ACKNOWLEDGE,
}  # fmt: skip
REQUESTS = {op for op in Opcode if op.name.startswith(("RC_", "UC_", "UD_"))} - RESPONSES
FAKE_QPN = 0x000ABC  # the QP the guest addressed (make_rxe_golden.py)
SQ_PSN = 0x00FFF0


def frames(path: Path = GOLDEN) -> list[wire.Frame]:
    linktype, records = read_pcap(path)
    assert linktype == LINKTYPE_ETHERNET
    out = [wire.split_ethernet(r.data) for r in records]
    assert all(f is not None for f in out)
    return [f for f in out if f is not None]


def test_one_golden_frame_per_opcode() -> None:
    ops = [f.udp_payload[0] for f in frames()]
    assert sorted(ops) == ops and set(ops) == {int(o) for o in REQUESTS}
    ops = [f.udp_payload[0] for f in frames(RESPONSES_PCAP)]
    assert sorted(ops) == ops and set(ops) == {int(o) for o in RESPONSES}


def test_golden_frames_decode_check_their_icrc_and_reencode_exactly() -> None:
    for f in frames() + frames(RESPONSES_PCAP):
        prefix = wire.icrc_prefix(f.ip_udp)
        assert wire.icrc_ok(f.udp_payload, prefix)
        assert wire.encode_bytes(wire.decode_frame(f), prefix) == bytes(f.udp_payload)
    for f in frames():
        assert f.ip_udp[6] & 0x40 and f.ip_udp[4:6] != b"\0\0"  # DF and a kernel IP ID
        p = wire.decode_frame(f)
        assert (p.dest_qpn, p.pkey, p.tver, p.migreq) == (FAKE_QPN, 0xFFFF, 0, False)
        # kernel rxe's source ports follow roce-wire.md 2.6 (a fresh boot's QPNs 0x11..0x13)
        lqpn = {"RC": 0x11, "UC": 0x12}.get(Opcode(p.opcode).name[:2])
        want = wire.qp_udp_sport(0x13) if lqpn is None else wire.connected_udp_sport(
            0, lqpn, FAKE_QPN)  # fmt: skip
        assert f.sport == want


def test_golden_field_values() -> None:
    got = {Opcode(f.udp_payload[0]): wire.decode_frame(f) for f in frames()}
    first = got[Opcode.RC_RDMA_WRITE_FIRST]
    assert (first.va >> 12, first.rkey, first.dma_len, len(first.payload)) == (
        0x7F0000005, 0x12345678, 600, 256)  # fmt: skip
    assert got[Opcode.RC_SEND_FIRST].psn == SQ_PSN
    assert len(got[Opcode.RC_SEND_LAST].payload) == 600 - 2 * 256
    assert got[Opcode.RC_RDMA_READ_REQUEST].dma_len == 600 and not got[
        Opcode.RC_RDMA_READ_REQUEST].payload  # fmt: skip
    # READ of 3 packets reserves 3 PSNs: the next request's PSN is 3 further
    assert got[Opcode.RC_COMPARE_SWAP].psn == got[Opcode.RC_RDMA_READ_REQUEST].psn + 3
    cs, fa = got[Opcode.RC_COMPARE_SWAP], got[Opcode.RC_FETCH_ADD]
    assert (cs.compare, cs.swap_add, fa.swap_add) == (0x1111, 0x2222, 5)
    assert got[Opcode.RC_SEND_ONLY_INV].inv_rkey >> 8 == 0xABCD
    # AckReq on the last packet of RC messages only; never on UC; UD: not on this kernel
    assert [got[o].ack_req for o in (Opcode.RC_SEND_FIRST, Opcode.RC_SEND_LAST,
                                     Opcode.UC_SEND_LAST, Opcode.UD_SEND_ONLY)] == [
        False, True, False, False]  # fmt: skip
    ud = got[Opcode.UD_SEND_ONLY_IMM]
    assert (ud.qkey, ud.src_qpn, len(ud.payload)) == (0x11111111, 0x13, 20)
    assert ud.qkey != GSI_QKEY


def test_golden_responses() -> None:
    """Kernel rxe's answers to requests ibal encoded (make_rxe_golden.py: READ of 600
    bytes at PSN 0x102 at MTU 256, READ of 16 at 0x105, FETCH_ADD at 0x106)."""
    got = {Opcode(f.udp_payload[0]): wire.decode_frame(f) for f in frames(RESPONSES_PCAP)}
    psns = {op.name: (p.psn, p.syndrome, p.msn, len(p.payload)) for op, p in got.items()}
    assert psns == {
        "RC_ACKNOWLEDGE": (0x100, 0x1F, 1, 0),  # the SEND's ACK (the WRITE's was later)
        "RC_RDMA_READ_RESPONSE_FIRST": (0x102, 0x1F, 3, 256),
        "RC_RDMA_READ_RESPONSE_MIDDLE": (0x103, 0, 0, 256),  # no AETH
        "RC_RDMA_READ_RESPONSE_LAST": (0x104, 0x1F, 3, 88),
        "RC_RDMA_READ_RESPONSE_ONLY": (0x105, 0x1F, 4, 16),
        "RC_ATOMIC_ACKNOWLEDGE": (0x106, 0x1F, 5, 0),
    }
    # the responder's memory held (i * 7 + 3) & 0xFF at offset i
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(1100))
    read = got[Opcode.RC_RDMA_READ_RESPONSE_FIRST]
    assert bytes(read.payload) == pattern[:256]
    assert bytes(got[Opcode.RC_RDMA_READ_RESPONSE_ONLY].payload) == pattern[256:272]
    assert got[Opcode.RC_ATOMIC_ACKNOWLEDGE].orig == int.from_bytes(pattern[1024:1032], "little")
    assert {p.dest_qpn for p in got.values()} == {0x000DEF}


def test_golden_frames_decode_clean_in_tshark() -> None:
    if tshark_path() is None:
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail("tshark not installed (Debian package tshark)")
        pytest.skip("tshark not installed (Debian package tshark)")
    for path in (GOLDEN, RESPONSES_PCAP, NAKS_PCAP):
        seen = tshark_decode(path)
        assert [s.opcode for s in seen] == [f.udp_payload[0] for f in frames(path)]
        assert [s for s in seen if not s.clean] == []


NAKS = json.loads((DATA / "kernel-rxe-naks.json").read_text())
HOST_QPN = NAKS["host_qpn"]


def nak_runs() -> list[tuple[dict[str, Any], list[wire.Frame]]]:
    """Each responder run of the NAK capture with its frames (both directions)."""
    every = frames(NAKS_PCAP)
    return [(r, every[r["first_frame"] : r["first_frame"] + r["frames"]]) for r in NAKS["runs"]]


def answer(p: Packet) -> tuple[str, int, int, int, int]:
    return (Opcode(p.opcode).name, p.psn, p.syndrome, p.msn, p.orig)


def test_golden_nak_frames_decode_check_their_icrc_and_reencode_exactly() -> None:
    for f in frames(NAKS_PCAP):
        prefix = wire.icrc_prefix(f.ip_udp)
        assert wire.icrc_ok(f.udp_payload, prefix)
        assert wire.encode_bytes(wire.decode_frame(f), prefix) == bytes(f.udp_payload)


def test_golden_nak_syndromes() -> None:
    """What kernel rxe answered (make_rxe_golden.py nak_steps; rq_psn 0x100,
    min_rnr_timer 12, one receive posted)."""
    (run0, f0), (run1, f1) = nak_runs()
    kernel = [answer(wire.decode_frame(f)) for f in f0 if wire.decode_frame(f).dest_qpn == HOST_QPN]
    orig = kernel[1][4]
    assert kernel == [
        ("RC_ACKNOWLEDGE", 0x100, 0x1F, 1, 0),  # the SEND
        ("RC_ATOMIC_ACKNOWLEDGE", 0x101, 0x1F, 2, orig),  # the FETCH_ADD
        ("RC_ACKNOWLEDGE", 0x102, rnr_nak_syndrome(12), 2, 0),  # RNR NAK
        ("RC_ACKNOWLEDGE", 0x102, 0x60, 2, 0),  # PSN sequence error: the PSN expected
        ("RC_ATOMIC_ACKNOWLEDGE", 0x101, 0x1F, 2, orig),  # the duplicate: the saved answer
        ("RC_ACKNOWLEDGE", 0x101, 0x1F, 2, 0),  # the duplicate SEND: ACK of the newest PSN
        ("RC_ACKNOWLEDGE", 0x102, 0x62, 2, 0),  # remote access error
    ]
    assert len(run0["requests"]) == 7 and len(run1["requests"]) == 1
    k1 = [answer(wire.decode_frame(f)) for f in f1 if wire.decode_frame(f).dest_qpn == HOST_QPN]
    assert k1 == [("RC_ACKNOWLEDGE", 0x100, 0x61, 0, 0)]  # invalid request


def _ibal_responder(run: dict[str, Any]) -> Node:
    """An ibal RC core set up as the guest's responder QP was."""
    node = make_node("ibal", QpType.RC, run["qpn"], 0, b"\x0a\x00\x00\x02")
    cfg = node.cfg
    cfg.dest_qpn, cfg.dst_ip, cfg.mtu = HOST_QPN, b"\x0a\x00\x00\x01", NAKS["mtu"]
    cfg.access = int(RW)
    cfg.min_rnr_timer = NAKS["min_rnr_timer"]
    cfg.resp_res = cfg.init_depth = 4
    node.core.set_psns(0, NAKS["rq_psn"])
    for state in (QpState.INIT, QpState.RTR, QpState.RTS):
        node.core.set_state(state)
    mem = Region(bytearray(4096), run["addr"], RW, 0x4242, run["rkey"])
    node.mem.by_key = {mem.lkey: mem, mem.rkey: mem}
    node.post_recv(mem, NAKS["recv_len"], wr_id=1, offset=NAKS["recv_offset"])
    return node


def test_ibal_responder_answers_as_kernel_rxe_did() -> None:
    """The same requests fed to ibal's responder core: the same opcodes, PSNs, AETH
    syndromes and MSNs, request by request (atomic originals aside: memory differs)."""
    for run, fs in nak_runs():
        node = _ibal_responder(run)
        ours, kernel = [], []
        for f in fs:
            p = wire.decode_frame(f)
            if p.dest_qpn == HOST_QPN:
                kernel.append(answer(p)[:4])
                continue
            node.core.receive(p, 0.0)
            ours += [answer(q)[:4] for q in node.core.poll(0.0)]
        assert ours == kernel, run["requests"]
