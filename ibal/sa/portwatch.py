"""One PnP port registration per AL for the SA's clients that must redo their work.

The SA forgets multicast memberships and InformInfo subscriptions when the SM
asks its clients to re-register, or when the SM, the port's LID or its state
changes.  A :class:`PortWatch` keeps one port-class PnP registration per AL
and per kind of client and calls ``redo(client)`` for each live client of the
port that saw such an event (on the AL's PnP queue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from ibal.al import PnpClass, PnpEvent, PnpRec, StashKey

if TYPE_CHECKING:
    from ibal.al import AccessLayer

__all__ = ["REREGISTER_EVENTS", "PortWatch"]

REREGISTER_EVENTS = frozenset({
    PnpEvent.CLIENT_REREGISTER, PnpEvent.SM_CHANGE, PnpEvent.LID_CHANGE, PnpEvent.PORT_ACTIVE,
})  # fmt: skip
"""Port events after which the SA may have forgotten the port's clients."""

C = TypeVar("C")
W = TypeVar("W")

_STASH_LOCK = threading.Lock()


class PortWatch(Generic[C]):
    """The clients of each port (by port GUID, in the order they came) and the PnP watch."""

    def __init__(self, al: AccessLayer, redo: Callable[[C], object]) -> None:
        self._redo = redo
        self._lock = threading.Lock()
        self._clients: dict[int, dict[C, None]] = {}
        self._live = False  # the replay before REG_COMPLETE is not news
        self.registration = al.reg_pnp(PnpClass.PORT, self._event)

    @staticmethod
    def of(al: AccessLayer, key: StashKey[W], make: Callable[[AccessLayer], W]) -> W:
        """The AL's watch under ``key``, made by ``make(al)`` on first use."""
        with _STASH_LOCK:
            w = al.stash.get(key, None)
            if w is None:
                w = al.stash[key] = make(al)
            return w

    def add(self, port_guid: int, client: C) -> None:
        with self._lock:
            self._clients.setdefault(port_guid, {})[client] = None

    def remove(self, port_guid: int, client: C) -> None:
        with self._lock:
            self._clients.get(port_guid, {}).pop(client, None)

    def clients(self, port_guid: int | None = None) -> list[C]:
        """The port's clients (``None``: every port's)."""
        with self._lock:
            if port_guid is None:
                return [c for cs in self._clients.values() for c in cs]
            return list(self._clients.get(port_guid, {}))

    def _event(self, rec: PnpRec) -> None:
        if rec.event is PnpEvent.REG_COMPLETE:
            self._live = True
            return
        if not self._live or rec.event not in REREGISTER_EVENTS or rec.port_attr is None:
            return
        for c in self.clients(rec.port_attr.port_guid):
            self._redo(c)
