"""IOC discovery, sans I/O: one sweep of the I/O units some ports reach, and its diff.

A :class:`Sweep` is given the :class:`Target` list (one per way to reach a
remote port that advertises device management: the local port, where DM
MADs go, the PathRecord, the :class:`~ibal.types.IouInfo` its NodeRecord
gave) and asks every I/O unit, through its first target, with DM Gets
(IBA vol. 1 16.3): IOUnitInfo, then IOControllerProfile per slot the unit
lists PRESENT, then ServiceEntries in fours.  It is a pure machine: events
in (:meth:`Sweep.start`, :meth:`Sweep.on_answer`, :meth:`Sweep.on_timer`,
:meth:`Sweep.on_send_failed`, each with the clock's time), actions out
(:class:`Transmit`, :class:`ArmTimer`, :class:`Done`).

Rules:

* Each request goes out at most ``1 + retries`` times, ``timeout`` seconds
  apart, each try with a new TID (a late answer to a try given up is stale,
  counted and dropped); at most ``window`` requests are in flight.
* An answer is matched by the low 32 bits of its TID (the transport owns the
  high half), then checked: a DM GetResp of the attribute and modifier asked,
  decodable by the :mod:`ibal.wire.mad.dm` tables.  One that fails is malformed:
  counted in :attr:`Sweep.stats`, dropped, and the request keeps waiting.
* An answer with a non-zero status ends its request as failed (no retry).
* An I/O unit whose IOUnitInfo fails on every one of its targets is
  unreachable and absent from the result (it is removed).  A controller whose
  profile or service entries failed keeps what the previous sweep knew of
  that slot (``carried_over``), or stays unreported: only complete
  controllers are reported.
* A unit whose IOUnitInfo shows the ChangeID and slots of a complete read in
  the previous sweep is not asked further: ChangeID moves with every change of
  its controllers, profiles or service entries (IBA 16.3.3.3); its controllers
  are taken from that sweep (``unchanged_units``; ``trust_change_id=False``
  asks everything every time).

:func:`diff` turns two results into the registry changes (:class:`AddIou`
... :class:`RemovePath`) that ``mgr.io_devices`` raises as PnP events.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from ibal import sansio
from ibal.records import record
from ibal.status import InvalidParameter
from ibal.types import IOC_ID_STRING_SIZE, SVC_NAME_SIZE, IocInfo, IocProfile, IouInfo, SvcEntry
from ibal.wire.fields import FieldError, Value
from ibal.wire.mad import dm
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import Method

__all__ = [
    "AddIoc",
    "AddIou",
    "AddPath",
    "ArmTimer",
    "Change",
    "Done",
    "Found",
    "IocPath",
    "RemoveIoc",
    "RemoveIou",
    "RemovePath",
    "Sweep",
    "Target",
    "Transmit",
    "diff",
    "profile_of",
]

PATH_DGID = slice(8, 24)  # PathRecord.DGID (IBA 15.2.5.16)


# ---------------------------------------------------------------------- in and out
@record(frozen=True)
class Target:
    """One way to an I/O unit: from local port ``port_guid`` of CA ``ca_guid``."""

    iou: IouInfo
    """The unit as its NodeRecord describes it (``ca_guid``: the local CA)."""
    ca_guid: int
    port_guid: int
    addr: Hashable
    """Where the DM Gets go (the I/O layer's address, opaque here)."""
    path: bytes
    """The 64-byte PathRecord from the local port to the unit's port."""


@record(frozen=True)
class IocPath:
    """A path to a controller: the local CA and port, the PathRecord."""

    ca_guid: int
    port_guid: int
    path: bytes

    @property
    def dgid(self) -> bytes:
        return self.path[PATH_DGID]


@record(frozen=True)
class Transmit(sansio.Transmit):
    """Send ``mad`` (a DM Get, TID low half ``tid``) to ``addr``."""

    tid: int
    addr: Hashable
    mad: bytes


@record(frozen=True)
class ArmTimer(sansio.ArmTimer):
    """Call :meth:`Sweep.on_timer` at ``at`` (``None``: no timer needed)."""

    at: float | None


@dataclass(frozen=True)
class Found:
    """What a sweep found: units, complete controllers, paths per controller."""

    ious: Mapping[int, IouInfo] = field(default_factory=dict)
    iocs: Mapping[int, IocInfo] = field(default_factory=dict)
    paths: Mapping[int, tuple[IocPath, ...]] = field(default_factory=dict)
    ways: Mapping[int, frozenset[int]] = field(default_factory=dict)
    """Per unit: the local port GUIDs it was reached from."""
    change_ids: Mapping[int, int] = field(default_factory=dict)
    """Per unit read completely: IOUnitInfo's ChangeID then."""

    def without_port(self, port_guid: int) -> Found:
        """What remains once local port ``port_guid`` is gone: its paths go, and the units
        reached only through it (with their controllers)."""
        ways = {g: w - {port_guid} for g, w in self.ways.items()}
        ious = {g: i for g, i in self.ious.items() if ways.get(g)}
        iocs = {g: i for g, i in self.iocs.items() if i.iou_guid in ious}
        paths = {g: tuple(p for p in self.paths.get(g, ()) if p.port_guid != port_guid)
                 for g in iocs}  # fmt: skip
        return Found(ious, iocs, paths, {g: ways[g] for g in ious},
                     {g: c for g, c in self.change_ids.items() if g in ious})

    def keeping(self, old: Found, ports: AbstractSet[int]) -> Found:
        """This result plus the units of ``old`` it lacks that were reached through
        ``ports`` (ports whose listing failed this time: not seen is not gone)."""
        ious, iocs = dict(self.ious), dict(self.iocs)
        paths, ways, ids = dict(self.paths), dict(self.ways), dict(self.change_ids)
        for guid, iou in old.ious.items():
            if guid in ious or not old.ways.get(guid, frozenset()) & ports:
                continue
            ious[guid], ways[guid] = iou, old.ways[guid]
            if guid in old.change_ids:
                ids[guid] = old.change_ids[guid]
            for ioc_guid, ioc in old.iocs.items():
                if ioc.iou_guid == guid and ioc_guid not in iocs:
                    iocs[ioc_guid], paths[ioc_guid] = ioc, old.paths.get(ioc_guid, ())
        return Found(ious, iocs, paths, ways, ids)


@record(frozen=True)
class Done:
    """The sweep ended: ``found`` is its result."""

    found: Found


Action = Transmit | ArmTimer | Done


@record(frozen=True)
class AddIou:
    iou: IouInfo


@record(frozen=True)
class RemoveIou:
    guid: int


@record(frozen=True)
class AddIoc:
    ioc: IocInfo


@record(frozen=True)
class RemoveIoc:
    guid: int


@record(frozen=True)
class AddPath:
    ioc_guid: int
    path: IocPath


@record(frozen=True)
class RemovePath:
    ioc_guid: int
    port_guid: int
    dgid: bytes


Change = AddIou | RemoveIou | AddIoc | RemoveIoc | AddPath | RemovePath


# ---------------------------------------------------------------------- decoding
def _text(raw: Value, size: int) -> str:
    """A NUL-padded wire string as ``str`` (undecodable bytes replaced), at most ``size`` bytes."""
    assert isinstance(raw, bytes)
    text = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    while len(text.encode()) > size:
        text = text[:-1]
    return text


def profile_of(values: Mapping[str, Value]) -> IocProfile:
    """An :class:`IocProfile` from decoded IOControllerProfile values."""

    def n(name: str) -> int:
        v = values[name]
        assert isinstance(v, int)
        return v

    return IocProfile(
        ioc_guid=n("guid"), vend_id=n("vendor_id"), dev_id=n("device_id"),
        dev_version=n("device_version"), subsys_vend_id=n("subsystem_vendor_id"),
        subsys_id=n("subsystem_id"), io_class=n("io_class"), io_subclass=n("io_subclass"),
        protocol=n("protocol"), protocol_ver=n("protocol_version"),
        send_msg_depth=n("send_message_depth"), rdma_read_depth=n("rdma_read_depth"),
        send_msg_size=n("send_message_size"), rdma_size=n("rdma_transfer_size"),
        ctrl_ops_cap=n("controller_operations_mask"), num_svc_entries=n("service_entries"),
        id_string=_text(values["id_string"], IOC_ID_STRING_SIZE),
    )  # fmt: skip


# ---------------------------------------------------------------------- the machine
class _Unit:
    """One I/O unit being asked."""

    def __init__(self, guid: int, targets: list[Target]) -> None:
        self.guid = guid
        self.targets = targets
        self.at = 0  # the target in use
        self.reached = False  # IOUnitInfo answered
        self.unreachable = False
        self.profiles: dict[int, IocProfile] = {}  # slot -> profile
        self.entries: dict[int, list[SvcEntry | None]] = {}
        self.failed: set[int] = set()  # slots whose answers are incomplete
        self.change_id: int | None = None
        self.reused: list[IocInfo] = []  # unchanged since the previous sweep: not asked again

    @property
    def target(self) -> Target:
        return self.targets[self.at]


class _Req:
    __slots__ = ("attr", "due", "mod", "tid", "tries", "unit")

    def __init__(self, unit: _Unit, attr: dm.DmAttr, mod: int) -> None:
        self.unit, self.attr, self.mod = unit, attr, mod
        self.tries = 0
        self.tid = 0
        self.due = 0.0


class Sweep:
    """One discovery sweep (see the module docstring)."""

    def __init__(
        self,
        targets: Sequence[Target],
        previous: Found | None = None,
        *,
        timeout: float = 1.0,
        retries: int = 3,
        window: int = 16,
        tids: Iterator[int] | None = None,
        trust_change_id: bool = True,
    ) -> None:
        if timeout <= 0 or retries < 0 or window < 1:
            raise InvalidParameter("timeout > 0, retries >= 0 and window >= 1 are required")
        self.timeout, self.retries, self.window = float(timeout), retries, window
        self.trust_change_id = trust_change_id
        self.previous = previous or Found()
        self.stats: Counter[str] = Counter()
        self._tids = tids if tids is not None else itertools.count(1)
        by_guid: dict[int, list[Target]] = {}
        for t in targets:
            by_guid.setdefault(t.iou.guid, []).append(t)
        self._units = [_Unit(g, ts) for g, ts in by_guid.items()]
        self._waiting: deque[_Req] = deque()
        self._flight: dict[int, _Req] = {}  # TID low half -> request
        self._started = False
        self.done = False
        self.found: Found | None = None

    def __repr__(self) -> str:
        state = "done" if self.done else f"{len(self._flight)} in flight"
        return f"<Sweep {len(self._units)} units, {state}>"

    # ------------------------------------------------------------------ events
    def start(self, now: float) -> list[Action]:
        """Ask every unit's IOUnitInfo."""
        if self._started:
            raise InvalidParameter("a sweep starts once")
        self._started = True
        for u in self._units:
            self._ask(u, dm.DmAttr.IO_UNIT_INFO, 0)
        return self._pump(now)

    def on_answer(self, mad: bytes | bytearray | memoryview, now: float) -> list[Action]:
        """A DM MAD arrived for this sweep (a response, by the I/O layer's routing)."""
        if self.done:
            self.stats["stale"] += 1
            return []
        try:
            h = H.header_of(mad, dm.DM_CLASS, "DM")
        except FieldError:
            self.stats["malformed"] += 1
            return []
        req = self._flight.get(h.tid & 0xFFFFFFFF)
        if req is None:
            self.stats["stale"] += 1
            return []
        if (h.method != Method.GET_RESP or h.class_version != dm.DM_CLASS_VERSION
                or h.attr_id != req.attr or h.attr_mod != req.mod):  # fmt: skip
            self.stats["malformed"] += 1
            return []
        if h.status:
            self.stats["error_status"] += 1
            del self._flight[req.tid]
            self._failed(req)
            return self._pump(now)
        try:
            values = dm.TABLES[req.attr].decode(mad, dm.DATA_OFFSET)
            ok = self._answered(req, values)
        except (FieldError, InvalidParameter, KeyError, AssertionError):
            ok = False
        if not ok:
            self.stats["malformed"] += 1
            return []
        self.stats["answers"] += 1
        del self._flight[req.tid]
        return self._pump(now)

    def on_timer(self, now: float) -> list[Action]:
        """The timer armed came: tries that ran out are sent again or given up."""
        again: list[_Req] = []
        for req in [r for r in self._flight.values() if r.due <= now]:
            del self._flight[req.tid]
            if self._try_over(req):
                again.append(req)
        self._waiting.extendleft(reversed(again))  # their turn was taken: first in line again
        return self._pump(now)

    def on_send_failed(self, tid: int, now: float) -> list[Action]:
        """The I/O layer could not send try ``tid``: it counts as a try without answer."""
        req = self._flight.pop(tid & 0xFFFFFFFF, None)
        if req is None:
            return []
        self.stats["send_failed"] += 1
        if self._try_over(req):
            self._waiting.appendleft(req)
        return self._pump(now)

    # ------------------------------------------------------------------ requests
    def _ask(self, unit: _Unit, attr: dm.DmAttr, mod: int) -> None:
        self._waiting.append(_Req(unit, attr, mod))

    def _try_over(self, req: _Req) -> bool:
        """A try went unanswered: ``True`` if the request goes again (else it failed)."""
        if req.tries <= self.retries:
            self.stats["retries"] += 1
            return True
        self.stats["timeouts"] += 1
        self._failed(req)
        return False

    def _pump(self, now: float) -> list[Action]:
        out: list[Action] = []
        while self._waiting and len(self._flight) < self.window:
            req = self._waiting.popleft()
            req.tries += 1
            req.tid = self._new_tid()
            req.due = now + self.timeout
            self._flight[req.tid] = req
            self.stats["sent"] += 1
            mad = dm.dm_mad(req.attr, req.tid, modifier=req.mod)
            out.append(Transmit(req.tid, req.unit.target.addr, mad))
        if not self._flight and not self._waiting and not self.done:
            self.done = True
            self.found = self._result()
            out.append(ArmTimer(None))
            out.append(Done(self.found))
            return out
        due = min((r.due for r in self._flight.values()), default=None)
        out.append(ArmTimer(due))
        return out

    def _new_tid(self) -> int:
        while True:
            tid = next(self._tids) & 0xFFFFFFFF
            if tid and tid not in self._flight:
                return tid

    # ------------------------------------------------------------------ answers
    def _answered(self, req: _Req, values: dict[str, Value]) -> bool:
        """Take a decoded answer; ``False``: it makes no sense (malformed)."""
        unit = req.unit
        if req.attr is dm.DmAttr.IO_UNIT_INFO:
            raw, count, change = (values["controller_list"], values["max_controllers"],
                                  values["change_id"])  # fmt: skip
            assert isinstance(raw, bytes) and isinstance(count, int) and isinstance(change, int)
            unit.reached = True
            unit.change_id = change
            present = [slot for slot, state in enumerate(dm.controller_slots(raw, count), 1)
                       if state == dm.SlotState.PRESENT]  # fmt: skip
            if self._unchanged(unit, present):
                return True
            for slot in present:
                self._ask(unit, dm.DmAttr.IO_CONTROLLER_PROFILE, slot)
            return True
        if req.attr is dm.DmAttr.IO_CONTROLLER_PROFILE:
            profile = profile_of(values)
            if not profile.ioc_guid:
                return False
            slot = req.mod
            unit.profiles[slot] = profile
            n = profile.num_svc_entries
            unit.entries[slot] = [None] * n
            for first in range(0, n, dm.ENTRIES_PER_MAD):
                last = min(first + dm.ENTRIES_PER_MAD, n) - 1
                self._ask(unit, dm.DmAttr.SERVICE_ENTRIES,
                          dm.service_entries_modifier(slot, first, last))  # fmt: skip
            return True
        slot, first, last = dm.parse_service_entries_modifier(req.mod)
        got = dm.service_entries(values, last - first + 1)
        entries = unit.entries.get(slot)
        if entries is None or last >= len(entries):
            return False
        for i, (name, sid) in enumerate(got, first):
            entries[i] = SvcEntry(_text(name, SVC_NAME_SIZE), sid)
        return True

    def _unchanged(self, unit: _Unit, present: list[int]) -> bool:
        """IOUnitInfo's ChangeID moves with every change of the unit's controller list,
        profiles or service entries (IBA 16.3.3.3): the same ID and slots as a complete read
        before, and the unit's controllers are taken from it."""
        old = self.previous
        if not self.trust_change_id or old.change_ids.get(unit.guid) != unit.change_id:
            return False
        before, now = old.ious.get(unit.guid), unit.targets[0].iou
        if before is None or (before.chassis_guid, before.slot) != (now.chassis_guid, now.slot):
            return False
        kept = sorted((i for i in old.iocs.values() if i.iou_guid == unit.guid),
                      key=lambda i: i.slot)  # fmt: skip
        if [i.slot for i in kept] != present:
            return False
        unit.reused = kept
        self.stats["unchanged_units"] += 1
        return True

    def _failed(self, req: _Req) -> None:
        unit = req.unit
        if req.attr is dm.DmAttr.IO_UNIT_INFO:
            if unit.at + 1 < len(unit.targets):  # another way to the unit: ask there
                unit.at += 1
                self._ask(unit, dm.DmAttr.IO_UNIT_INFO, 0)
                return
            unit.unreachable = True
            self.stats["iou_unreachable"] += 1
        elif req.attr is dm.DmAttr.IO_CONTROLLER_PROFILE:
            unit.failed.add(req.mod)
        else:
            unit.failed.add(req.mod >> 16)

    # ------------------------------------------------------------------ result
    def _result(self) -> Found:
        ious: dict[int, IouInfo] = {}
        iocs: dict[int, IocInfo] = {}
        paths: dict[int, tuple[IocPath, ...]] = {}
        reached: dict[int, frozenset[int]] = {}
        ids: dict[int, int] = {}
        old = self.previous
        for unit in self._units:
            if unit.unreachable or not unit.reached:
                continue
            iou = unit.targets[0].iou
            ious[unit.guid] = iou
            reached[unit.guid] = frozenset(t.port_guid for t in unit.targets)
            ways: dict[tuple[int, bytes], IocPath] = {}
            for t in unit.targets:
                p = IocPath(t.ca_guid, t.port_guid, t.path)
                ways.setdefault((p.port_guid, p.dgid), p)
            found: list[IocInfo] = list(unit.reused)
            if unit.change_id is not None and not unit.failed:
                ids[unit.guid] = unit.change_id
            for slot, profile in sorted(unit.profiles.items()):
                entries = unit.entries[slot]
                if slot in unit.failed or any(e is None for e in entries):
                    continue
                found.append(IocInfo(
                    profile=profile, iou_guid=unit.guid, chassis_guid=iou.chassis_guid,
                    chassis_slot=iou.slot, slot=slot,
                    svc_entries=tuple(e for e in entries if e is not None),
                ))  # fmt: skip
            for slot in sorted(unit.failed):
                kept = [i for i in old.iocs.values() if i.iou_guid == unit.guid and i.slot == slot]
                self.stats["carried_over"] += len(kept)
                found.extend(kept)
            for ioc in found:
                if ioc.ioc_guid in iocs:
                    self.stats["duplicate_ioc"] += 1
                    continue
                iocs[ioc.ioc_guid] = ioc
                paths[ioc.ioc_guid] = tuple(ways.values())
        return Found(ious, iocs, paths, reached, ids)


# ---------------------------------------------------------------------- the diff
def diff(old: Found, new: Found) -> list[Change]:
    """The registry changes from ``old`` to ``new``: removes first (units, controllers,
    paths), then adds (units, controllers, paths), each in the results' order.

    A unit's removal takes its controllers and their paths along, and a
    controller's its paths (the registry does that); a changed controller is
    added again (the registry reports it removed and added).
    """
    out: list[Change] = []
    gone_units = [g for g in old.ious if g not in new.ious]
    out += [RemoveIou(g) for g in gone_units]
    for guid, ioc in old.iocs.items():
        if ioc.iou_guid in gone_units:
            continue
        if guid not in new.iocs:
            out.append(RemoveIoc(guid))
            continue
        keep = {(p.port_guid, p.dgid) for p in new.paths.get(guid, ())}
        out += [RemovePath(guid, p.port_guid, p.dgid) for p in old.paths.get(guid, ())
                if (p.port_guid, p.dgid) not in keep]  # fmt: skip
    out += [AddIou(iou) for g, iou in new.ious.items() if old.ious.get(g) != iou]
    for guid, ioc in new.iocs.items():
        before = old.iocs.get(guid)
        if before is None or before != ioc:
            out.append(AddIoc(ioc))
        had = {} if before is None or before.iou_guid in gone_units else {
            (p.port_guid, p.dgid): p for p in old.paths.get(guid, ())}  # fmt: skip
        out += [AddPath(guid, p) for p in new.paths.get(guid, ())
                if had.get((p.port_guid, p.dgid)) != p]  # fmt: skip
    return out
