"""24-bit PSN serial arithmetic (IBA 9.7.1; rxe ``psn_compare``)."""

from __future__ import annotations

from typing import Final

PSN_MASK: Final = 0xFFFFFF
PSN_HALF: Final = 0x800000
PSN_MODULO: Final = 0x1000000


def psn_diff(a: int, b: int) -> int:
    """``a - b`` in 24-bit PSN space, in ``[-2^23, 2^23)``: its sign orders PSNs."""
    d = (a - b) & PSN_MASK
    return d - PSN_MODULO if d >= PSN_HALF else d


def psn_add(a: int, n: int) -> int:
    return (a + n) & PSN_MASK


def packets_for(length: int, mtu: int) -> int:
    """How many packets (PSNs) a message of ``length`` bytes takes at path MTU ``mtu``."""
    return 1 if length <= mtu else (length + mtu - 1) // mtu
