"""The UD and GSI (QP1) receive side: Q_Key check, GRH first in the buffer.

Unreliable: whatever cannot be taken (wrong Q_Key, no receive WQE) is dropped
and counted; the sender's completion is not affected (roce-wire.md 2.9-2.10).
"""

from __future__ import annotations

from ibal.transport.qp import Counters, MemoryAccess, Output, QpConfig, RecvSource
from ibal.transport.responder import resolve_recv
from ibal.transport.rules import build_grh
from ibal.transport.wc import make_wc
from ibal.types import NetworkHeader, QpType, RecvOpt, WcStatus, WcType
from ibal.wire import packet as P
from ibal.wire.packet import Packet

GRH_LEN = 40
_GRH_OPT = RecvOpt.GRH_VALID
_GRH_IMM_OPT = RecvOpt.GRH_VALID | RecvOpt.IMMEDIATE


def ipv4_header(src: bytes, dst: bytes, udp_len: int, ttl: int = 64, tos: int = 0) -> bytes:
    """An IPv4 header as rxe builds it (DF set, ID 0), for a packet the codec gave no header."""
    hdr = bytearray(20)
    hdr[0] = 0x45
    hdr[1] = tos & 0xFF
    hdr[2:4] = (20 + udp_len).to_bytes(2, "big")
    hdr[6] = 0x40
    hdr[8] = ttl & 0xFF
    hdr[9] = 17
    hdr[12:16] = src
    hdr[16:20] = dst
    s = sum(int.from_bytes(hdr[i : i + 2], "big") for i in range(0, 20, 2))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    hdr[10:12] = (~s & 0xFFFF).to_bytes(2, "big")
    return bytes(hdr)


def network_header(pkt: Packet) -> tuple[bytes, NetworkHeader]:
    """The 40 bytes a UD receive buffer starts with (rxe ``rdma_network_hdr``), and their kind."""
    hdr = pkt.net_hdr
    if len(hdr) == 20:
        return bytes(20) + bytes(hdr), NetworkHeader.IPV4
    if len(hdr) == 40:
        return bytes(hdr), NetworkHeader.IPV6
    udp_len = 8 + P.HDR_LEN[pkt.opcode] + len(pkt.payload) + pkt.pad + P.ICRC_LEN
    if len(pkt.src_ip) == 4 and len(pkt.dst_ip) == 4:
        return bytes(20) + ipv4_header(pkt.src_ip, pkt.dst_ip, udp_len), NetworkHeader.IPV4
    grh = build_grh(bytes(pkt.src_ip).rjust(16, b"\0"), bytes(pkt.dst_ip).rjust(16, b"\0"),
                    udp_len, next_header=17)
    return grh, NetworkHeader.IPV6


class UdResponder:
    """One UD or GSI QP's receive side."""

    def __init__(
        self, cfg: QpConfig, mem: MemoryAccess, rq: RecvSource, out: Output, counters: Counters
    ) -> None:
        self.cfg = cfg
        self.mem = mem
        self.rq = rq
        self.out = out
        self.counters = counters
        self.gsi = cfg.qp_type is QpType.QP1

    def receive(self, pkt: Packet) -> None:
        cfg = self.cfg
        want = P.GSI_QKEY if self.gsi else cfg.qkey
        if pkt.qkey != want:
            self.counters.drop("qkey")
            return
        got = self.rq.take()
        if got is None:
            self.counters.drop("no_recv_wqe")
            return
        wr_id, sges = got
        target = resolve_recv(self.mem, wr_id, sges)
        qpn = cfg.qpn
        recv_wcs = self.out.recv_wcs
        if target is None:
            recv_wcs.append((make_wc(wr_id, WcType.RECV, WcStatus.LOCAL_PROTECTION_ERR, 0, None,
                                     RecvOpt.NONE, qpn), False))
            return
        payload = pkt.payload
        n = GRH_LEN + len(payload)
        if n > target.cap:
            recv_wcs.append((make_wc(wr_id, WcType.RECV, WcStatus.LOCAL_LEN_ERR, 0, None,
                                     RecvOpt.NONE, qpn), False))
            return
        grh, kind = network_header(pkt)
        target.write(grh)
        if len(payload):
            target.write(payload)
        imm = pkt.opcode == P.Opcode.UD_SEND_ONLY_IMM
        recv_wcs.append((
            make_wc(wr_id, WcType.RECV, WcStatus.SUCCESS, n, pkt.imm if imm else None,
                    _GRH_IMM_OPT if imm else _GRH_OPT, qpn, pkt.src_qpn, 0, 0, cfg.pkey_index,
                    0, 0, grh, kind),
            pkt.se,
        ))
