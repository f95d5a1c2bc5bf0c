"""IOC discovery, the I/O layer: sweeps the fabric for I/O units and feeds ``mgr.io_devices``.

:class:`Discovery` is one per manager (:meth:`Discovery.start`): an internal
AL instance, a PnP client of the PORT class (``PnpOrder.DM``) that keeps a
DM requester (:class:`DmPort`: a MAD service of class DEV_MGT on the port's
QP1 alias) per active port, and the sweeps.  A sweep:

1. per active InfiniBand port, asks the SA (``ibal.sa.SaPort``) for the
   PortInfoRecords with IsDeviceManagementSupported (a GetTable with the
   CapabilityMask component, attribute modifier bit 31: matched bitwise, as
   OpenSM does), the NodeRecord of each (the I/O unit's GUIDs, IDs and
   description) and a PathRecord to it; per active Ethernet (RoCE) port,
   which has no SA, resolves a path to each configured peer GID
   (:class:`RocePeer`; ``ibal.sa.roce``);
2. runs a :class:`~ibal.dm.sweep.Sweep` over those targets (the DM Gets,
   their retries on the AL's timers);
3. applies the :func:`~ibal.dm.sweep.diff` with the previous sweep to
   ``mgr.io_devices``, which raises IOU / IOC / IOC-path PnP events to every
   ``reg_pnp(PnpClass.IOU / IOC)`` client of the manager.

Sweeps run when a port becomes active or goes, every ``interval`` seconds
(``None``: never by themselves), and on :meth:`Discovery.sweep_now`.  A
sweep asked while one runs follows it.  SA answers arrive on the MAD
receive thread, DM answers and timers on the misc queue; nothing here
blocks on them.  Counters: :attr:`Discovery.stats` (sweeps, SA failures,
registry changes) plus each sweep's own (:attr:`Discovery.last_stats`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ibal.al import AccessLayer, Ca, Dependent, PnpClass, PnpEvent, PnpOrder, PnpRec
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
    Send,
    Sweep,
    Target,
    diff,
)
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc, sa
from ibal.mad.consts import Method, MgmtClass, SaAttr
from ibal.mad.dm import DM_CLASS_VERSION
from ibal.mad.smp import CapabilityMask
from ibal.records import record
from ibal.sa.port import SaPort
from ibal.sa.txn import SaAnswer
from ibal.status import IbError, InvalidParameter, NotFound, Timeout
from ibal.types import (
    Gid,
    GidType,
    Grh,
    IouInfo,
    LinkLayer,
    LinkState,
    MadAddr,
    PortAttr,
    QpType,
    WcStatus,
)
from ibal.wire.fields import FieldError

if TYPE_CHECKING:
    from ibal.al import AlManager, PnpRegistration, Timer

__all__ = ["ENHANCED_COMP_MASK", "Discovery", "DmPort", "RocePeer", "SweepHandle"]

log = logging.getLogger("ibal.dm")

ENHANCED_COMP_MASK = 1 << 31
"""PortInfoRecord attribute modifier bit 31: CapabilityMask components match bitwise."""

_DISCOVERIES: weakref.WeakKeyDictionary[AlManager, Discovery] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_PIR_MASK = sa.component_mask(sa.PORT_INFO_RECORD, ["capability_mask"])
_NR_MASK = sa.component_mask(sa.NODE_RECORD, ["lid"])
_PR_MASK = sa.component_mask(sa.PATH_RECORD, ["sgid", "dgid"])
_RECORD = {SaAttr.PORT_INFO_RECORD: sa.PORT_INFO_RECORD, SaAttr.NODE_RECORD: sa.NODE_RECORD,
           SaAttr.PATH_RECORD: sa.PATH_RECORD}  # fmt: skip


@record(frozen=True)
class RocePeer:
    """A RoCE peer to ask for I/O units (RoCE has no SA to list them).

    ``iou_guid``: the unit's GUID as reported (0: the GID's low 64 bits, the
    only identity the wire gives); ``desc``: its description.
    """

    gid: Gid
    iou_guid: int = 0
    desc: str = ""


def _source_gid(port: PortAttr, dgid: Gid) -> Gid | None:
    """The local GID a path to ``dgid`` starts at: GID 0 on InfiniBand; on RoCE the first
    GID of the same family (IPv4-mapped or not), RoCE v2 first (``None``: let the resolver
    take the route's source)."""
    if port.link_layer is LinkLayer.INFINIBAND:
        return port.gids[0] if port.gids else None
    v4 = dgid.ipv4_mapped is not None
    same = [e for e in port.gid_table if e.is_ipv4 == v4]
    same.sort(key=lambda e: (e.gid_type is not GidType.ROCE_V2, e.index))
    return same[0].gid if same else None


class SweepHandle:
    """A sweep asked for: :meth:`wait` returns what it found."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.found: Found | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Found:
        """Block until the sweep ended (never on an AL callback thread)."""
        if not self._done.wait(timeout):
            raise Timeout(f"the sweep did not end within {timeout} s")
        assert self.found is not None
        return self.found

    def _set(self, found: Found) -> None:
        self.found = found
        self._done.set()


class DmPort(Dependent):
    """The DM requester of one local port: a DEV_MGT MAD service on its QP1 alias."""

    _kind = "DM discovery port"

    def __init__(self, disc: Discovery, ca: Ca, port: PortAttr) -> None:
        self.disc = disc
        self.ca = ca
        self.attr = port
        self.port_guid = port.port_guid
        pd = ca.alloc_pd()
        self._pd = pd
        try:
            alias = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
            svc = MadSvc(MgmtClass.DEV_MGT, DM_CLASS_VERSION, self._on_recv, self._on_sent)
            self.service: MadService = reg_mad_svc(alias, svc)
            super().__init__((ca, port.port_num))
        except BaseException:
            with contextlib.suppress(IbError):
                pd.dealloc()
            raise

    def __repr__(self) -> str:
        return f"<DmPort {self.ca.name} port {self.attr.port_num} 0x{self.port_guid:016x}>"

    def send(self, run: _Run, tid: int, addr: MadAddr, mad: bytes, timeout_ms: int) -> None:
        e = self.service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = addr
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, timeout_ms, 0
        e.context1, e.context2 = run, tid
        try:
            self.service.send(e)
        except IbError:
            put_mad(e)
            raise

    def _on_sent(self, e: MadElement) -> None:
        """Misc queue: a Get ended; with an answer, the answer gives the element back."""
        if e.status is WcStatus.SUCCESS and e.resp_expected:
            return
        put_mad(e)

    def _on_recv(self, e: MadElement) -> None:
        """Misc queue: the answer to one of our Gets (the sweep checks it)."""
        request = e.request
        mad = bytes(e.mad)
        put_mad([e] if request is None else [e, request])
        if request is None:
            self.disc.stats["dropped_unsolicited"] += 1
            return
        run = request.context1
        if isinstance(run, _Run):
            self.disc._answer(run, mad)

    def cleanup(self) -> None:
        with contextlib.suppress(IbError):
            self._pd.dealloc()


class _Run:
    """One sweep: the SA phase (targets), then the DM phase (a :class:`Sweep`)."""

    def __init__(self, handle: SweepHandle) -> None:
        self.handle = handle
        self.pending = 0  # SA requests not answered
        self.targets: list[Target] = []
        self.sweep: Sweep | None = None
        self.ports: dict[int, DmPort] = {}
        self.sa_ports: list[SaPort] = []
        self.timer: Timer | None = None
        self.over = False
        self.blind: set[int] = set()  # local ports whose SA listing failed


class Discovery:
    """The IOC-discovery client of one manager (see the module docstring)."""

    def __init__(self, mgr: AlManager, *, interval: float | None, timeout: float, retries: int,
                 window: int, roce_peers: Sequence[RocePeer]) -> None:  # fmt: skip
        self.mgr = mgr
        self.al: AccessLayer = mgr.open_al()
        self.interval = interval
        self.timeout, self.retries, self.window = timeout, retries, window
        self.roce_peers: tuple[RocePeer, ...] = tuple(roce_peers)
        self.stats: Counter[str] = Counter()
        self.last_stats: Counter[str] = Counter()
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
              roce_peers: Iterable[RocePeer] = ()) -> Discovery:  # fmt: skip
        """The manager's discovery client, started on first call (later calls return it).

        ``interval``: seconds between sweeps (``None``: only on port changes and
        :meth:`sweep_now`); ``timeout``/``retries``/``window``: each DM Get's
        time-out, its further tries, the Gets in flight; ``roce_peers``: the GIDs
        asked from Ethernet ports.  The PnP replay (and so the first sweep's
        start) is delivered before it returns, except from a PnP callback.
        """
        if interval is not None and interval <= 0:
            raise InvalidParameter("interval must be positive (or None)")
        if timeout <= 0 or retries < 0 or window < 1:
            raise InvalidParameter("timeout > 0, retries >= 0 and window >= 1 are required")
        peers = tuple(roce_peers)
        if not all(isinstance(p, RocePeer) for p in peers):
            raise InvalidParameter("roce_peers must be RocePeer records")
        with _LOCK:
            d = _DISCOVERIES.get(mgr)
            if d is not None and not d._closed and not d.al.closed:
                return d
            d = cls(mgr, interval=interval, timeout=timeout, retries=retries, window=window,
                    roce_peers=peers)  # fmt: skip
            _DISCOVERIES[mgr] = d
        sync = not mgr.queues.pnp.is_current()
        flags = PnpClass.FLAG_REG_SYNC if sync else PnpClass(0)
        d._pnp = d.al.reg_pnp(PnpClass.PORT | flags, d._on_pnp, order=PnpOrder.DM)
        return d

    @classmethod
    def of(cls, mgr: AlManager) -> Discovery | None:
        """The manager's running discovery client, if started."""
        with _LOCK:
            d = _DISCOVERIES.get(mgr)
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
            self._end_sa(run)
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
                        self._ports[rec.guid] = DmPort(self, self._ca(rec.ca_guid), port)
                    except IbError as exc:
                        log.warning("no IOC discovery on port 0x%016x: %s", rec.guid, exc)
                        return
                else:
                    known.attr = port
            self.sweep_now()
        elif rec.event in (PnpEvent.PORT_DOWN, PnpEvent.PORT_INIT, PnpEvent.PORT_ARMED,
                           PnpEvent.PORT_REMOVE):  # fmt: skip
            with self._lock:
                gone = self._ports.pop(rec.guid, None)
                if gone is not None:  # at once: its paths, and the units only it reached
                    self._report(self.found.without_port(rec.guid))
            if gone is not None:
                with contextlib.suppress(IbError):
                    gone.destroy()
                self.sweep_now()
        elif rec.event in (PnpEvent.LID_CHANGE, PnpEvent.SM_CHANGE, PnpEvent.GID_CHANGE,
                           PnpEvent.PKEY_CHANGE, PnpEvent.CLIENT_REREGISTER):  # fmt: skip
            with self._lock:
                known = self._ports.get(rec.guid)
                if known is not None:
                    known.attr = port
            self.sweep_now()

    # ------------------------------------------------------------------ sweeps
    def sweep_now(self) -> SweepHandle:
        """Sweep now (or right after the sweep running, if one is): its handle."""
        with self._lock:
            if self._closed:
                raise InvalidParameter("the discovery client is closed")
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
        run = self._run = _Run(handle)
        run.ports = {g: p for g, p in self._ports.items() if p.alive}
        self.stats["sweeps"] += 1
        run.pending += 1  # held while the requests go out
        for dp in run.ports.values():
            try:
                sa_port = SaPort.open(self.al, dp.port_guid)
            except IbError as exc:
                self.stats["sa_unavailable"] += 1
                run.blind.add(dp.port_guid)
                log.info("IOC discovery: no SA port on %r: %s", dp, exc)
                continue
            run.sa_ports.append(sa_port)
            if dp.attr.link_layer is LinkLayer.INFINIBAND:
                pir = sa.PORT_INFO_RECORD.encode(
                    capability_mask=int(CapabilityMask.IS_DEVICE_MANAGEMENT_SUPPORTED))
                self._ask(run, sa_port, SaAttr.PORT_INFO_RECORD, pir, _PIR_MASK,
                          lambda recs, dp=dp, sp=sa_port: self._on_pirs(run, dp, sp, recs),
                          attr_mod=ENHANCED_COMP_MASK)  # fmt: skip
            else:
                for peer in self.roce_peers:
                    self._ask_path(run, dp, sa_port, None, peer.gid.packed, peer)
        self._sa_answered(run)

    def _ask(self, run: _Run, port: SaPort, attr: SaAttr, data: bytes, mask: int,
             then: Any, attr_mod: int = 0) -> None:  # fmt: skip
        """Under the lock: one SA GetTable; ``then(records)`` with the decoded records.  A
        failed listing (PortInfo or NodeRecords) makes the port blind for this sweep: what
        it reached before is kept; a path not found loses that target only."""
        table = _RECORD[attr]

        def done(answer: SaAnswer) -> None:
            with self._lock:
                if run.over:
                    return
                if answer.ok:
                    try:
                        then([table.decode(r[: table.size]) for r in answer.records])
                    except (FieldError, InvalidParameter) as exc:  # a record without sense
                        self.stats["sa_malformed"] += 1
                        run.blind.add(port.port_guid)
                        log.info("IOC discovery: SA %s record dropped: %s", attr.name, exc)
                elif attr == SaAttr.PATH_RECORD:  # no way to that port (now): it goes
                    self.stats["no_path"] += 1
                    log.info("IOC discovery: no path: %s %s", answer.status.name, answer.detail)
                else:
                    self.stats["sa_failed"] += 1
                    run.blind.add(port.port_guid)
                    log.info("IOC discovery: SA %s: %s %s", attr.name, answer.status.name,
                             answer.detail)  # fmt: skip
                self._sa_answered(run)

        run.pending += 1
        try:
            port.request(Method.GET_TABLE, attr, data, mask, attr_mod=attr_mod,
                         timeout_ms=int(self.timeout * 1000), retry_cnt=self.retries,
                         callback=done)  # fmt: skip
        except IbError as exc:
            run.pending -= 1
            self.stats["sa_failed"] += 1
            run.blind.add(port.port_guid)
            log.info("IOC discovery: SA %s not asked: %s", attr.name, exc)

    def _on_pirs(self, run: _Run, dp: DmPort, port: SaPort, recs: list[dict[str, Any]]) -> None:
        for r in recs:
            lid = int(r["endport_lid"])
            data = sa.NODE_RECORD.encode(lid=lid)
            self._ask(run, port, SaAttr.NODE_RECORD, data, _NR_MASK,
                      lambda nrs: self._on_nodes(run, dp, port, nrs))

    def _on_nodes(self, run: _Run, dp: DmPort, port: SaPort, recs: list[dict[str, Any]]) -> None:
        for n in recs:
            desc = bytes(n["node_string"]).split(b"\0", 1)[0].decode("utf-8", "replace")
            while len(desc.encode()) > 64:
                desc = desc[:-1]
            iou = IouInfo(guid=int(n["node_guid"]), ca_guid=dp.ca.guid,
                          chassis_guid=int(n["system_image_guid"]), vend_id=int(n["vendor_id"]),
                          dev_id=int(n["device_id"]), revision=int(n["revision"]), desc=desc)
            prefix = dp.attr.gids[0].packed[:8] if dp.attr.gids else bytes(8)
            dgid = prefix + int(n["port_guid"]).to_bytes(8, "big")
            self._ask_path(run, dp, port, iou, dgid, None)

    def _ask_path(self, run: _Run, dp: DmPort, port: SaPort, iou: IouInfo | None, dgid: bytes,
                  peer: RocePeer | None) -> None:  # fmt: skip
        values: dict[str, Any] = {"dgid": dgid}
        mask = sa.component_mask(sa.PATH_RECORD, ["dgid"])
        sgid = _source_gid(dp.attr, Gid(dgid))
        if sgid is not None:
            values["sgid"] = sgid.packed
            mask = _PR_MASK
        data = sa.PATH_RECORD.encode(values)
        self._ask(run, port, SaAttr.PATH_RECORD, data, mask,
                  lambda prs: self._on_paths(run, dp, iou, peer, prs))  # fmt: skip

    def _on_paths(self, run: _Run, dp: DmPort, iou: IouInfo | None, peer: RocePeer | None,
                  recs: list[dict[str, Any]]) -> None:  # fmt: skip
        if not recs:
            self.stats["no_path"] += 1
            return
        p = recs[0]
        raw = sa.PATH_RECORD.encode(p)
        dgid = Gid(raw[8:24])
        if iou is None:  # a RoCE peer
            assert peer is not None
            guid = peer.iou_guid or int.from_bytes(dgid.packed[8:], "big")
            iou = IouInfo(guid=guid, ca_guid=dp.ca.guid, desc=peer.desc)
        addr = self._addr(dp, p, dgid)
        run.targets.append(Target(iou, dp.ca.guid, dp.port_guid, (dp, addr), raw))

    @staticmethod
    def _addr(dp: DmPort, p: dict[str, Any], dgid: Gid) -> MadAddr:
        """Where a DM Get along PathRecord ``p`` goes (QP1; a GRH on RoCE)."""
        grh = None
        if dp.attr.link_layer is not LinkLayer.INFINIBAND:
            sgid = Gid(sa.PATH_RECORD.encode(p)[24:40])
            index = next((e.index for e in dp.attr.gid_table if e.gid == sgid), 0)
            grh = Grh(dgid=dgid, sgid_index=index, hop_limit=int(p["hop_limit"]) or 64,
                      traffic_class=int(p["tclass"]))  # fmt: skip
        return MadAddr(dlid=int(p["dlid"]), sl=int(p["sl"]), grh=grh)

    def _sa_answered(self, run: _Run) -> None:
        """Under the lock: one SA request ended; the last one starts the DM phase."""
        run.pending -= 1
        if run.pending or run.sweep is not None or run.over:
            return
        self._end_sa(run)
        # Answers come in any order: the targets in the ports' order, so the IOU's CA and
        # its paths' order do not change from one sweep to the next by chance.
        rank = {g: i for i, g in enumerate(run.ports)}
        run.targets.sort(key=lambda t: (rank.get(t.port_guid, len(rank)), t.path))
        run.sweep = Sweep(run.targets, self.found, timeout=self.timeout, retries=self.retries,
                          window=self.window, tids=self._tids)  # fmt: skip
        # The DM phase starts on the misc queue (this may be the MAD receive thread).
        self.mgr.queues.misc.post(self._drive, run, "start", None)

    def _end_sa(self, run: _Run) -> None:
        ports, run.sa_ports = run.sa_ports, []
        for p in ports:
            with contextlib.suppress(IbError):
                p.close()

    # ------------------------------------------------------------------ the DM phase
    def _answer(self, run: _Run, mad: bytes) -> None:
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
                if isinstance(a, Send):
                    where = a.addr
                    assert isinstance(where, tuple)
                    dm_port, addr = where
                    assert isinstance(dm_port, DmPort) and isinstance(addr, MadAddr)
                    try:
                        dm_port.send(run, a.tid, addr, a.mad, int(self.timeout * 1000))
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
        if run.blind:
            found = found.keeping(self.found, run.blind)
        for guid in run.ports:
            if guid not in self._ports:  # went during the sweep: what it found through it too
                found = found.without_port(guid)
        self.last_stats = sweep.stats
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
        with contextlib.suppress(InvalidParameter):
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
