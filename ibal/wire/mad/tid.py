"""Outstanding MAD sends keyed by transaction ID: the sans-IO half of request/response.

:class:`Pending` holds one entry per send until it ends: a request that
waits for its response under its TID (with the retries it has left), any
other send under a private serial.  It knows nothing of QPs, buffers or
clocks; the I/O layers that match answers to requests (the AL's special-QP
transport, :mod:`ibal.mad.service`, :mod:`ibal.mad.altqp`) post, arm timers
and ask it what a completion, a time-out or an arriving response means.
It imports nothing from ``ibal.al``, so the access layer uses it as it uses
the wire tables.  Not thread-safe: the owner holds its lock around every call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Generic, TypeVar

from ibal.status import InvalidParameter

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class _Entry(Generic[T]):
    item: T
    retries: int
    awaits: bool


class Pending(Generic[T]):
    """Sends of one client, each until its end (see the module docstring).

    ``tid_bits``: 64 where the key is the whole TID, 32 where the transport
    routes by the high half and the key is the low half.  :meth:`fresh_tid`
    counts from ``first_tid``.
    """

    def __init__(self, mgmt_class: int, tid_bits: int = 64, first_tid: int = 1) -> None:
        self.mgmt_class = mgmt_class
        self._mask = (1 << tid_bits) - 1
        self._entries: dict[int, _Entry[T]] = {}
        self._serials = itertools.count(-1, -1)  # below every TID: never clash
        self._tids = itertools.count(first_tid)

    def __len__(self) -> int:
        return len(self._entries)

    def _what(self, tid: int) -> str:
        return f"TID low 0x{tid:08x}" if self._mask == 0xFFFFFFFF else f"TID 0x{tid:016x}"

    def fresh_tid(self) -> int:
        """A TID (of ``tid_bits``) for a request that has none: never 0, never outstanding."""
        while True:
            tid = next(self._tids) & self._mask
            if tid and tid not in self._entries:
                return tid

    def add(self, item: T, tid: int | None, retries: int = 0) -> int:
        """Track ``item``; with a ``tid`` it awaits a response, at most ``1 + retries``
        sends.  Returns its key.  ``InvalidParameter`` when that TID is outstanding."""
        if tid is None:
            key = next(self._serials)
        else:
            key = tid
            if key in self._entries:
                raise InvalidParameter(f"a request with {self._what(tid)} is outstanding")
        self._entries[key] = _Entry(item, max(retries, 0) if tid is not None else 0,
                                    tid is not None)
        return key

    def get(self, key: int) -> T | None:
        entry = self._entries.get(key)
        return entry.item if entry is not None else None

    def waiting(self, tid: int) -> T | None:
        """The request that waits for a response of TID ``tid`` (left in place), if any."""
        entry = self._entries.get(tid)
        return entry.item if entry is not None and entry.awaits else None

    def end(self, key: int, item: T | None = None) -> T | None:
        """Remove ``key``'s entry (only if it is ``item``, when given); its item, or None
        when nothing (or another send) is there: it ended already."""
        entry = self._entries.get(key)
        if entry is None or (item is not None and entry.item is not item):
            return None
        del self._entries[key]
        return entry.item

    def awaits(self, item: T) -> bool:
        """Whether ``item`` still waits for a response (its send completion does not end it)."""
        return any(e.item is item and e.awaits for e in self._entries.values())

    def remove(self, item: T) -> bool:
        """Forget ``item``; False when it had already ended (a response or cancel won)."""
        for key, entry in self._entries.items():
            if entry.item is item:
                del self._entries[key]
                return True
        return False

    def retry(self, key: int) -> bool:
        """A time-out of ``key``: True (and one retry fewer) when it may go out again."""
        entry = self._entries.get(key)
        if entry is None or entry.retries <= 0:
            return False
        entry.retries -= 1
        return True

    def answer(self, tid: int, mad: bytes) -> T | None:
        """The request a response of TID ``tid`` ends, removed; None when nothing waits
        for it or it is of another class (a forged answer ends nothing)."""
        item = self.waiting(tid)
        if item is None or mad[1] != self.mgmt_class:
            return None
        del self._entries[tid]
        return item

    def items(self) -> list[tuple[int, T]]:
        """Every entry (a copy: the caller may end them while it walks the list)."""
        return [(k, e.item) for k, e in self._entries.items()]

    def drain(self) -> list[tuple[int, T]]:
        """Every entry, removed (a free or deregistration cancels them)."""
        out = self.items()
        self._entries.clear()
        return out
