"""Small IBA rules both engines apply: NAK codes, key matching, atomics, the GRH."""

from __future__ import annotations

import enum
from typing import Final

from ibal.types import WcStatus

U64: Final = 0xFFFF_FFFF_FFFF_FFFF
CONTROLLED_QKEY_BIT: Final = 0x80000000


class NakCode(enum.IntEnum):
    """AETH NAK codes (IBA 9.7.5.2.2); the wire syndrome is ``0x60 | code``."""

    PSN_SEQ_ERR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS = 2
    REMOTE_OP = 3


NAK_WC_STATUS: Final[dict[int, WcStatus]] = {
    NakCode.INVALID_REQUEST: WcStatus.REM_INVALID_REQ_ERR,
    NakCode.REMOTE_ACCESS: WcStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OP: WcStatus.REM_OP_ERR,
}
"""The requester's completion status for a NAK that ends the QP (unknown: REM_OP_ERR)."""


def pkey_match(a: int, b: int) -> bool:
    """IBA 10.9.3: same key bits, not both limited members, not the invalid key."""
    if (a ^ b) & 0x7FFF or not (a & 0x7FFF):
        return False
    return bool((a | b) & 0x8000)


def effective_qkey(wr_qkey: int, qp_qkey: int) -> int:
    """IBA 10.2.5: a WR Q_Key with the high bit set means "use the QP's own Q_Key"."""
    return qp_qkey if wr_qkey & CONTROLLED_QKEY_BIT else wr_qkey


def atomic_result(compare_swap: bool, old: int, compare: int, swap_add: int) -> int:
    """The 64-bit value an atomic leaves in memory, given the value ``old`` it found."""
    if compare_swap:
        return swap_add & U64 if old == compare & U64 else old
    return (old + swap_add) & U64


def build_grh(
    sgid: bytes,
    dgid: bytes,
    payload_len: int,
    hop_limit: int = 64,
    tclass: int = 0,
    flow: int = 0,
    next_header: int = 0x1B,
) -> bytes:
    """A 40-byte GRH (IPv6 layout), as a UD receive buffer gets it."""
    word0 = (6 << 28) | ((tclass & 0xFF) << 20) | (flow & 0xFFFFF)
    return (
        word0.to_bytes(4, "big")
        + payload_len.to_bytes(2, "big")
        + bytes((next_header, hop_limit & 0xFF))
        + sgid
        + dgid
    )
