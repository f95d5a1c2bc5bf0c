"""The mock fabric's packets as InfiniBand frames in a pcap (``LINKTYPE_INFINIBAND``).

The mock moves one :class:`~ibal.providers.mock.packets.Packet` per message;
the capture writes what real IB would carry for it: the message cut into
MTU-sized packets (FIRST/MIDDLE/LAST, one PSN each, as many as the mock's
``npsn``), each LRH [+ GRH] + BTH + extension headers + payload + pad + ICRC +
VCRC, built with the RoCEv2 provider's header tables (the IBA transport
headers are the same on both links).  The ICRC is the IBA one (CRC-32 over the
packet with the LRH VL, GRH traffic class/flow label/hop limit and BTH byte 4
masked); the VCRC a CRC-16 (polynomial 0x100B) over the whole packet.
Wireshark checks neither; the mock's own integrity check is ``Packet.icrc``.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING, Final

from ibal.providers.mock.packets import Packet as MockPacket
from ibal.providers.mock.packets import PacketOp
from ibal.types import QpType
from ibal.wire.pcap import LINKTYPE_INFINIBAND, PcapWriter, capture_for

if TYPE_CHECKING:
    from ibal.wire.packet import Packet as IbPacket

_LRH: Final = struct.Struct(">BBHHH")
LNH_IBA_LOCAL: Final = 2
LNH_IBA_GLOBAL: Final = 3
_BASE: Final = {QpType.RC: 0x00, QpType.UC: 0x20, QpType.UD: 0x60, QpType.QP1: 0x60}
# RC/UC operation offsets (ib_pack.h)
_SEND: Final = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05)  # first, middle, last, last_imm, only, only_imm
_WRITE: Final = (0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B)
_READ_RESP: Final = (0x0D, 0x0E, 0x0F, 0x0F, 0x10, 0x10)
_AETH_ACK: Final = 0x1F
_SEND_INV: Final = (0x16, 0x17)  # RC SEND last, only with invalidate (IETH)


def _segments(length: int, npsn: int) -> list[tuple[int, int]]:
    """(offset, size) of each wire packet of a message sent in ``npsn`` packets."""
    if npsn <= 1:
        return [(0, length)]
    mtu = next((m for m in (256, 512, 1024, 2048, 4096) if -(-length // m) <= npsn), 4096)
    return [(o, min(mtu, length - o)) for o in range(0, mtu * npsn, mtu)][:npsn]


def _crc16_vcrc(data: bytes) -> int:
    # IBA VCRC: CRC-16, polynomial 0x100B, seed 0xFFFF, reflected, inverted.
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xD008 if crc & 1 else crc >> 1
    return ~crc & 0xFFFF


def ib_packets(m: MockPacket) -> list[IbPacket]:
    """The IB transport packets one mock message stands for."""
    from ibal.wire.packet import Packet as IbPacket

    base = _BASE.get(m.transport, 0x00)
    op = m.op
    payload = bytes(m.payload)
    out: list[IbPacket] = []

    def new(opcode: int, psn: int, data: bytes = b"") -> IbPacket:
        p = IbPacket(opcode, m.dst_qpn, psn & 0xFFFFFF, data, pkey=m.pkey & 0xFFFF)
        out.append(p)
        return p

    if op in (PacketOp.SEND, PacketOp.SEND_IMM, PacketOp.RDMA_WRITE, PacketOp.RDMA_WRITE_IMM,
              PacketOp.READ_RESP):  # fmt: skip
        table = _READ_RESP if op is PacketOp.READ_RESP else (
            _SEND if op in (PacketOp.SEND, PacketOp.SEND_IMM) else _WRITE)  # fmt: skip
        imm = op in (PacketOp.SEND_IMM, PacketOp.RDMA_WRITE_IMM)
        inv = m.inv if op is PacketOp.SEND and base == 0x00 else None
        segs = _segments(len(payload), 1 if base == 0x60 else m.npsn)
        for i, (o, n) in enumerate(segs):
            first, last = i == 0, i == len(segs) - 1
            k = (4 if first else 2) if last else (0 if first else 1)
            code = (base | 0x04 | imm) if base == 0x60 else base | table[k + (imm and last)]
            if last and inv is not None:
                code = _SEND_INV[k == 4]
            p = new(code, m.psn + i, payload[o : o + n])
            if last and inv is not None:
                p.inv_rkey = inv & 0xFFFFFFFF
            if first and op in (PacketOp.RDMA_WRITE, PacketOp.RDMA_WRITE_IMM):
                p.va, p.rkey, p.dma_len = m.remote_addr, m.rkey, len(payload)
            if last:
                p.ack_req = m.transport is QpType.RC and op is not PacketOp.READ_RESP
                p.se = m.solicited
                p.imm = (m.imm or 0) & 0xFFFFFFFF
            if op is PacketOp.READ_RESP and (first or last):
                p.syndrome = _AETH_ACK
            if base == 0x60:
                p.qkey, p.src_qpn, p.ack_req = m.qkey & 0xFFFFFFFF, m.src_qpn, True
    elif op is PacketOp.RDMA_READ_REQ:
        p = new(0x0C, m.psn)
        p.va, p.rkey, p.dma_len, p.ack_req = m.remote_addr, m.rkey, m.length, True
    elif op in (PacketOp.COMPARE_SWAP, PacketOp.FETCH_ADD):
        p = new(0x13 if op is PacketOp.COMPARE_SWAP else 0x14, m.psn)
        p.va, p.rkey, p.ack_req = m.remote_addr, m.rkey, True
        if op is PacketOp.COMPARE_SWAP:
            p.swap_add, p.compare = m.swap & (1 << 64) - 1, m.compare & (1 << 64) - 1
        else:
            p.swap_add = m.compare & (1 << 64) - 1
    elif op is PacketOp.ATOMIC_ACK:
        p = new(0x12, m.psn)
        p.syndrome, p.orig = _AETH_ACK, m.compare & (1 << 64) - 1
    else:  # ACK, NAK, RNR NAK
        p = new(0x11, m.psn)
        if op is PacketOp.NAK:
            p.syndrome = 0x60 | (m.syndrome & 0x1F)
        elif op is PacketOp.RNR_NAK:
            p.syndrome = 0x20 | (m.syndrome & 0x1F)
        else:
            p.syndrome = _AETH_ACK
    return out


def ib_frame(m: MockPacket, p: IbPacket) -> bytes:
    """One IB packet, LRH to VCRC."""
    from ibal.wire.iba import encode_headers

    hdr = encode_headers(p)
    body = bytes(hdr) + bytes(p.payload) + bytes(p.pad)
    grh = m.grh or b""
    words = (8 + len(grh) + len(body) + 4) // 4
    lnh = LNH_IBA_GLOBAL if grh else LNH_IBA_LOCAL
    lrh = _LRH.pack(0, ((m.sl & 0xF) << 4) | lnh, m.dlid & 0xFFFF, words & 0x7FF, m.slid & 0xFFFF)
    # ICRC: VL (LRH byte 0 high nibble), GRH tclass/flow/hop limit, BTH byte 4 masked
    masked = bytearray(lrh + grh + body)
    masked[0] |= 0xF0
    if grh:
        masked[8:12] = bytes((masked[8] | 0x0F, 0xFF, 0xFF, 0xFF))
        masked[15] = 0xFF
    masked[8 + len(grh) + 4] = 0xFF
    icrc = zlib.crc32(masked).to_bytes(4, "little")
    pkt = lrh + grh + body + icrc
    return pkt + _crc16_vcrc(pkt).to_bytes(2, "little")


class MockCapture:
    """Called with every packet the mock fabric transmits; writes its IB frames."""

    def __init__(self, writer: PcapWriter) -> None:
        self.writer = writer

    def __call__(self, m: MockPacket) -> None:
        for p in ib_packets(m):
            self.writer.write(ib_frame(m, p))


def mock_capture(option: str | None = None) -> MockCapture | None:
    """The fabric's capture hook for the ``capture`` option or ``IBAL_CAPTURE``, or ``None``."""
    w = capture_for(LINKTYPE_INFINIBAND, option)
    return None if w is None else MockCapture(w)
