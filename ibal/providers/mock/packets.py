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

from ibal.transport.psn import PSN_HALF, PSN_MASK, packets_for, psn_diff
from ibal.transport.rules import NakCode, build_grh
from ibal.transport.timers import RNR_TIMER_MS, ack_timeout_seconds, rnr_seconds
from ibal.types import QpType

if TYPE_CHECKING:
    from ibal.providers.mock.topology import Link, MockPort

# The IBA rules live in ibal.transport (shared with the rxe core); re-exported
# here for the mock's own modules and tests.
__all__ = [
    "GRH_LEN", "MCAST_QPN", "PSN_HALF", "PSN_MASK", "RNR_TIMER_MS", "NakCode", "Packet",
    "PacketOp", "ack_timeout_seconds", "build_grh", "packets_for", "psn_diff", "rnr_seconds",
]  # fmt: skip

MCAST_QPN = 0xFFFFFF
GRH_LEN = 40


_NO_COST = (0, 0)


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


class Packet:
    """One packet in flight.  ``route`` is the tuple of links it crosses."""

    __slots__ = (
        "compare",
        "cost",
        "dlid",
        "dst_port",
        "dst_qpn",
        "grh",
        "icrc",
        "imm",
        "inv",
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
        self.inv: int | None = None  # SEND with invalidate: the R_Key (IETH)
        self.solicited = False
        self.remote_addr = 0
        self.rkey = 0
        self.compare = 0
        self.swap = 0
        self.syndrome = 0
        self.grh: bytes | None = None
        self.icrc: int | None = None
        self.topo = 0
        self.cost = _NO_COST  # (IB packets, 4-byte words) for the PMA, set when transmitted

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
