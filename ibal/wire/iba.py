"""IBA transport headers (BTH and its extension headers) as field tables, and their codec.

Every header is a :class:`~ibal.wire.fields.Table` whose field names are the
attribute names of :class:`~ibal.wire.packet.Packet`, so one compiled codec per
opcode (BTH and its extension headers laid end to end, in the order of
``roce-wire.md`` 2.3) moves a packet's headers between bytes and the record with
one ``struct`` call.  Facts: ``/work/shared/spec/roce-wire.md`` section 2 (Linux
``rxe_hdr.h``, ``rxe_opcode.c``, ``include/rdma/ib_pack.h``).

:func:`decode` turns a transport packet (BTH ... ICRC) into a :class:`Packet` or
raises :class:`Malformed` with a :class:`DropReason` a provider counts;
:func:`encode_headers` is the way back.  The RoCEv2 framing (IP/UDP, the ICRC)
is the rxe provider's (``ibal.providers.rxe.wire``); the mock's InfiniBand
captures use the same headers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from ibal.wire import packet as pk
from ibal.wire.fields import Buffer, F, Kind, R, Table
from ibal.wire.packet import Opcode, Packet

# ----------------------------------------------------------------- header tables

BTH: Final = Table("BTH", [
    F("opcode", 8, enum=Opcode, title="Opcode"),
    F("se", 1, kind=Kind.BOOL, title="Solicited Event"),
    F("migreq", 1, kind=Kind.BOOL, title="MigReq"),
    F("pad", 2, title="Pad Count"),
    F("tver", 4, title="Header Version"),
    F("pkey", 16, hex=True, title="Partition Key", default=0xFFFF),
    F("fecn", 1, kind=Kind.BOOL, title="FECN"),
    F("becn", 1, kind=Kind.BOOL, title="BECN"),
    R(6),
    F("dest_qpn", 24, hex=True, title="Destination Queue Pair"),
    F("ack_req", 1, kind=Kind.BOOL, title="Acknowledge Request"),
    R(7),
    F("psn", 24, title="Packet Sequence Number"),
])  # fmt: skip
RETH: Final = Table("RETH", [
    F("va", 64, hex=True, title="Virtual Address"),
    F("rkey", 32, hex=True, title="Remote Key"),
    F("dma_len", 32, title="DMA Length"),
])  # fmt: skip
AETH: Final = Table("AETH", [
    F("syndrome", 8, hex=True, title="Syndrome"),
    F("msn", 24, title="Message Sequence Number"),
])  # fmt: skip
DETH: Final = Table("DETH", [
    F("qkey", 32, hex=True, title="Queue Key"),
    R(8),
    F("src_qpn", 24, hex=True, title="Source Queue Pair"),
])  # fmt: skip
IMMDT: Final = Table("ImmDt", [F("imm", 32, hex=True, title="Immediate Data")])
IETH: Final = Table("IETH", [F("inv_rkey", 32, hex=True, title="Invalidate R_Key")])
ATOMIC_ETH: Final = Table("AtomicETH", [
    F("va", 64, hex=True, title="Virtual Address"),
    F("rkey", 32, hex=True, title="Remote Key"),
    F("swap_add", 64, hex=True, title="Swap (Or Add) Data"),
    F("compare", 64, hex=True, title="Compare Data"),
])  # fmt: skip
ATOMIC_ACK_ETH: Final = Table("AtomicAckETH", [
    F("orig", 64, hex=True, title="Original Remote Data"),
])  # fmt: skip

# Extension headers in wire order (roce-wire.md 2.3), keyed by their opcode flag.
_EXT_ORDER: Final = (
    (pk.DETH, DETH),
    (pk.RETH, RETH),
    (pk.ATOMIC_ETH, ATOMIC_ETH),
    (pk.AETH, AETH),
    (pk.ATOMIC_ACK_ETH, ATOMIC_ACK_ETH),
    (pk.IMMDT, IMMDT),
    (pk.IETH, IETH),
)


@dataclass(frozen=True)
class OpcodeFormat:
    """The header sequence of one opcode and its compiled codec."""

    opcode: Opcode
    headers: tuple[Table, ...]  # BTH first
    codec: Table  # the headers laid end to end
    flags: int

    @property
    def header_len(self) -> int:
        return self.codec.size


def _formats() -> tuple[OpcodeFormat | None, ...]:
    out: list[OpcodeFormat | None] = [None] * 256
    for op in Opcode:
        flags = pk.OP_FLAGS[op]
        headers = (BTH, *(t for bit, t in _EXT_ORDER if flags & bit))
        codec = Table.concat(op.name, headers)
        assert codec.size == pk.HDR_LEN[op], op
        out[op] = OpcodeFormat(op, headers, codec, flags)
    return tuple(out)


FORMATS: Final[tuple[OpcodeFormat | None, ...]] = _formats()
"""Indexed by the opcode byte; ``None`` for an opcode rxe does not implement."""

def _record_maker(codec: Table) -> Callable[[Buffer], Packet]:
    """A function that makes the record of one opcode from its bytes: the
    headers' fields from one compiled ``unpack``, every attribute those headers
    do not carry set to its zero default (one chained assignment per value)."""
    template = Packet(0)
    groups: dict[str, list[str]] = {}
    for n in Packet.__slots__:
        if n in codec.names or n == "payload":
            continue
        groups.setdefault(repr(getattr(template, n)), []).append(n)
    attrs = ", ".join(f"p.{n}" for n in codec.names)
    src = "\n".join([
        "def make(buf):",
        "    p = _new(_Packet)",
        *(f"    {' = '.join('p.' + n for n in ns)} = {v}" for v, ns in groups.items()),
        f"    {attrs}{',' if len(codec.names) == 1 else ''} = _unpack(buf, 0)",
        "    return p",
    ])  # fmt: skip
    ns_: dict[str, Any] = {"_new": Packet.__new__, "_Packet": Packet, "_unpack": codec.unpack}
    exec(compile(src, f"<rxe record {codec.name}>", "exec"), ns_)
    return cast("Callable[[Buffer], Packet]", ns_["make"])


_MAKE: Final = tuple(_record_maker(f.codec) if f else None for f in FORMATS)
_STORE: Final = tuple(f.codec.store if f else None for f in FORMATS)
_HLEN: Final = pk.HDR_LEN
_FLAGS: Final = pk.OP_FLAGS
ICRC_LEN: Final = pk.ICRC_LEN


# ---------------------------------------------------------------- decode errors


class DropReason(enum.Enum):
    """Why a received datagram was not a packet; the provider counts each."""

    SHORT = "short"  # shorter than BTH + ICRC
    BAD_OPCODE = "bad_opcode"  # opcode rxe does not implement
    BAD_TVER = "bad_tver"  # BTH transport header version not 0
    BAD_LENGTH = "bad_length"  # too short for the opcode's headers, or payload where none goes
    BAD_PAD = "bad_pad"  # pad count larger than the payload
    BAD_ICRC = "bad_icrc"


class Malformed(ValueError):
    """A datagram that is not a valid RoCEv2 packet; ``reason`` says why."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


# ----------------------------------------------------------------- codec


def decode(buf: Buffer) -> Packet:
    """Parse a UDP payload (BTH ... payload, pad, ICRC) into a packet.

    Checks structure only (length, opcode, version, pad); the ICRC needs the
    IP and UDP headers, see :func:`icrc_ok`.  ``payload`` is a view into
    ``buf`` (no copy).  Raises :class:`Malformed`.
    """
    n = len(buf)
    if n < pk.BTH_LEN + ICRC_LEN:
        raise Malformed(DropReason.SHORT, f"{n} bytes")
    op = buf[0]
    make = _MAKE[op]
    if make is None:
        raise Malformed(DropReason.BAD_OPCODE, f"opcode {op:#04x}")
    hlen = _HLEN[op]
    end = n - ICRC_LEN
    if end < hlen:
        raise Malformed(DropReason.BAD_LENGTH, f"{n} bytes for {Opcode(op).name}")
    p = make(buf)
    if p.tver:
        raise Malformed(DropReason.BAD_TVER, f"version {p.tver}")
    plen = end - hlen - p.pad
    if plen < 0:
        raise Malformed(DropReason.BAD_PAD, f"pad {p.pad} with {end - hlen} bytes")
    if plen and not _FLAGS[op] & pk.PAYLOAD:
        raise Malformed(DropReason.BAD_LENGTH, f"{plen} payload bytes on {Opcode(op).name}")
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    p.payload = mv[hlen : hlen + plen]
    return p


def encode_headers(p: Packet) -> bytearray:
    """BTH and extension headers of ``p``; sets ``p.pad`` from the payload."""
    op = p.opcode
    store = _STORE[op] if 0 <= op < 256 else None
    if store is None:
        raise ValueError(f"opcode {op:#x} is not implemented")
    p.pad = -len(p.payload) & 3
    hdr = bytearray(_HLEN[op])
    store(p, hdr, 0)
    return hdr




def dump(buf: Buffer) -> str:
    """A RoCEv2 UDP payload as Wireshark-like text (one block per header)."""
    op = buf[0] if len(buf) else -1
    fmt = FORMATS[op] if 0 <= op < 256 else None
    if fmt is None:
        return f"<{len(buf)} bytes, opcode {op:#x} unknown>"
    out = []
    off = 0
    for t in fmt.headers:
        out.append(t.dump(buf, off))
        off += t.size
    rest = len(buf) - off - ICRC_LEN
    pad = buf[1] >> 4 & 3
    out.append(f"Payload: {max(rest - pad, 0)} bytes, pad {pad}")
    if rest >= 0:
        out.append(f"ICRC: {bytes(buf[-4:]).hex()}")
    return "\n".join(out)
