"""Numbers an off-path peer must not guess: PSNs, keys, CM communication IDs, TIDs.

Drawn from the operating system's CSPRNG (what ``secrets`` reads), never from
``random``: 624 outputs of a Mersenne Twister give its whole state, and
``random.seed`` makes every later value the same.  Linux draws these with
``get_random_u32``.  ``os.urandom`` per value is a ``getrandom()`` call that may
give up the GIL, so values come from a buffer refilled 4 KiB at a time (one
call per 1,024 values of 32 bits).
"""

from __future__ import annotations

import os
import threading

_CHUNK = 4096


class OsRandom:
    """A thread-safe source of unsigned random ints from ``os.urandom``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._pos = 0
        self._pid = os.getpid()

    def bits(self, n: int) -> int:
        """A random int in ``0 .. 2**n - 1`` (``n`` at most 64)."""
        size = (n + 7) // 8
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not repeat its parent's values
                self._buf, self._pos, self._pid = b"", 0, os.getpid()
            if self._pos + size > len(self._buf):
                self._buf, self._pos = os.urandom(_CHUNK), 0
            raw = self._buf[self._pos : self._pos + size]
            self._pos += size
        return int.from_bytes(raw, "little") & ((1 << n) - 1)


_SOURCE = OsRandom()


def randbits(n: int) -> int:
    """A random int of ``n`` bits from the process-wide :class:`OsRandom`."""
    return _SOURCE.bits(n)


__all__ = ["OsRandom", "randbits"]
