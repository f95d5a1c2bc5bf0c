"""One SA Report receiver per port for every AL instance of a manager.

The SA sends a Report once to each subscribed port and resends it until a
ReportResp comes back, and a port's MAD layer gives a class's unsolicited
MADs to one agent.  So the :class:`~ibal.sa.port.SaPort`\\ s of one manager
on one port (one per AL instance) share a :class:`ReportHub`: the first
member with report listeners holds the receiver (a MAD service on its QP1
alias), each Report reaches the listeners of every member, and one
ReportResp goes back.  When the holder goes, the next member with listeners
takes the receiver over (a Report sent in between is resent by the SA).

Another process can still hold the class on the port (its agent, through
the kernel's MAD layer): then no member of this manager gets Reports and
each says so in ``stats["reports_elsewhere"]``.

Threads: :meth:`ReportHub.join` and :meth:`ReportHub.leave` on any thread;
:meth:`ReportHub.deliveries` on the receive thread of the holder's service.
None blocks beyond the hub's own lock and a MAD-service (de)registration.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from ibal.al import StashKey

if TYPE_CHECKING:
    from ibal.al import AlManager
    from ibal.sa.port import ReportListener, SaPort

_HUBS: StashKey[dict[int, ReportHub]] = StashKey()
_HUBS_LOCK = threading.Lock()


def hub_of(mgr: AlManager, port_guid: int) -> ReportHub:
    """The manager's hub for ``port_guid``, made on first use."""
    with _HUBS_LOCK:
        hubs = mgr.stash.setdefault(_HUBS, {})
        hub = hubs.get(port_guid)
        if hub is None:
            hub = hubs[port_guid] = ReportHub(mgr, port_guid)
        return hub


class ReportHub:
    """The SA ports of one manager on one port that listen for Reports."""

    def __init__(self, mgr: AlManager, port_guid: int) -> None:
        self._mgr = weakref.ref(mgr)
        self.port_guid = port_guid
        self._lock = threading.Lock()
        self._members: list[SaPort] = []  # in the order they joined
        self._holder: SaPort | None = None

    def __repr__(self) -> str:
        return f"<ReportHub 0x{self.port_guid:016x} {len(self._members)} ports>"

    @property
    def holder(self) -> SaPort | None:
        """The member whose service receives the port's Reports (``None``: none does)."""
        return self._holder

    def join(self, port: SaPort) -> None:
        """``port`` listens for Reports: it gets them from now on (it takes the receiver
        when nobody of this manager holds it)."""
        with self._lock:
            if port not in self._members:
                self._members.append(port)
            self._elect()

    def leave(self, port: SaPort) -> None:
        """``port`` is going: forget it; if it held the receiver, it lets go and the next
        member takes over.  The last one out removes the hub."""
        with self._lock:
            if port in self._members:
                self._members.remove(port)
            if self._holder is port:
                self._holder = None
                port.release_reports()
                self._elect()
            empty = not self._members
        if empty:
            mgr = self._mgr()
            with _HUBS_LOCK:
                hubs = mgr.stash.get(_HUBS, None) if mgr is not None else None
                if hubs is not None and hubs.get(self.port_guid) is self and not self._members:
                    del hubs[self.port_guid]

    def members(self) -> list[SaPort]:
        """The ports that listen (a snapshot; no lock taken: safe under the hub's own)."""
        return list(self._members)

    def deliveries(self) -> list[tuple[SaPort, list[ReportListener]]]:
        """Each member with listeners, and its listeners: whom a Report goes to."""
        with self._lock:
            members = list(self._members)
        out = []
        for m in members:
            fns = m.report_listeners()
            if fns:
                out.append((m, fns))
        return out

    def _elect(self) -> None:
        """Under the lock: a member takes the receiver when none holds it."""
        if self._holder is not None:
            return
        for m in self._members:
            if not m.alive:
                continue
            taken = m.take_reports(self)
            if taken is None:
                return  # another process serves the port's Reports: each member says so
            if taken:
                self._holder = m
                return
