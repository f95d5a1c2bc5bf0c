"""Chapter: moving data, per transport and opcode (loopback and across two CAs)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import pytest

from ibal.testing.helpers import (
    GRH_BYTES,
    UD_QKEY,
    Pair,
    Side,
    atomic_result_ok,
    common_mtu,
    connect,
    make_side,
    mr_access,
    wait_until,
    wait_wc,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require_opcode, require_qp_type
from ibal.types import (
    DgrmInfo,
    PortAttr,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    UdDest,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.ci import Capabilities

Peer = tuple["Ca", PortAttr]

IMM = 0xC0FFEE42


class DataPathChecks(ConformanceBase):
    chapter = "data path"

    # ----------------------------------------------------- any transport
    @rules("ci:50")
    def test_completions_go_to_their_own_cqs(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 50 / IBA 10.2.4: a QP's send completions go to its send CQ and its
        receive completions to its receive CQ, never to the other."""
        from ibal.al import QpCreate

        caps = ca.capabilities
        qp_type = QpType.RC if QpType.RC in caps.qp_types else QpType.UD
        require_qp_type(caps, qp_type)
        pd = ca.alloc_pd()
        buf = bytearray(4096)
        mr = pd.reg_mem(buf, mr_access(caps))
        sides = []
        for _ in range(2):
            scq, rcq = ca.create_cq(16), ca.create_cq(16)
            qp = pd.create_qp(
                QpCreate(qp_type, send_cq=scq, recv_cq=rcq, sq_depth=8, rq_depth=8)
            )
            side = Side(ca, port, pd, rcq, buf, mr, qp)
            side.extra["send_cq"] = scq
            sides.append(side)
        a, b = sides
        connect(a, b, caps)
        pair = Pair(qp_type, a, b, caps)
        for src, dst, base in ((a, b, 0), (b, a, 2)):
            dst.recv(base + 1, 2048, 512)
            ud = pair.ud(dst) if qp_type.is_datagram else None
            src.qp.post_send(SendWr(wr_id=base + 2, sg_list=[src.sge(0, 16)], ud=ud))
            sent = wait_wc(src.extra["send_cq"])
            got = wait_wc(dst.cq)
            assert (sent.wr_id, sent.wc_type, sent.qp_num) == (base + 2, WcType.SEND, src.qp.num)
            assert (got.wr_id, got.wc_type, got.qp_num) == (base + 1, WcType.RECV, dst.qp.num)
            assert src.cq.poll(4) == [] and dst.extra["send_cq"].poll(4) == []

    @rules("iba:wc.fields")
    def test_wr_id_keeps_64_bits(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.9 (``ib_send_wr_t.wr_id`` is 64 bits): send and receive completions
        return the consumer's wr_id unchanged, all 64 bits."""
        caps = ca.capabilities
        qp_type = QpType.RC if QpType.RC in caps.qp_types else QpType.UD
        pair = self.loop(ca, port, qp_type)
        big, other = 0xFEDC_BA98_7654_3210, 0x8000_0001_0000_0002
        sent, got = pair.send(b"wide ids", wr_id=big, recv_id=other)
        assert (sent.wr_id, got.wr_id) == (big, other)

    # ---------------------------------------------------------------- RC
    @rules("doc:ci-contract §2.9", "doc:access-layer §5.9")
    def test_rc_send_lands(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.9 / access-layer §5.9: an RC SEND lands; both completions name WR, QP,
        length."""
        pair = self.pair(ca, port, peer, QpType.RC)
        sent, got = pair.send(b"hello, fabric", dst_off=256, wr_id=11, recv_id=22)
        assert (sent.wr_id, sent.wc_type, sent.status, sent.qp_num) == (
            11,
            WcType.SEND,
            WcStatus.SUCCESS,
            pair.a.qp.num,
        )
        assert (got.wr_id, got.wc_type, got.status, got.qp_num, got.length) == (
            22,
            WcType.RECV,
            WcStatus.SUCCESS,
            pair.b.qp.num,
            13,
        )
        assert not got.recv_opt & RecvOpt.IMMEDIATE
        assert pair.b.get(256, 13) == b"hello, fabric"

    @rules("iba:wc.fields")
    def test_rc_send_with_immediate(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: SEND with immediate delivers the 32-bit value and flags it in
        recv_opt."""
        require_opcode(ca.capabilities, QpType.RC, WrType.SEND)
        if not ca.capabilities.immediate:
            self._skip_imm(ca.capabilities)
        pair = self.pair(ca, port, peer, QpType.RC)
        _, got = pair.send(b"imm", opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE, imm=IMM)
        assert got.imm == IMM and got.recv_opt & RecvOpt.IMMEDIATE
        assert got.length == 3 and pair.b.get(0, 3) == b"imm"

    @staticmethod
    def _skip_imm(caps: Capabilities) -> None:
        pytest.skip(f"provider lacks immediate: {caps.reason('immediate')}")

    @rules("doc:access-layer §5.9")
    def test_rc_rdma_write_lands_without_consuming_receive(
        self, ca: Ca, port: PortAttr, peer: Peer
    ) -> None:
        """access-layer §5.9: RDMA WRITE places bytes remotely, consumes no receive, neighbours
        untouched."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_WRITE)
        pair = self.pair(ca, port, peer, QpType.RC)
        pair.b.put(1000, b"\xee" * 40)
        pair.b.recv(77, 4096, 64)
        pair.write(b"written remotely", dst_off=1012, wr_id=5)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.wc_type, wc.status) == (5, WcType.RDMA_WRITE, WcStatus.SUCCESS)
        assert pair.b.get(1000, 40) == b"\xee" * 12 + b"written remotely" + b"\xee" * 12
        _, got = pair.send(b"after", recv_id=999, dst_off=5000)
        assert got.wr_id == 77, "the RDMA WRITE consumed a receive"

    @rules("iba:wc.fields")
    def test_rc_rdma_write_with_immediate_consumes_receive(
        self, ca: Ca, port: PortAttr, peer: Peer
    ) -> None:
        """access-layer §5.9: WRITE with immediate lands and completes a receive as
        RECV_RDMA_WRITE."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_WRITE)
        if not ca.capabilities.immediate:
            self._skip_imm(ca.capabilities)
        pair = self.pair(ca, port, peer, QpType.RC)
        pair.b.put(6000, b"\x00" * 8)
        pair.b.qp.post_recv(RecvWr(wr_id=31, sg_list=[pair.b.sge(6000, 64)]))
        pair.write(b"imm-wrt!", dst_off=2100, opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE, imm=IMM)
        sent, got = pair.wait_pair()
        assert sent.wc_type is WcType.RDMA_WRITE and sent.status is WcStatus.SUCCESS
        assert (got.wr_id, got.wc_type, got.imm) == (31, WcType.RECV_RDMA_WRITE, IMM)
        assert got.length == 8
        assert pair.b.get(2100, 8) == b"imm-wrt!"
        assert pair.b.get(6000, 8) == b"\x00" * 8, "write-with-imm data went to the receive buffer"

    @rules("doc:access-layer §5.9")
    def test_rc_rdma_read_fetches(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: RDMA READ copies remote bytes into the local SGE; completion says
        RDMA_READ."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_READ)
        pair = self.pair(ca, port, peer, QpType.RC)
        pair.b.put(3000, b"read back me")
        pair.read(12, src_off=3000, dst_off=512, wr_id=8)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.wc_type, wc.status, wc.length) == (
            8,
            WcType.RDMA_READ,
            WcStatus.SUCCESS,
            12,
        )
        assert pair.a.get(512, 12) == b"read back me"

    @rules("doc:IBA 9.4.3")
    def test_rc_rdma_read_spanning_several_mtus(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """IBA 9.4.3: a READ longer than the path MTU arrives whole (multi-packet response)."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_READ)
        pair = self.pair(ca, port, peer, QpType.RC, buf_size=5 * 4096)
        n = 2 * common_mtu(pair.a.port, pair.b.port).bytes + 77
        data = bytes((i * 7) & 0xFF for i in range(n))
        pair.b.put(0, data)
        pair.read(n, src_off=0, dst_off=n + 64)
        wc = wait_wc(pair.a.cq)
        assert wc.status is WcStatus.SUCCESS and wc.length == n
        assert pair.a.get(n + 64, n) == data

    @rules("iba:at.fetch-add")
    def test_rc_fetch_and_add(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: FETCH_ADD returns the old 8 bytes and leaves old + add remotely."""
        require_opcode(ca.capabilities, QpType.RC, WrType.FETCH_ADD)
        pair = self.pair(ca, port, peer, QpType.RC)
        init = struct.pack("=Q", 41)
        pair.b.put(3584, init)
        wc = pair.atomic(WrType.FETCH_ADD, remote_off=3584, local_off=1536, compare_add=1)
        assert (wc.wc_type, wc.status) == (WcType.FETCH_ADD, WcStatus.SUCCESS)
        assert atomic_result_ok(init, pair.a.get(1536, 8), pair.b.get(3584, 8), lambda v: v + 1)

    @rules("iba:at.cmp-swap")
    def test_rc_compare_swap_hit(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: COMPARE_SWAP with a matching compare value swaps and returns the old
        value."""
        require_opcode(ca.capabilities, QpType.RC, WrType.COMPARE_SWAP)
        pair = self.pair(ca, port, peer, QpType.RC)
        old, new = 0x1122334444332211, 0x5566778888776655  # the same in either byte order
        pair.b.put(3592, struct.pack("<Q", old))
        wc = pair.atomic(
            WrType.COMPARE_SWAP, remote_off=3592, local_off=1544, compare_add=old, swap=new
        )
        assert (wc.wc_type, wc.status) == (WcType.COMPARE_SWAP, WcStatus.SUCCESS)
        assert pair.a.get(1544, 8) == struct.pack("<Q", old)
        assert pair.b.get(3592, 8) == struct.pack("<Q", new)

    @rules("iba:at.cmp-swap")
    def test_rc_compare_swap_miss(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: COMPARE_SWAP with another compare value leaves memory, returns the
        value."""
        require_opcode(ca.capabilities, QpType.RC, WrType.COMPARE_SWAP)
        pair = self.pair(ca, port, peer, QpType.RC)
        cur = 0x0102030404030201
        pair.b.put(3600, struct.pack("<Q", cur))
        wc = pair.atomic(
            WrType.COMPARE_SWAP,
            remote_off=3600,
            local_off=1552,
            compare_add=0x0909090909090909,
            swap=0x7777777777777777,
        )
        assert wc.status is WcStatus.SUCCESS
        assert pair.a.get(1552, 8) == struct.pack("<Q", cur)
        assert pair.b.get(3600, 8) == struct.pack("<Q", cur)

    @rules("doc:ci-contract §2.9")
    def test_rc_send_gathers_sges(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.9: a send with several SGEs is one message, the SGEs concatenated."""
        pair = self.pair(ca, port, peer, QpType.RC, sq_sge=3)
        pair.a.put(0, b"abc")
        pair.a.put(100, b"defg")
        pair.a.put(200, b"hi")
        pair.b.recv(1, 4000, 64)
        pair.a.qp.post_send(
            SendWr(wr_id=2, sg_list=[pair.a.sge(0, 3), pair.a.sge(100, 4), pair.a.sge(200, 2)])
        )
        _, got = pair.wait_pair()
        assert got.length == 9 and pair.b.get(4000, 9) == b"abcdefghi"

    @rules("doc:ci-contract §2.9")
    def test_rc_receive_scatters_sges(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.9: a receive with several SGEs fills them in order."""
        pair = self.pair(ca, port, peer, QpType.RC, rq_sge=2)
        pair.b.qp.post_recv(RecvWr(wr_id=3, sg_list=[pair.b.sge(1000, 4), pair.b.sge(2000, 16)]))
        pair.a.put(0, b"0123456789")
        pair.a.qp.post_send(SendWr(wr_id=4, sg_list=[pair.a.sge(0, 10)]))
        _, got = pair.wait_pair()
        assert got.length == 10
        assert pair.b.get(1000, 4) == b"0123" and pair.b.get(2000, 6) == b"456789"

    @rules("doc:IBA 9.7")
    def test_rc_send_spanning_several_mtus(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """IBA 9.7: a SEND longer than the path MTU is segmented and reassembled intact."""
        pair = self.pair(ca, port, peer, QpType.RC, buf_size=9 * 4096)
        n = 3 * common_mtu(pair.a.port, pair.b.port).bytes + 5
        data = bytes((i * 13 + 1) & 0xFF for i in range(n))
        _, got = pair.send(data, dst_off=n + 64, recv_len=n + 16)
        assert got.length == n and pair.b.get(n + 64, n) == data

    @rules("iba:wc.order")
    def test_rc_messages_arrive_in_order(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """IBA 9.5 (RC ordering): 32 sends complete, and land, in posting order."""
        pair = self.pair(ca, port, peer, QpType.RC, sq_depth=64, rq_depth=64)
        pair.b.qp.post_recv(
            [RecvWr(wr_id=100 + i, sg_list=[pair.b.sge(4096 + 32 * i, 32)]) for i in range(32)]
        )
        for i in range(32):
            pair.a.put(32 * i, struct.pack("<I", i) * 8)
        pair.a.qp.post_send([SendWr(wr_id=i, sg_list=[pair.a.sge(32 * i, 32)]) for i in range(32)])
        wcs = wait_wcs(pair.a.cq, 32) + wait_wcs(pair.b.cq, 32)
        assert [w.wr_id for w in wcs if w.wc_type is WcType.SEND] == list(range(32))
        assert [w.wr_id for w in wcs if w.wc_type is WcType.RECV] == [100 + i for i in range(32)]
        for i in range(32):
            assert pair.b.get(4096 + 32 * i, 4) == struct.pack("<I", i)

    @rules("doc:ci-contract §2.9")
    def test_rc_bidirectional_traffic(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.9: both ends of a connection send at once and each gets the other's
        data."""
        pair = self.pair(ca, port, peer, QpType.RC)
        pair.a.recv(1, 2000, 64)
        pair.b.recv(2, 2000, 64)
        pair.a.put(0, b"from A")
        pair.b.put(0, b"from B")
        pair.a.qp.post_send(SendWr(wr_id=3, sg_list=[pair.a.sge(0, 6)]))
        pair.b.qp.post_send(SendWr(wr_id=4, sg_list=[pair.b.sge(0, 6)]))
        wcs = wait_wcs(pair.a.cq, 2) + wait_wcs(pair.b.cq, 2)
        assert all(w.status is WcStatus.SUCCESS for w in wcs)
        assert pair.a.get(2000, 6) == b"from B" and pair.b.get(2000, 6) == b"from A"

    # ---------------------------------------------------------------- UC
    @rules("doc:access-layer §5.9")
    def test_uc_send_lands(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: a UC SEND lands with the same completion fields as RC."""
        pair = self.pair(ca, port, peer, QpType.UC)
        sent, got = pair.send(b"unreliable conn", dst_off=64)
        assert sent.wc_type is WcType.SEND and sent.status is WcStatus.SUCCESS
        assert (got.wc_type, got.length, got.qp_num) == (WcType.RECV, 15, pair.b.qp.num)
        assert pair.b.get(64, 15) == b"unreliable conn"

    @rules("doc:access-layer §5.9")
    def test_uc_rdma_write_lands(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9 (IBA table 81): UC supports RDMA WRITE."""
        require_opcode(ca.capabilities, QpType.UC, WrType.RDMA_WRITE)
        pair = self.pair(ca, port, peer, QpType.UC)
        pair.write(b"uc write", dst_off=700, wr_id=12)
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.wc_type, wc.status) == (12, WcType.RDMA_WRITE, WcStatus.SUCCESS)
        # UC completes when the data left (IBA 9.8.3); on another CA it lands a moment later
        wait_until(lambda: pair.b.get(700, 8) == b"uc write", "the UC write at B")

    @rules("doc:access-layer §5.9")
    def test_uc_rdma_write_with_immediate(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: UC WRITE with immediate completes a receive with the value."""
        require_opcode(ca.capabilities, QpType.UC, WrType.RDMA_WRITE)
        if not ca.capabilities.immediate:
            self._skip_imm(ca.capabilities)
        pair = self.pair(ca, port, peer, QpType.UC)
        pair.b.recv(40, 5000, 16)
        pair.write(b"ucimm", dst_off=720, opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE, imm=IMM)
        _, got = pair.wait_pair()
        assert (got.wr_id, got.wc_type, got.imm) == (40, WcType.RECV_RDMA_WRITE, IMM)
        assert pair.b.get(720, 5) == b"ucimm"

    # ---------------------------------------------------------------- UD
    @rules("doc:decisions")
    def test_ud_send_lands_after_grh_space(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """decisions (UD receive buffers): data lands after 40 GRH bytes; length counts them; src_qp
        set."""
        pair = self.pair(ca, port, peer, QpType.UD)
        sent, got = pair.send(b"datagram!", dst_off=0, wr_id=7, recv_id=70)
        assert (sent.wr_id, sent.wc_type, sent.status) == (7, WcType.SEND, WcStatus.SUCCESS)
        assert (got.wr_id, got.wc_type, got.status) == (70, WcType.RECV, WcStatus.SUCCESS)
        assert got.length == GRH_BYTES + 9
        assert got.src_qp == pair.a.qp.num and got.qp_num == pair.b.qp.num
        assert pair.b.get(GRH_BYTES, 9) == b"datagram!"

    @rules("doc:access-layer §5.9")
    def test_ud_send_with_immediate(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer §5.9: a UD SEND with immediate carries the value."""
        if not ca.capabilities.immediate:
            self._skip_imm(ca.capabilities)
        pair = self.pair(ca, port, peer, QpType.UD)
        _, got = pair.send(b"udimm", opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE, imm=IMM)
        assert got.imm == IMM and got.recv_opt & RecvOpt.IMMEDIATE

    @rules("iba:wc.fields")
    def test_ud_completion_reports_source(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.10 (ib_wc_t recv.ud): the receive names the sender's QP, LID and P_Key
        index."""
        pair = self.pair(ca, port, peer, QpType.UD)
        _, got = pair.send(b"who?")
        assert got.src_qp == pair.a.qp.num
        assert got.pkey_index == 0
        if pair.a.port.link_layer.name == "INFINIBAND":
            assert got.slid == pair.a.port.lid
        else:
            assert got.recv_opt & RecvOpt.GRH_VALID, "RoCE datagrams always carry a GRH"

    @rules("al:68")
    def test_ud_wrong_qkey_dropped(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """access-layer rule 68: a UD QP accepts only datagrams whose Q_Key matches its own."""
        pair = self.pair(ca, port, peer, QpType.UD)
        pair.b.recv(1, 0, 128)
        pair.a.put(0, b"wrong key")
        pair.a.put(64, b"right key")
        assert pair.a.av is not None
        pair.a.qp.post_send(
            [
                SendWr(
                    wr_id=1,
                    sg_list=[pair.a.sge(0, 9)],
                    ud=UdDest(av=pair.a.av, remote_qp=pair.b.qp.num, remote_qkey=UD_QKEY ^ 0x55),
                ),
                SendWr(
                    wr_id=2,
                    sg_list=[pair.a.sge(64, 9)],
                    ud=UdDest(av=pair.a.av, remote_qp=pair.b.qp.num, remote_qkey=UD_QKEY),
                ),
            ]
        )
        recv = next(w for w in self._collect(pair, 3) if w.wc_type is WcType.RECV)
        assert recv.wr_id == 1 and recv.status is WcStatus.SUCCESS
        assert pair.b.get(GRH_BYTES, 9) == b"right key"

    @staticmethod
    def _collect(pair: Pair, n: int) -> list[Wc]:
        """Two send completions from A, then the rest from B."""
        return wait_wcs(pair.a.cq, 2) + wait_wcs(pair.b.cq, n - 2)

    @rules("doc:IBA 10.2.4")
    def test_ud_full_mtu_datagram(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """IBA 10.2.4: a datagram of exactly the path MTU is delivered whole."""
        pair = self.pair(ca, port, peer, QpType.UD, buf_size=3 * 4096)
        n = common_mtu(pair.a.port, pair.b.port).bytes
        data = bytes((i * 3) & 0xFF for i in range(n))
        _, got = pair.send(data, src_off=0, dst_off=n + 64, recv_len=n)
        assert got.length == GRH_BYTES + n
        assert pair.b.get(n + 64 + GRH_BYTES, n) == data

    @rules("doc:ci-contract §2.3")
    def test_ud_one_qp_reaches_two_destinations(self, ca: Ca, port: PortAttr, peer: Peer) -> None:
        """ci-contract §2.3: one UD QP sends to several QPs by naming each in the WR."""
        pair = self.pair(ca, port, peer, QpType.UD)
        third = make_side(peer[0], peer[1], QpType.UD)
        third.qp.init_dgrm_svc(DgrmInfo(port_guid=peer[1].port_guid, qkey=UD_QKEY))
        pair.b.recv(1, 0, 128)
        third.recv(2, 0, 128)
        assert pair.a.av is not None
        pair.a.put(0, b"to-b")
        pair.a.put(8, b"to-c")
        pair.a.qp.post_send(
            [
                SendWr(
                    wr_id=1,
                    sg_list=[pair.a.sge(0, 4)],
                    ud=UdDest(av=pair.a.av, remote_qp=pair.b.qp.num, remote_qkey=UD_QKEY),
                ),
                SendWr(
                    wr_id=2,
                    sg_list=[pair.a.sge(8, 4)],
                    ud=UdDest(av=pair.a.av, remote_qp=third.qp.num, remote_qkey=UD_QKEY),
                ),
            ]
        )
        wait_wc(third.cq)
        assert third.get(GRH_BYTES, 4) == b"to-c"
        assert any(w.wc_type is WcType.RECV for w in self._collect(pair, 3))
        assert pair.b.get(GRH_BYTES, 4) == b"to-b"
