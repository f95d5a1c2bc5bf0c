"""Pure parts of the CM agent's routing: the listen table, the TID rule, sender checks.

:class:`ListenTable` finds the listen an incoming REQ or SIDR_REQ belongs to
(IBA 12.6.5, IBAL's ``ib_cm_listen`` rules): by service ID, then by compare
data on the private data, then by the local CA/port/LID/P_Key the REQ came
through (0 is a wildcard).  A listen with compare data that matches is more
specific than one without; two listens on one service ID with the same
compare data (or different compare windows) are refused with
``InvalidSetting``.  No I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from ibal.status import InvalidParameter, InvalidSetting
from ibal.types import MadAddr

__all__ = ["Arrival", "ListenLike", "ListenTable", "as_int", "form_tid", "same_sender",
           "sender_key"]


class ListenLike(Protocol):
    """What the table needs of a listen."""

    svc_id: int
    ca_guid: int
    port_guid: int
    lid: int
    pkey: int
    compare_offset: int
    compare_buf: bytes
    ud: bool


@dataclass(frozen=True, slots=True)
class Arrival:
    """Where a REQ came in (the facts a directed listen filters on)."""

    ca_guid: int
    port_guid: int
    lid: int
    pkey: int


class ListenTable:
    """Listens by service ID (see the module docstring)."""

    def __init__(self) -> None:
        self._by_svc: dict[tuple[int, bool], list[ListenLike]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_svc.values())

    def __iter__(self) -> Iterator[ListenLike]:
        for v in self._by_svc.values():
            yield from v

    def add(self, listen: ListenLike) -> None:
        """Add ``listen``; ``InvalidSetting`` when it is not unique."""
        key = (listen.svc_id, listen.ud)
        same = self._by_svc.get(key, [])
        for other in same:
            if not _overlap(other, listen):
                continue
            if (other.compare_offset, len(other.compare_buf)) != (
                listen.compare_offset, len(listen.compare_buf)
            ) and other.compare_buf and listen.compare_buf:
                raise InvalidSetting(f"listens on service ID 0x{listen.svc_id:016x} must use "
                                     "the same compare offset and length")  # fmt: skip
            if other.compare_buf == listen.compare_buf:
                raise InvalidSetting(f"service ID 0x{listen.svc_id:016x} is already listened "
                                     "on with the same compare data")  # fmt: skip
        self._by_svc.setdefault(key, []).append(listen)

    def remove(self, listen: ListenLike) -> None:
        key = (listen.svc_id, listen.ud)
        same = self._by_svc.get(key)
        if same is None:
            return
        self._by_svc[key] = [x for x in same if x is not listen]
        if not self._by_svc[key]:
            del self._by_svc[key]

    def match(self, svc_id: int, pdata: bytes, at: Arrival, *, ud: bool = False
              ) -> ListenLike | None:  # fmt: skip
        """The listen for a REQ (``ud``: a SIDR_REQ) to ``svc_id`` with ``pdata``, or ``None``."""
        best: ListenLike | None = None
        for listen in self._by_svc.get((svc_id, ud), ()):
            if not _filters(listen, at):
                continue
            if listen.compare_buf:
                end = listen.compare_offset + len(listen.compare_buf)
                if pdata[listen.compare_offset : end] != listen.compare_buf:
                    continue
                return listen  # compare data matched: the most specific
            if best is None:
                best = listen
        return best


def _filters(listen: ListenLike, at: Arrival) -> bool:
    return all(want == 0 or want == have for want, have in (
        (listen.ca_guid, at.ca_guid), (listen.port_guid, at.port_guid),
        (listen.lid, at.lid), (listen.pkey, at.pkey)))  # fmt: skip


def _overlap(a: ListenLike, b: ListenLike) -> bool:
    """Whether one REQ could reach both (their directed filters do not exclude each other)."""
    pairs = ((a.ca_guid, b.ca_guid), (a.port_guid, b.port_guid), (a.lid, b.lid),
             (a.pkey, b.pkey))  # fmt: skip
    return all(x == 0 or y == 0 or x == y for x, y in pairs)


def form_tid(hi_tid: int, local_comm_id: int) -> int:
    """The TID of a message that opens an exchange (REQ, DREQ, LAP, SIDR_REQ), as Linux's
    ``cm_form_tid``: the agent's high half, and the comm ID as it lies in memory (its
    big-endian bytes read as a little-endian host's integer) in the low half."""
    low = int.from_bytes(local_comm_id.to_bytes(4, "big"), "little")
    return (hi_tid & 0xFFFFFFFF) << 32 | low


def as_int(v: object) -> int:
    """A decoded int field (``InvalidParameter`` for anything else: a forged MAD)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidParameter(f"expected an int field, got {v!r}")
    return v


def sender_key(addr: MadAddr) -> tuple[int, bytes]:
    """Who sent a MAD: its LID and, with a GRH, its GID."""
    return (addr.dlid, addr.grh.dgid.packed if addr.grh is not None else b"")


def same_sender(expected: MadAddr, got: MadAddr) -> bool:
    """Whether a MAD from ``got`` may come from the peer reached at ``expected``."""
    if expected.grh is not None and got.grh is not None:
        return expected.grh.dgid == got.grh.dgid
    if expected.grh is None and got.grh is None:
        return expected.dlid == got.dlid
    return expected.dlid == got.dlid or expected.dlid in (0, 0xFFFF)
