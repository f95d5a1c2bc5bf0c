"""The scatter form of a memory range: one range of registered memory as several views.

A :class:`~ibal.transport.qp.MemoryAccess` hands the core a writable
``memoryview`` per range when the region is one buffer (rxe, every ordinary
registration).  A region built of separate buffers (the mock's physical
regions and FMR maps: pages made contiguous only at an I/O VA) has no single
view of a range that crosses a page, so it hands a :class:`Scatter` instead.
The core uses a range only through ``len``, slicing and slice assignment
(and ``bytes``/``int.from_bytes`` for an atomic's 8 bytes), which both
forms answer alike: the core reads no type, so a provider whose ranges are
all views pays nothing for this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias


class Scatter:
    """A range of ``len(self)`` bytes laid over ``parts`` in order (no part empty)."""

    __slots__ = ("_ends", "_len", "parts")

    def __init__(self, parts: Sequence[memoryview]) -> None:
        self.parts = tuple(p for p in parts if len(p))
        ends = []
        n = 0
        for p in self.parts:
            n += len(p)
            ends.append(n)
        self._ends = tuple(ends)
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"<Scatter {self._len} B in {len(self.parts)} parts>"

    def _bounds(self, s: slice) -> tuple[int, int]:
        start, stop, step = s.indices(self._len)
        if step != 1:
            raise ValueError("a Scatter is sliced with step 1 only")
        return start, max(start, stop)

    def _walk(self, start: int, stop: int) -> list[memoryview]:
        """The pieces of the parts that cover ``[start, stop)``, in order."""
        out: list[memoryview] = []
        lo = 0
        for p, hi in zip(self.parts, self._ends, strict=True):
            if hi > start and lo < stop:
                out.append(p[max(start - lo, 0) : min(stop, hi) - lo])
            if hi >= stop:
                break
            lo = hi
        return out

    def __getitem__(self, s: slice) -> memoryview | bytes:
        """A view when the slice lies in one part, else a copy of the bytes."""
        start, stop = self._bounds(s)
        pieces = self._walk(start, stop)
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def __setitem__(self, s: slice, data: bytes | bytearray | memoryview) -> None:
        start, stop = self._bounds(s)
        src = memoryview(data).cast("B")
        if len(src) != stop - start:
            # as a memoryview does: a range never changes size
            raise ValueError(f"{len(src)} bytes for a {stop - start}-byte slice of a Scatter")
        pos = 0
        for piece in self._walk(start, stop):
            n = len(piece)
            piece[:] = src[pos : pos + n]
            pos += n

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Range: TypeAlias = memoryview | Scatter
"""What a :class:`~ibal.transport.qp.MemoryAccess` hands for one range."""
