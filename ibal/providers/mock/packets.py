"""What travels on the mock wire: one :class:`Packet` per message or response.

The mock does not cut messages into MTU-sized packets: a message travels as
one packet object, but it consumes as many PSNs as the IBA segmentation would
(``npsn``), so PSN arithmetic, duplicate detection and go-back-N retransmission
behave as on a real link.  The invariant CRC (``icrc``) is computed only when a
fault touches a packet; a receiver checks it whenever it is present.
"""

from __future__ import annotations

import enum
import zlib
from typing import TYPE_CHECKING

from ibal.types import QpType

if TYPE_CHECKING:
    from ibal.providers.mock.topology import Link, MockPort

PSN_MASK = 0xFFFFFF
PSN_HALF = 0x800000
MCAST_QPN = 0xFFFFFF
GRH_LEN = 40


class PacketOp(enum.IntEnum):
    """The operation a packet carries (requests below 16, responses from 16)."""

    SEND = 0
    SEND_IMM = 1
    RDMA_WRITE = 2
    RDMA_WRITE_IMM = 3
    RDMA_READ_REQ = 4
    COMPARE_SWAP = 5
    FETCH_ADD = 6
    ACK = 16
    NAK = 17
    RNR_NAK = 18
    READ_RESP = 19
    ATOMIC_ACK = 20

    @property
    def is_response(self) -> bool:
        return self >= PacketOp.ACK


class NakCode(enum.IntEnum):
    """AETH NAK codes (IBA 9.7.5.2.2)."""

    PSN_SEQ_ERR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS = 2
    REMOTE_OP = 3


class Packet:
    """One packet in flight.  ``route`` is the tuple of links it crosses."""

    __slots__ = (
        "compare",
        "dlid",
        "dst_port",
        "dst_qpn",
        "grh",
        "icrc",
        "imm",
        "length",
        "npsn",
        "op",
        "payload",
        "pkey",
        "psn",
        "qkey",
        "remote_addr",
        "rkey",
        "route",
        "sl",
        "slid",
        "solicited",
        "src_port",
        "src_qpn",
        "swap",
        "syndrome",
        "topo",
        "transport",
    )

    def __init__(
        self,
        op: PacketOp,
        transport: QpType,
        src_port: MockPort,
        dst_port: MockPort,
        route: tuple[Link, ...],
        src_qpn: int,
        dst_qpn: int,
        psn: int,
        pkey: int,
        payload: bytes | memoryview = b"",
    ) -> None:
        self.op = op
        self.transport = transport
        self.src_port = src_port
        self.dst_port = dst_port
        self.route = route
        self.slid = src_port.lid
        self.dlid = dst_port.lid
        self.sl = 0
        self.src_qpn = src_qpn
        self.dst_qpn = dst_qpn
        self.psn = psn
        self.npsn = 1
        self.pkey = pkey
        self.qkey = 0
        self.payload = payload
        self.length = len(payload)
        self.imm: int | None = None
        self.solicited = False
        self.remote_addr = 0
        self.rkey = 0
        self.compare = 0
        self.swap = 0
        self.syndrome = 0
        self.grh: bytes | None = None
        self.icrc: int | None = None
        self.topo = 0

    def clone(self) -> Packet:
        p = Packet.__new__(Packet)
        for name in Packet.__slots__:
            setattr(p, name, getattr(self, name))
        return p

    def header(self) -> tuple[object, ...]:
        """The fields the invariant CRC covers, besides the payload."""
        return (
            int(self.op),
            self.slid,
            self.dlid,
            self.sl,
            self.src_qpn,
            self.dst_qpn,
            self.psn,
            self.npsn,
            self.pkey,
            self.qkey,
            self.length,
            self.imm,
            self.solicited,
            self.remote_addr,
            self.rkey,
            self.compare,
            self.swap,
            self.syndrome,
            self.grh,
        )

    def compute_icrc(self) -> int:
        return zlib.crc32(bytes(self.payload), zlib.crc32(repr(self.header()).encode()))

    def icrc_ok(self) -> bool:
        return self.icrc is None or self.icrc == self.compute_icrc()

    def __repr__(self) -> str:
        return (
            f"<Packet {self.op.name} {self.transport.name} lid 0x{self.slid:x}->0x{self.dlid:x} "
            f"qp 0x{self.src_qpn:x}->0x{self.dst_qpn:x} psn {self.psn} len {self.length}>"
        )


def psn_diff(a: int, b: int) -> int:
    """``a - b`` in 24-bit PSN space, in ``[-2^23, 2^23)``."""
    d = (a - b) & PSN_MASK
    return d - 0x1000000 if d >= PSN_HALF else d


def packets_for(length: int, mtu: int) -> int:
    """How many PSNs a message of ``length`` bytes uses at path MTU ``mtu``."""
    return 1 if length <= mtu else (length + mtu - 1) // mtu


# IBA table 45: RNR NAK timer field -> milliseconds.
RNR_TIMER_MS: tuple[float, ...] = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12,
    0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
    2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
    40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
)  # fmt: skip


def rnr_seconds(code: int) -> float:
    return RNR_TIMER_MS[code & 31] / 1000.0


def ack_timeout_seconds(code: int) -> float:
    """IBA local ACK timeout: 4.096 us * 2^code; 0 means infinite (``0.0`` here)."""
    return 0.0 if code == 0 else 4.096e-6 * (1 << code)


def build_grh(sgid: bytes, dgid: bytes, payload_len: int, hop_limit: int = 64,
              tclass: int = 0, flow: int = 0) -> bytes:
    """A 40-byte IBA GRH (IPv6-like header), as a UD receive buffer gets it."""
    word0 = (6 << 28) | ((tclass & 0xFF) << 20) | (flow & 0xFFFFF)
    return (
        word0.to_bytes(4, "big")
        + (payload_len + 0).to_bytes(2, "big")
        + bytes((0x1B, hop_limit & 0xFF))
        + sgid
        + dgid
    )
