"""Numbers every layer shares: contract versions, P_Key and LID constants, request flags."""

from __future__ import annotations

import enum
from typing import TypeGuard

VERBS_VERSION = 2
"""The contract version this access layer speaks (2: MAD agents, see docs/writing-a-provider.md)."""

MIN_VERBS_VERSION = 1
"""The oldest contract version the AL still accepts (1: no MAD-agent verbs)."""


DEFAULT_PKEY = 0xFFFF


MULTICAST_LID_BASE = 0xC000
PERMISSIVE_LID = 0xFFFF
IB_ANY_INDEX = -1


class AlFlags(enum.IntFlag):
    """`ib_al_flags_t` of the request structs (queries, service registration, multicast,
    subscriptions, CM): ``SYNC`` (``IB_FLAGS_SYNC``) makes the call block until the
    operation completes; its callback still runs, before the call returns."""

    NONE = 0
    SYNC = 0x1


def is_int(value: object) -> TypeGuard[int]:
    """An int or an int subclass (``IntEnum``, ``IntFlag``), but not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
