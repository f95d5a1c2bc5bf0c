"""The mock fabric's capture: every transmitted message as InfiniBand frames tshark decodes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mockenv import UD_QKEY, connect, open_node, ud_ready

from ibal.providers.mock import MockFabric
from ibal.providers.mock.capture import ib_frame, ib_packets
from ibal.providers.mock.packets import Packet, PacketOp
from ibal.types import (
    AccessFlags,
    AvAttr,
    BindWr,
    Grh,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    UdDest,
    WcStatus,
    WrType,
)
from ibal.wire import iba
from ibal.wire.pcap import LINKTYPE_INFINIBAND, close_captures, read_pcap
from ibal.wire.tshark import WIRESHARK_IB_PREF, tshark_decode, tshark_path


def _traffic(fabric: MockFabric) -> None:
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, qb = connect(a, b)
    a.buf[0:3000] = bytes(range(250)) * 12
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 4096)])])
    a.ca.post_send(qa, [
        SendWr(1, WrType.SEND, [a.sge(0, 3000)], send_opt=SendOpt.SIGNALED | SendOpt.SOLICITED),
        SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 5)], remote_addr=b.addr(8000), rkey=b.mr.rkey),
        SendWr(3, WrType.RDMA_READ, [a.sge(4000, 2500)], remote_addr=b.addr(0), rkey=b.mr.rkey),
        SendWr(4, WrType.FETCH_ADD, [a.sge(7000, 8)], remote_addr=b.addr(9000),
               rkey=b.mr.rkey, compare_add=5),
        SendWr(5, WrType.COMPARE_SWAP, [a.sge(7008, 8)], remote_addr=b.addr(9000),
               rkey=b.mr.rkey, compare_add=5, swap=9),
    ])  # fmt: skip
    assert [w.wr_id for w in a.poll()] == [1, 2, 3, 4, 5]
    assert bytes(a.buf[4000:6500]) == bytes(b.buf[0:2500])
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid, grh=Grh(dgid=b.ca.ports[0].gid)))
    b.ca.post_recv(ub, [RecvWr(9, [b.sge(0, 100)])])
    a.ca.post_send(ua, [SendWr(6, WrType.SEND, [a.sge(0, 9)], send_opt=SendOpt.SIGNALED,
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    assert [w.wr_id for w in a.poll()] == [6]


# The requests go out back to back (initiator depth 4), then the responses:
# RC SEND of 3000 bytes at MTU 1024 = FIRST, MIDDLE, LAST; WRITE ONLY; READ request;
# FETCH_ADD; CMP_SWAP; ACK x2; READ response FIRST, MIDDLE, LAST; atomic ACK x2;
# then a UD SEND with a GRH.
EXPECTED = [0x00, 0x01, 0x02, 0x0A, 0x0C, 0x14, 0x13, 0x11, 0x11, 0x0D, 0x0E, 0x0F,
            0x12, 0x12, 0x64]  # fmt: skip


def test_mock_capture_writes_ib_frames_tshark_decodes(tmp_path: Path) -> None:
    path = tmp_path / "mock.pcap"
    fabric = MockFabric(seed=0, capture=str(path))
    fabric.add_ca()
    fabric.add_ca()
    fabric.manual_clock()
    try:
        _traffic(fabric)
    finally:
        fabric.close()
        close_captures()
    capture = tmp_path / "mock-ib.pcap"  # an IB capture goes next to the Ethernet one
    linktype, records = read_pcap(capture)
    assert linktype == LINKTYPE_INFINIBAND
    opcodes = [r.data[8 + (40 if r.data[1] & 3 == 3 else 0)] for r in records]
    assert opcodes == EXPECTED
    # the frames' transport headers decode with the RoCEv2 codec (payload after LRH[+GRH])
    for r in records:
        start = 48 if r.data[1] & 3 == 3 else 8
        p = iba.decode(r.data[start:-2])
        assert ((r.data[4] << 8 | r.data[5]) & 0x7FF) * 4 == len(r.data) - 2  # PktLen
        assert p.pkey == 0xFFFF
    if tshark_path() is None:
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail("tshark not installed (Debian package tshark)")
        pytest.skip("tshark not installed (Debian package tshark)")
    seen = tshark_decode(capture)
    assert [s.opcode for s in seen] == EXPECTED
    assert [s for s in seen if not s.clean] == []


def test_capture_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBAL_CAPTURE", str(tmp_path / "env.pcap"))
    fabric = MockFabric.from_options({"cas": 2, "manual_clock": True})
    try:
        assert fabric.capture is not None
        _traffic(fabric)
    finally:
        fabric.close()
        close_captures()
    assert len(read_pcap(tmp_path / "env-ib.pcap")[1]) == len(EXPECTED)
    monkeypatch.delenv("IBAL_CAPTURE")
    off = MockFabric()
    assert off.capture is None
    off.close()


def test_nak_and_rnr_map_to_aeth_syndromes() -> None:
    fabric = MockFabric()
    fabric.add_ca()
    fabric.add_ca()
    try:
        pa, pb = fabric.cas[0].ports[0], fabric.cas[1].ports[0]
        for op, syn, want in ((PacketOp.NAK, 2, 0x62), (PacketOp.RNR_NAK, 12, 0x2C),
                              (PacketOp.ACK, 0, 0x1F)):  # fmt: skip
            m = Packet(op, QpType.RC, pa, pb, (), 5, 6, 77, 0xFFFF)
            m.syndrome = syn
            (p,) = ib_packets(m)
            assert (p.opcode, p.syndrome, p.psn, p.dest_qpn) == (0x11, want, 77, 6)
            assert ib_frame(m, p)[8] == 0x11
    finally:
        fabric.close()


def test_send_with_invalidate_carries_the_ieth(tmp_path: Path) -> None:
    """A SEND with invalidate goes out as SEND LAST/ONLY with invalidate (0x16/0x17) with the
    R_Key in an IETH, which the RoCEv2 codec and tshark decode."""
    path = tmp_path / "inv.pcap"
    fabric = MockFabric(seed=0, capture=str(path))
    fabric.add_ca()
    fabric.add_ca()
    fabric.manual_clock()
    try:
        a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
        qa, qb = connect(a, b)
        mw, key = b.ca.create_mw(b.pd, 2)
        rkeys = []
        for i in range(2):
            new = (key & ~0xFF) | ((key + 1 + i) & 0xFF)
            b.ca.post_send(qb, [SendWr(10 + i, WrType.BIND_MW, rkey=new, mw=mw,
                                       bind=BindWr(b.mr.handle, b.addr(0), 4096,
                                                   AccessFlags.RDMA_WRITE, key))])  # fmt: skip
            assert [(w.wr_id, w.status) for w in b.poll()] == [(10 + i, WcStatus.SUCCESS)]
            b.ca.post_recv(qb, [RecvWr(20 + i, [b.sge(0, 4096)])])
            size = 3000 if i == 0 else 16
            a.ca.post_send(qa, [SendWr(i, WrType.SEND_WITH_INV, [a.sge(0, size)],
                                       invalidate_rkey=new)])  # fmt: skip
            assert [(w.wr_id, w.status) for w in a.poll()] == [(i, WcStatus.SUCCESS)]
            (recv,) = b.poll()
            assert recv.recv_opt & RecvOpt.INVALIDATE and recv.invalidated_rkey == new
            rkeys.append(new)
            key = new
    finally:
        fabric.close()
        close_captures()
    _, records = read_pcap(tmp_path / "inv-ib.pcap")
    sends = [iba.decode(r.data[8:-2]) for r in records if r.data[8] != 0x11]
    assert [p.opcode for p in sends] == [0x00, 0x01, 0x16, 0x17]
    assert [p.inv_rkey for p in sends if p.opcode in (0x16, 0x17)] == rkeys
    exe = tshark_path()
    if exe is None:
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail("tshark not installed (Debian package tshark)")
        pytest.skip("tshark not installed (Debian package tshark)")
    seen = tshark_decode(tmp_path / "inv-ib.pcap")
    assert [s for s in seen if not s.clean] == []
    out = subprocess.run([exe, "-n", "-r", str(tmp_path / "inv-ib.pcap"), "--disable-protocol",
                          "rpcordma", "-o", WIRESHARK_IB_PREF, "-Y", "infiniband.ieth", "-T",
                          "fields", "-e", "infiniband.bth.opcode", "-e", "infiniband.ieth"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    # tshark 4.0 lists the IETH R_Key field twice per packet: one value either way
    assert [(int(op), *{bytes.fromhex(v) for v in k.split(",")}) for op, k in rows] == [
        (0x16, rkeys[0].to_bytes(4, "big")), (0x17, rkeys[1].to_bytes(4, "big"))]  # fmt: skip
