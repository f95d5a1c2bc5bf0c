"""The C engine's region table (``rxe_mr_*`` in fastpath.c), kept in step with the key table.

:class:`MrMirror` is a :class:`~ibal.providers.rxe.memory.KeyTable`'s mirror:
every ``install`` and ``remove`` (register, re-register, deregister, shared
and fast regions, window bind and invalidate) reaches it under the CA lock,
which the receive fast path holds for its whole run, so C never sees a table
half changed.  It holds exactly the regions ``QpMemory.remote`` would answer
for by R_Key (an :class:`Mr` whose ``rkey`` is the key, over a writable
buffer): a window, a key without remote rights, a read-only buffer or
anything unknown is absent, and absent is a miss the Python core answers,
never a refusal.  Each entry pins its buffer (``ffi.from_buffer``); the pin
goes with the entry, before the region lets go of the consumer's buffer.
"""

from __future__ import annotations

from typing import Any, Final

from ibal.providers.rxe.memory import Mr, Mw

CAPACITY: Final = 1 << 16
"""Slots of the C table (at most half used): a CA with more remote regions than
``CAPACITY // 2`` leaves the rest to the Python core."""


class MrMirror:
    """The C table of one CA's remotely accessible regions."""

    def __init__(self, ffi: Any, lib: Any, capacity: int = CAPACITY) -> None:
        self.ffi = ffi
        self.lib = lib
        t = lib.rxe_mr_table_new(capacity)
        if t == ffi.NULL:
            raise MemoryError("rxe_mr_table_new")
        self.table = ffi.gc(t, lib.rxe_mr_table_free)
        self._pins: dict[int, Any] = {}  # key -> the buffer C's entry points into
        self.full = 0  # regions left out because the table was full

    def installed(self, obj: Mr | Mw, key: int) -> None:
        """Mirrors ``KeyTable.install``: the region's entry, or none for anything else."""
        self.removed(key)
        if type(obj) is Mr and obj.rkey == key and key:
            self.put(key, obj.pd.num, obj.vaddr, obj.length, obj.access, obj.view)

    def put(self, key: int, pd: int, vaddr: int, length: int, access: int,
            view: memoryview) -> bool:
        """One region's entry (``installed``'s, and the tests' over other memory);
        False where C cannot write into ``view`` or the table is full."""
        if view.readonly or len(view) != length:
            return False
        try:
            pin = self.ffi.from_buffer(view, require_writable=True)
        except (TypeError, BufferError, ValueError):
            return False
        if self.lib.rxe_mr_put(self.table, key, pd, vaddr, length, access, pin) != 0:
            self.full += 1
            self.ffi.release(pin)
            return False
        self._pins[key] = pin
        return True

    def removed(self, key: int) -> None:
        """Mirrors ``KeyTable.remove``."""
        self.lib.rxe_mr_del(self.table, key & 0xFFFFFFFF)
        pin = self._pins.pop(key, None)
        if pin is not None:
            self.ffi.release(pin)

    def __len__(self) -> int:
        return int(self.lib.rxe_mr_count(self.table))


__all__ = ["CAPACITY", "MrMirror"]
