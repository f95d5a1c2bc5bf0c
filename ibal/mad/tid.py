"""Outstanding MAD sends keyed by transaction ID: the sans-IO half of request/response.

:class:`Pending` holds one entry per send until it ends: a request that
waits for its response under its TID (with the retries it has left), any
other send under a private serial.  It knows nothing of QPs, buffers or
clocks; the I/O layer (today :mod:`ibal.mad.altqp`) posts, arms timers and
asks it what a completion, a time-out or an arriving response means.  Not
thread-safe: the owner holds its lock around every call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Generic, TypeVar

from ibal.status import InvalidParameter

T = TypeVar("T")


@dataclass(eq=False)
class _Entry(Generic[T]):
    item: T
    retries: int
    awaits: bool


class Pending(Generic[T]):
    """Sends of one client, each until its end (see the module docstring)."""

    def __init__(self, mgmt_class: int) -> None:
        self.mgmt_class = mgmt_class
        self._entries: dict[int, _Entry[T]] = {}
        self._serials = itertools.count(-1, -1)  # below every TID: never clash

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, item: T, tid: int | None, retries: int = 0) -> int:
        """Track ``item``; with a ``tid`` it awaits a response, at most ``1 + retries``
        sends.  Returns its key.  ``InvalidParameter`` when that TID is outstanding."""
        if tid is None:
            key = next(self._serials)
        else:
            key = tid
            if key in self._entries:
                raise InvalidParameter(f"a request with TID 0x{tid:016x} is outstanding")
        self._entries[key] = _Entry(item, max(retries, 0) if tid is not None else 0,
                                    tid is not None)
        return key

    def get(self, key: int) -> T | None:
        entry = self._entries.get(key)
        return entry.item if entry is not None else None

    def pop(self, key: int) -> T | None:
        entry = self._entries.pop(key, None)
        return entry.item if entry is not None else None

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
        entry = self._entries.get(tid)
        if entry is None or not entry.awaits or mad[1] != self.mgmt_class:
            return None
        del self._entries[tid]
        return entry.item

    def drain(self) -> list[tuple[int, T]]:
        """Every entry, removed (a free or deregistration cancels them)."""
        out = [(k, e.item) for k, e in self._entries.items()]
        self._entries.clear()
        return out
