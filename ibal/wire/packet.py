"""RoCEv2 opcodes, their per-opcode properties and the parsed-packet record.

Opcode numbers are the IBA's (``include/rdma/ib_pack.h``): transport base
RC 0x00, UC 0x20, UD 0x60 plus the operation.  Properties live in
:data:`OP_FLAGS`, a 256-entry tuple of plain ints indexed by the opcode byte,
so the data path tests a bit (``OP_FLAGS[op] & RETH``) instead of calling an
enum property; an opcode that rxe does not implement has flags ``0``
(:data:`VALID` clear).  :data:`HDR_LEN` gives BTH plus extension headers in
bytes.  The :class:`Packet` record is what the codec decodes bytes into and
encodes from, and what the transport core consumes and produces.
"""

from __future__ import annotations

import enum
from typing import Final

# ------------------------------------------------------------ opcode property bits

VALID: Final = 1 << 0
RETH: Final = 1 << 1
AETH: Final = 1 << 2
DETH: Final = 1 << 3
IMMDT: Final = 1 << 4
IETH: Final = 1 << 5
ATOMIC_ETH: Final = 1 << 6
ATOMIC_ACK_ETH: Final = 1 << 7
PAYLOAD: Final = 1 << 8
"""The packet may carry payload (it still may be empty, e.g. a 0-byte SEND)."""
FIRST: Final = 1 << 9
MIDDLE: Final = 1 << 10
LAST: Final = 1 << 11
ONLY: Final = FIRST | LAST
"""ONLY packets have both FIRST and LAST set: ``flags & ONLY == ONLY``."""
REQUEST: Final = 1 << 12
RESPONSE: Final = 1 << 13
SEND: Final = 1 << 14
WRITE: Final = 1 << 15
READ: Final = 1 << 16
ATOMIC: Final = 1 << 17
ACK: Final = 1 << 18
"""ACKNOWLEDGE and ATOMIC_ACKNOWLEDGE (READ responses have RESPONSE | READ)."""
INVALIDATE: Final = 1 << 19
RC: Final = 1 << 20
UC: Final = 1 << 21
UD: Final = 1 << 22
CONSUMES_RWQE: Final = 1 << 23
"""The message consumes a receive WQE (SEND, and WRITE with immediate)."""

BTH_LEN: Final = 12
RETH_LEN: Final = 16
AETH_LEN: Final = 4
DETH_LEN: Final = 8
IMMDT_LEN: Final = 4
IETH_LEN: Final = 4
ATOMIC_ETH_LEN: Final = 28
ATOMIC_ACK_ETH_LEN: Final = 8
ICRC_LEN: Final = 4

# --------------------------------------------------------------------- AETH values

AETH_ACK_UNLIMITED: Final = 0x1F
"""Syndrome of every rxe ACK: ACK, credit field "unlimited" (roce-wire 2.8)."""
AETH_TYPE_MASK: Final = 0xE0
AETH_TYPE_ACK: Final = 0x00
AETH_TYPE_RNR_NAK: Final = 0x20
AETH_TYPE_NAK: Final = 0x60


class Nak(enum.IntEnum):
    """AETH NAK syndromes (IBA 9.7.5.2.2, ``rxe_hdr.h``)."""

    PSN_SEQ_ERR = 0x60
    INVALID_REQUEST = 0x61
    REMOTE_ACCESS = 0x62
    REMOTE_OP = 0x63
    INVALID_RD_REQUEST = 0x64


def rnr_nak_syndrome(min_rnr_timer: int) -> int:
    """The AETH syndrome of an RNR NAK carrying the 5-bit timer code."""
    return AETH_TYPE_RNR_NAK | (min_rnr_timer & 0x1F)


# ------------------------------------------------------------------------ opcodes


class Opcode(enum.IntEnum):
    """BTH opcodes rxe implements (RC, UC, UD)."""

    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_LAST_IMM = 0x03
    RC_SEND_ONLY = 0x04
    RC_SEND_ONLY_IMM = 0x05
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_LAST_IMM = 0x09
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_IMM = 0x0B
    RC_RDMA_READ_REQUEST = 0x0C
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RC_RDMA_READ_RESPONSE_LAST = 0x0F
    RC_RDMA_READ_RESPONSE_ONLY = 0x10
    RC_ACKNOWLEDGE = 0x11
    RC_ATOMIC_ACKNOWLEDGE = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    RC_SEND_LAST_INV = 0x16
    RC_SEND_ONLY_INV = 0x17

    UC_SEND_FIRST = 0x20
    UC_SEND_MIDDLE = 0x21
    UC_SEND_LAST = 0x22
    UC_SEND_LAST_IMM = 0x23
    UC_SEND_ONLY = 0x24
    UC_SEND_ONLY_IMM = 0x25
    UC_RDMA_WRITE_FIRST = 0x26
    UC_RDMA_WRITE_MIDDLE = 0x27
    UC_RDMA_WRITE_LAST = 0x28
    UC_RDMA_WRITE_LAST_IMM = 0x29
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_IMM = 0x2B

    UD_SEND_ONLY = 0x64
    UD_SEND_ONLY_IMM = 0x65

    @property
    def flags(self) -> int:
        return OP_FLAGS[self]

    @property
    def header_len(self) -> int:
        """BTH plus extension headers, in bytes."""
        return HDR_LEN[self]

    def has(self, bits: int) -> bool:
        """Whether every bit of ``bits`` is set for this opcode."""
        return OP_FLAGS[self] & bits == bits


_O = Opcode
_SEND_REQ = VALID | REQUEST | SEND | PAYLOAD | CONSUMES_RWQE
_WRITE_REQ = VALID | REQUEST | WRITE | PAYLOAD
_READ_RESP = VALID | RESPONSE | READ | PAYLOAD

_RC_UC_OPS: dict[int, int] = {
    # offsets within the RC/UC transport base
    0x00: _SEND_REQ | FIRST,
    0x01: _SEND_REQ | MIDDLE,
    0x02: _SEND_REQ | LAST,
    0x03: _SEND_REQ | LAST | IMMDT,
    0x04: _SEND_REQ | ONLY,
    0x05: _SEND_REQ | ONLY | IMMDT,
    0x06: _WRITE_REQ | FIRST | RETH,
    0x07: _WRITE_REQ | MIDDLE,
    0x08: _WRITE_REQ | LAST,
    0x09: _WRITE_REQ | LAST | IMMDT | CONSUMES_RWQE,
    0x0A: _WRITE_REQ | ONLY | RETH,
    0x0B: _WRITE_REQ | ONLY | RETH | IMMDT | CONSUMES_RWQE,
}
_RC_ONLY_OPS: dict[int, int] = {
    0x0C: VALID | REQUEST | READ | ONLY | RETH,
    0x0D: _READ_RESP | FIRST | AETH,
    0x0E: _READ_RESP | MIDDLE,
    0x0F: _READ_RESP | LAST | AETH,
    0x10: _READ_RESP | ONLY | AETH,
    0x11: VALID | RESPONSE | ACK | ONLY | AETH,
    0x12: VALID | RESPONSE | ACK | ATOMIC | ONLY | AETH | ATOMIC_ACK_ETH,
    0x13: VALID | REQUEST | ATOMIC | ONLY | ATOMIC_ETH,
    0x14: VALID | REQUEST | ATOMIC | ONLY | ATOMIC_ETH,
    0x16: _SEND_REQ | LAST | IETH | INVALIDATE,
    0x17: _SEND_REQ | ONLY | IETH | INVALIDATE,
}


def _build_tables() -> tuple[tuple[int, ...], tuple[int, ...]]:
    flags = [0] * 256
    for off, f in _RC_UC_OPS.items():
        flags[0x00 | off] = f | RC
        flags[0x20 | off] = f | UC
    for off, f in _RC_ONLY_OPS.items():
        flags[off] = f | RC
    flags[_O.UD_SEND_ONLY] = _SEND_REQ | ONLY | DETH | UD
    flags[_O.UD_SEND_ONLY_IMM] = _SEND_REQ | ONLY | DETH | IMMDT | UD
    lens = [0] * 256
    for op, f in enumerate(flags):
        if not f:
            continue
        n = BTH_LEN
        n += DETH_LEN if f & DETH else 0
        n += RETH_LEN if f & RETH else 0
        n += ATOMIC_ETH_LEN if f & ATOMIC_ETH else 0
        n += AETH_LEN if f & AETH else 0
        n += ATOMIC_ACK_ETH_LEN if f & ATOMIC_ACK_ETH else 0
        n += IMMDT_LEN if f & IMMDT else 0
        n += IETH_LEN if f & IETH else 0
        lens[op] = n
    assert {op for op, f in enumerate(flags) if f} == {int(o) for o in Opcode}
    return tuple(flags), tuple(lens)


_TABLES = _build_tables()
OP_FLAGS: Final[tuple[int, ...]] = _TABLES[0]
HDR_LEN: Final[tuple[int, ...]] = _TABLES[1]

TRANSPORT_MASK: Final = 0xE0
TRANSPORT_RC: Final = 0x00
TRANSPORT_UC: Final = 0x20
TRANSPORT_UD: Final = 0x60

MAX_PSN: Final = 0xFFFFFF
GSI_QKEY: Final = 0x80010000
CONTROLLED_QKEY_BIT: Final = 0x80000000
MCAST_QPN: Final = 0xFFFFFF
ROCE_V2_PORT: Final = 4791


# ------------------------------------------------------------------------ record


class Packet:
    """One RoCEv2 packet, parsed.

    Fields not carried by the opcode's headers keep their zero defaults and are
    neither encoded nor meaningful.  ``payload`` excludes pad and ICRC.
    ``src_ip``/``dst_ip`` are 4 or 16 raw bytes; ``net_hdr`` is the received
    IPv4 (20 bytes) or IPv6 (40 bytes) header when the codec has it, used to
    build the GRH of a UD receive buffer.  ``src_port`` is the UDP source port.
    """

    __slots__ = (
        "ack_req",
        "becn",
        "compare",
        "dest_qpn",
        "dma_len",
        "dst_ip",
        "fecn",
        "imm",
        "inv_rkey",
        "migreq",
        "msn",
        "net_hdr",
        "opcode",
        "orig",
        "pad",
        "payload",
        "pkey",
        "psn",
        "qkey",
        "rkey",
        "se",
        "src_ip",
        "src_port",
        "src_qpn",
        "swap_add",
        "syndrome",
        "tver",
        "va",
    )

    def __init__(
        self,
        opcode: int,
        dest_qpn: int = 0,
        psn: int = 0,
        payload: bytes | memoryview = b"",
        *,
        ack_req: bool = False,
        se: bool = False,
        pkey: int = 0xFFFF,
    ) -> None:
        self.opcode = opcode
        self.se = se
        self.migreq = False
        self.pad = -len(payload) & 3
        self.tver = 0
        self.pkey = pkey
        self.fecn = False
        self.becn = False
        self.dest_qpn = dest_qpn
        self.ack_req = ack_req
        self.psn = psn
        # RETH / AtomicETH
        self.va = 0
        self.rkey = 0
        self.dma_len = 0
        # AETH
        self.syndrome = 0
        self.msn = 0
        # DETH
        self.qkey = 0
        self.src_qpn = 0
        # ImmDt, IETH
        self.imm = 0
        self.inv_rkey = 0
        # AtomicETH, AtomicAckETH
        self.swap_add = 0
        self.compare = 0
        self.orig = 0
        self.payload = payload
        # network level
        self.src_ip = b""
        self.dst_ip = b""
        self.src_port = 0
        self.net_hdr = b""

    @property
    def flags(self) -> int:
        return OP_FLAGS[self.opcode]

    def copy(self) -> Packet:
        """A shallow copy (the payload view is shared)."""
        p = Packet.__new__(Packet)
        for name in Packet.__slots__:
            setattr(p, name, getattr(self, name))
        return p

    def fields(self) -> dict[str, object]:
        """Every field by name (tests and dumps; not for the data path)."""
        d = {name: getattr(self, name) for name in Packet.__slots__}
        d["payload"] = bytes(self.payload)
        return d

    def __repr__(self) -> str:
        try:
            name = Opcode(self.opcode).name
        except ValueError:
            name = f"0x{self.opcode:02x}"
        return (
            f"<Packet {name} qpn 0x{self.dest_qpn:06x} psn {self.psn}"
            f"{' A' if self.ack_req else ''} len {len(self.payload)}>"
        )


class Train:
    """``n`` MIDDLE packets of one SEND/WRITE that differ only in PSN and AckReq.

    The requester hands one of these to the socket layer instead of ``n``
    :class:`Packet` objects; the socket layer patches a header template per
    packet.  ``head`` is the first packet (its payload the first segment);
    segment ``j`` is ``data[off + j*mtu : off + (j+1)*mtu]`` at PSN
    ``head.psn + j``; AckReq is set where ``(since + j + 1) % per_ack == 0``
    (and only when ``reliable``), the requester's ACK-request cadence.
    """

    __slots__ = ("data", "head", "mtu", "n", "off", "per_ack", "reliable", "since")

    def __init__(self, head: Packet, data: bytes | memoryview, off: int, mtu: int, n: int,
                 since: int, per_ack: int, reliable: bool) -> None:
        self.head = head
        self.data = data
        self.off = off
        self.mtu = mtu
        self.n = n
        self.since = since
        self.per_ack = per_ack
        self.reliable = reliable

    def packets(self) -> list[Packet]:
        """The train as separate packets (loopback delivery, tests)."""
        h = self.head
        out = []
        for j in range(self.n):
            p = h.copy()
            p.psn = (h.psn + j) & 0xFFFFFF
            off = self.off + j * self.mtu
            p.payload = self.data[off : off + self.mtu]
            p.ack_req = self.reliable and (self.since + j + 1) % self.per_ack == 0
            out.append(p)
        return out


class WqeRun:
    """Packets ``k0`` .. ``k0 + m - 1`` of one SEND/WRITE WQE, as one record.

    What the requester hands the C engine's socket layer instead of a
    :class:`Packet` per segment (FIRST/ONLY with its RETH, MIDDLE, LAST with
    its ImmDt): packet ``k`` carries PSN ``first_psn + k`` and the payload
    ``data[k*mtu : (k+1)*mtu]``; ``ops`` are the FIRST, MIDDLE, LAST and ONLY
    opcodes as sent (LAST/ONLY already the immediate ones where ``imm`` is not
    None); ``se`` goes on the last packet; AckReq follows the requester's
    cadence from ``since`` (after each packet ``since + 1``, and AckReq with
    ``since`` back to 0 on the last packet or at ``per_ack``; only when
    ``reliable``).  :meth:`packets` is the reference the C code is tested
    against.
    """

    __slots__ = (
        "data", "dest_qpn", "dma_len", "dst_ip", "first_psn", "imm", "k0", "m", "mtu",
        "npkts", "ops", "per_ack", "pkey", "reliable", "reth", "rkey", "se", "since",
        "src_ip", "src_port", "va",
    )  # fmt: skip

    def __init__(self, ops: tuple[int, int, int, int], dest_qpn: int, pkey: int,
                 first_psn: int, npkts: int, data: bytes | memoryview, mtu: int,
                 k0: int, m: int, since: int, per_ack: int, reliable: bool) -> None:
        self.ops = ops
        self.dest_qpn = dest_qpn
        self.pkey = pkey
        self.first_psn = first_psn
        self.npkts = npkts
        self.data = data
        self.mtu = mtu
        self.k0 = k0
        self.m = m
        self.since = since
        self.per_ack = per_ack
        self.reliable = reliable
        self.reth = False  # a WRITE: the FIRST/ONLY carries va, rkey, dma_len
        self.va = 0
        self.rkey = 0
        self.dma_len = 0
        self.imm: int | None = None
        self.se = False
        self.src_ip = b""
        self.dst_ip = b""
        self.src_port = 0

    @property
    def since_after(self) -> int:
        """The requester's ``since_ack_req`` after the run."""
        if self.k0 + self.m >= self.npkts:
            return 0
        return (self.since + self.m) % self.per_ack

    def packets(self) -> list[Packet]:
        """The run as separate packets (loopback delivery, the Python engine, tests)."""
        out = []
        mtu = self.mtu
        data = self.data
        last_k = self.npkts - 1
        since = self.since
        op_first, op_middle, op_last, op_only = self.ops
        for k in range(self.k0, self.k0 + self.m):
            first = k == 0
            last = k == last_k
            op = (op_only if last else op_first) if first else (op_last if last else op_middle)
            p = Packet(op, self.dest_qpn, (self.first_psn + k) & MAX_PSN,
                       data[k * mtu : (k + 1) * mtu], pkey=self.pkey)
            if first and self.reth:
                p.va = self.va
                p.rkey = self.rkey
                p.dma_len = self.dma_len
            if last:
                if self.imm is not None:
                    p.imm = self.imm
                p.se = self.se
            since += 1
            if last or since >= self.per_ack:
                p.ack_req = self.reliable
                since = 0
            p.src_ip = self.src_ip
            p.dst_ip = self.dst_ip
            p.src_port = self.src_port
            out.append(p)
        return out
