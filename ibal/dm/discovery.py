"""IOC discovery, the I/O layer: sweeps the fabric for I/O units and feeds ``mgr.io_devices``.

:class:`Discovery` is one per manager (:meth:`Discovery.start`): an internal
AL instance, a PnP client of the PORT class (``PnpOrder.DM``) that keeps a
DM requester (:class:`~ibal.dm.targets.DmPort`) per active port, and the
sweeps.  A sweep:

1. finds its targets (:class:`~ibal.dm.targets.TargetSearch`: the SA's
   PortInfoRecords with IsDeviceManagementSupported, NodeRecords and
   PathRecords on InfiniBand ports; paths to the configured
   :class:`~ibal.dm.targets.RocePeer` GIDs on Ethernet ports);
2. runs a :class:`~ibal.dm.sweep.Sweep` over them (the DM Gets, their retries
   on the AL's timers);
3. reports the :func:`~ibal.dm.sweep.diff` between its result and what the
   registry holds of the units this client reported to ``mgr.io_devices``,
   which raises IOU / IOC / IOC-path PnP events to every
   ``reg_pnp(PnpClass.IOU / IOC)`` client of the manager.

Sweeps run when a port becomes active, changes or goes, every ``interval``
seconds (``None``: never by themselves), and on :meth:`Discovery.sweep_now`.
A sweep asked while one runs follows it.  SA answers arrive on the MAD
receive thread, DM answers and timers on the misc queue; nothing here blocks
on them.  Counters: :attr:`Discovery.stats` (sweeps, SA failures, registry
changes) plus each sweep's own (:attr:`Discovery.last_stats`).  docs/ioc-discovery.md.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ibal.al import AccessLayer, Ca, PnpClass, PnpEvent, PnpOrder, PnpRec, StashKey, in_callback
from ibal.dm.sweep import (
    AddIoc,
    AddIou,
    AddPath,
    ArmTimer,
    Done,
    Found,
    IocPath,
    RemoveIoc,
    RemoveIou,
    RemovePath,
    Sweep,
    Target,
    Transmit,
    diff,
)
from ibal.dm.targets import (
    ENHANCED_COMP_MASK,
    PEERS_ENV,
    DmPort,
    RocePeer,
    TargetSearch,
    parse_peers,
)
from ibal.status import IbError, InvalidParameter, InvalidState, NotFound, Timeout
from ibal.types import LinkState, MadAddr

if TYPE_CHECKING:
    from ibal.al import AlManager, PnpRegistration, Timer

__all__ = ["ENHANCED_COMP_MASK", "Discovery", "DmPort", "RocePeer", "SweepHandle"]

log = logging.getLogger("ibal.dm")

_DISCOVERIES: StashKey[Discovery] = StashKey()  # in each manager's stash
_LOCK = threading.Lock()


class SweepHandle:
    """A sweep asked for: :meth:`wait` returns what it found."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.found: Found | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Found:
        """Block until the sweep ended; ``InvalidState`` on an AL callback thread (the
        sweep needs those threads), ``Timeout`` after ``timeout`` seconds."""
        if not self._done.is_set() and in_callback():
            raise InvalidState("SweepHandle.wait blocks: call it off the AL's callback threads")
        if not self._done.wait(timeout):
            raise Timeout(f"the sweep did not end within {timeout} s")
        assert self.found is not None
        return self.found

    def _set(self, found: Found) -> None:
        self.found = found
        self._done.set()


class _Run:
    """One sweep: the SA phase (a :class:`TargetSearch`), then the DM phase (a :class:`Sweep`)."""

    def __init__(self, handle: SweepHandle, search: TargetSearch) -> None:
        self.handle = handle
        self.search = search
        self.sweep: Sweep | None = None
        self.timer: Timer | None = None
        self.over = False


class Discovery:
    """The IOC-discovery client of one manager (see the module docstring)."""

    def __init__(self, mgr: AlManager, *, interval: float | None, timeout: float, retries: int,
                 window: int, roce_peers: Sequence[RocePeer],
                 trust_change_id: bool) -> None:  # fmt: skip
        self.mgr = mgr
        self.al: AccessLayer = mgr.open_al()
        self.interval = interval
        self.timeout, self.retries, self.window = timeout, retries, window
        self.trust_change_id = trust_change_id
        self.roce_peers: tuple[RocePeer, ...] = tuple(roce_peers)
        self.stats: Counter[str] = Counter()
        self.last_stats: Counter[str] = Counter()
        self.last_targets: tuple[Target, ...] = ()
        """The targets of the last sweep (diagnostics)."""
        self.found = Found()
        self._mine: set[int] = set()  # GUIDs of the IOUs this client reported
        self._lock = threading.RLock()
        self._cas: dict[int, Ca] = {}
        self._ports: dict[int, DmPort] = {}  # port GUID -> requester
        self._run: _Run | None = None
        self._next: SweepHandle | None = None  # asked while a run goes: the run after it
        self._tids = itertools.count(1)
        self._periodic: Timer | None = None
        self._closed = False
        self._pnp: PnpRegistration | None = None

    # ------------------------------------------------------------------ life
    @classmethod
    def start(cls, mgr: AlManager, *, interval: float | None = 60.0, timeout: float = 1.0,
              retries: int = 3, window: int = 16,
              roce_peers: Iterable[RocePeer] | None = None, trust_change_id: bool = True,
              ) -> Discovery:  # fmt: skip
        """The manager's discovery client, started on first call (later calls return it).

        ``interval``: seconds between sweeps (``None``: only on port changes and
        :meth:`sweep_now`); ``timeout``/``retries``/``window``: each DM Get's
        time-out, its further tries, the Gets in flight; ``roce_peers``: the GIDs
        asked from Ethernet ports (``None``: from ``IBAL_IOC_PEERS``, else none);
        ``trust_change_id``: a unit whose IOUnitInfo ChangeID and slots did not move
        since the last complete read is not asked further (False: every sweep reads
        everything).  The PnP replay (and so the first sweep's
        start) is delivered before it returns, except from a PnP callback.
        """
        if interval is not None and interval <= 0:
            raise InvalidParameter("interval must be positive (or None)")
        if timeout <= 0 or retries < 0 or window < 1:
            raise InvalidParameter("timeout > 0, retries >= 0 and window >= 1 are required")
        if roce_peers is None:
            roce_peers = parse_peers(os.environ.get(PEERS_ENV, ""))
        peers = tuple(roce_peers)
        if not all(isinstance(p, RocePeer) for p in peers):
            raise InvalidParameter("roce_peers must be RocePeer records")
        with _LOCK:
            d = mgr.stash.get(_DISCOVERIES, None)
            if d is not None and not d._closed and not d.al.closed:
                return d
            d = cls(mgr, interval=interval, timeout=timeout, retries=retries, window=window,
                    roce_peers=peers, trust_change_id=trust_change_id)  # fmt: skip
            mgr.stash[_DISCOVERIES] = d
        sync = not mgr.queues.pnp.is_current()
        flags = PnpClass.FLAG_REG_SYNC if sync else PnpClass(0)
        d._pnp = d.al.reg_pnp(PnpClass.PORT | flags, d._on_pnp, order=PnpOrder.DM)
        return d

    @classmethod
    def of(cls, mgr: AlManager) -> Discovery | None:
        """The manager's running discovery client, if started."""
        with _LOCK:
            d = mgr.stash.get(_DISCOVERIES, None)
        return d if d is not None and not d._closed and not d.al.closed else None

    def close(self) -> None:
        """Stop sweeping; what was reported stays in ``mgr.io_devices``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            run, self._run = self._run, None
            if self._periodic is not None:
                self._periodic.cancel()
        if run is not None:
            run.over = True
            run.search.cancel()
        for handle in (run.handle if run is not None else None, self._next):
            if handle is not None and not handle.done:
                handle._set(self.found)  # nobody waits for a sweep that will not come
        with contextlib.suppress(IbError):
            self.al.close()

    @property
    def idle(self) -> bool:
        """No sweep runs and none is asked for."""
        with self._lock:
            return self._run is None and self._next is None

    @property
    def ports(self) -> list[DmPort]:
        """The local ports swept from."""
        with self._lock:
            return [p for p in self._ports.values() if p.alive]

    # ------------------------------------------------------------------ PnP
    def _ca(self, ca_guid: int) -> Ca:
        ca = self._cas.get(ca_guid)
        if ca is None or not ca.alive:
            ca = self._cas[ca_guid] = self.al.open_ca(ca_guid)
        return ca

    def _on_pnp(self, rec: PnpRec) -> None:
        """PnP queue: a requester per active port; any change of one starts a sweep."""
        port = rec.port_attr
        if port is None or rec.event is PnpEvent.REG_COMPLETE:
            return
        if rec.event in (PnpEvent.PORT_ACTIVE, PnpEvent.PORT_ADD) and \
                port.link_state is LinkState.ACTIVE:  # fmt: skip
            with self._lock:
                known = self._ports.get(rec.guid)
                if known is None or not known.alive:
                    try:
                        self._ports[rec.guid] = DmPort(self._answer, self.stats,
                                                       self._ca(rec.ca_guid), port)
                    except IbError as exc:
                        log.warning("no IOC discovery on port 0x%016x: %s", rec.guid, exc)
                        return
                else:
                    known.attr = port
            self._tick()
        elif rec.event in (PnpEvent.PORT_DOWN, PnpEvent.PORT_INIT, PnpEvent.PORT_ARMED,
                           PnpEvent.PORT_REMOVE):  # fmt: skip
            with self._lock:
                gone = self._ports.pop(rec.guid, None)
                if gone is not None:  # at once: its paths, and the units only it reached
                    self._report(self.found.without_port(rec.guid))
            if gone is not None:
                with contextlib.suppress(IbError):
                    gone.destroy()
                self._tick()
        elif rec.event in (PnpEvent.LID_CHANGE, PnpEvent.SM_CHANGE, PnpEvent.GID_CHANGE,
                           PnpEvent.PKEY_CHANGE, PnpEvent.CLIENT_REREGISTER):  # fmt: skip
            with self._lock:
                known = self._ports.get(rec.guid)
                if known is not None:
                    known.attr = port
            self._tick()

    # ------------------------------------------------------------------ sweeps
    def sweep_now(self) -> SweepHandle:
        """Sweep now (or right after the sweep running, if one is): its handle.
        ``InvalidState`` once closed."""
        with self._lock:
            if self._closed:
                raise InvalidState("the discovery client is closed")
            if self._run is not None:
                if self._next is None:
                    self._next = SweepHandle()
                return self._next
            handle = SweepHandle()
            self._begin(handle)
            return handle

    def _begin(self, handle: SweepHandle) -> None:
        """Under the lock: a new run, its SA phase started."""
        if self._periodic is not None:
            self._periodic.cancel()
            self._periodic = None
        ports = {g: p for g, p in self._ports.items() if p.alive}
        search = TargetSearch(ports, self.roce_peers, timeout_ms=int(self.timeout * 1000),
                              retries=self.retries, lock=self._lock, stats=self.stats,
                              done=lambda: self._searched(run))  # fmt: skip
        run = self._run = _Run(handle, search)
        self.stats["sweeps"] += 1
        search.start()

    def _searched(self, run: _Run) -> None:
        """Under the lock: the targets are known; the DM phase starts on the misc queue
        (this may be the MAD receive thread)."""
        run.sweep = Sweep(run.search.targets, self.found, timeout=self.timeout,
                          retries=self.retries, window=self.window, tids=self._tids,
                          trust_change_id=self.trust_change_id)  # fmt: skip
        self.mgr.queues.misc.post(self._drive, run, "start", None)

    # ------------------------------------------------------------------ the DM phase
    def _answer(self, run: object, mad: bytes) -> None:
        if isinstance(run, _Run):
            self._drive(run, "answer", mad)

    def _drive(self, run: _Run, what: str, arg: Any) -> None:
        """Feed one event to the run's sweep and carry out its actions."""
        with self._lock:
            sweep = run.sweep
            if sweep is None or run.over or self._run is not run:
                return
            now = self.al.timers.clock.now()
            if what == "start":
                actions = sweep.start(now)
            elif what == "answer":
                actions = sweep.on_answer(arg, now)
            elif what == "timer":
                actions = sweep.on_timer(now)
            else:
                actions = sweep.on_send_failed(arg, now)
            failed: list[int] = []
            for a in actions:
                if isinstance(a, Transmit):
                    where = a.addr
                    assert isinstance(where, tuple)
                    dm_port, addr = where
                    assert isinstance(dm_port, DmPort) and isinstance(addr, MadAddr)
                    try:
                        dm_port.send(run, addr, a.mad, int(self.timeout * 1000))
                    except IbError:
                        failed.append(a.tid)
                elif isinstance(a, ArmTimer):
                    self._arm(run, a.at)
                elif isinstance(a, Done):
                    self._finish(run, a.found, sweep)
        for tid in failed:  # its own event, after this one's actions
            self.mgr.queues.misc.post(self._drive, run, "send_failed", tid)

    def _arm(self, run: _Run, at: float | None) -> None:
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        if at is not None:
            with contextlib.suppress(IbError):
                run.timer = self.al.timers.call_at(at, self._drive, run, "timer", None)

    def _finish(self, run: _Run, found: Found, sweep: Sweep) -> None:
        """Under the lock: the sweep ended; report the changes, start what waits."""
        run.over = True
        self._run = None
        if run.search.blind:
            found = found.keeping(self.found, run.search.blind)
        for guid in run.search.ports:
            if guid not in self._ports:  # went during the sweep: what it found through it too
                found = found.without_port(guid)
        self.last_stats = sweep.stats
        self.last_targets = tuple(run.search.targets)
        self._report(found)
        run.handle._set(found)
        if self._closed:
            return
        if self._next is not None:
            handle, self._next = self._next, None
            self._begin(handle)
        elif self.interval is not None:
            with contextlib.suppress(IbError):
                self._periodic = self.al.timers.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        with contextlib.suppress(InvalidState):  # closed meanwhile
            self.sweep_now()

    def _registry_view(self) -> Found:
        """What the registry holds of the units this client reported.  The registry is the
        truth: the PnP engine removes from it by itself (the IOC paths of a port leaving
        ACTIVE, what was reached through a CA that goes)."""
        reg = self.mgr.io_devices
        ious = {i.guid: i for i in reg.ious() if i.guid in self._mine}
        iocs = {c.ioc_guid: c for c in reg.iocs() if c.iou_guid in ious}
        paths: dict[int, tuple[IocPath, ...]] = {}
        for guid in list(iocs):
            try:
                paths[guid] = tuple(IocPath(ca, port, p) for ca, port, p in reg.ioc_paths(guid))
            except NotFound:  # removed meanwhile
                del iocs[guid]
        return Found(ious, iocs, paths)

    def _report(self, found: Found) -> None:
        """Under the lock: ``found`` is what should be reported; the registry hears the
        difference from what it holds."""
        changes = diff(self._registry_view(), found)
        self.found = found
        self._mine.update(found.ious)
        reg = self.mgr.io_devices
        for c in changes:
            self.stats[type(c).__name__] += 1
            try:
                if isinstance(c, AddIou):
                    reg.add_iou(c.iou)
                elif isinstance(c, RemoveIou):
                    reg.remove_iou(c.guid)
                elif isinstance(c, AddIoc):
                    reg.add_ioc(c.ioc)
                elif isinstance(c, RemoveIoc):
                    reg.remove_ioc(c.guid)
                elif isinstance(c, AddPath):
                    p = c.path
                    reg.add_ioc_path(c.ioc_guid, p.ca_guid, p.port_guid, p.path)
                elif isinstance(c, RemovePath):
                    reg.remove_ioc_path(c.ioc_guid, c.port_guid, c.dgid)
            except NotFound as exc:  # the engine removed it meanwhile (a port went): go on
                self.stats["registry_raced"] += 1
                log.info("IOC discovery: %r not applied: %s", c, exc)
