"""InformInfo subscriptions as a sans-IO machine, and the records they carry.

:class:`InformInfo` is the subscription's filter (the SA's InformInfo
attribute, IBA 13.4.8.3 / 15.2.5.12) and :class:`Notice` a decoded Notice
(13.4.8.2) with the DataDetails of the generic traps the SA forwards most.
:class:`InformMachine` never sends, sleeps or reads a clock: its methods take
events (``subscribe()``, ``answer(tag, ...)``, ``report(notice)``,
``reregister()``, ``retry_due()``, ``unsubscribe()``) and return actions
(:class:`TransmitSet`, :class:`CancelRequest`, :class:`SubDone`, :class:`Deliver`,
:class:`ArmTimer`, :class:`Finish`) for :mod:`ibal.sa.inform` to carry out.

Ordering rules it keeps (ib_al.h ``ib_subscribe``/``ib_unsubscribe``):
``SubDone`` comes before any ``Deliver`` (a Report that arrives while the
Set is unanswered waits for the outcome, and is dropped when it failed); no
``Deliver`` once ``unsubscribe()`` was called; ``Finished`` comes last.
One Set is in flight at a time; a renewal asked for meanwhile follows it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ibal import sansio
from ibal.sa.backoff import Backoff
from ibal.status import Status
from ibal.wire.fields import Buffer, FieldError
from ibal.wire.mad.sa import (
    INFORM_INFO,
    NOTICE,
    TRAP_64_65_DETAILS,
    TRAP_128_DETAILS,
    TRAP_144_DETAILS,
)

__all__ = [
    "ALL_LIDS",
    "ALL_PRODUCERS",
    "ALL_TRAPS",
    "ALL_TYPES",
    "Action",
    "ArmTimer",
    "CancelRequest",
    "Deliver",
    "Finish",
    "InformInfo",
    "InformMachine",
    "Notice",
    "SubDone",
    "SubPhase",
    "TransmitSet",
]

ALL_TRAPS = 0xFFFF
"""TrapNumber (or DeviceID) wildcard."""
ALL_TYPES = 0xFFFF
"""Type wildcard (urgent, security, SM, informational, empty)."""
ALL_PRODUCERS = 0xFFFFFF
"""ProducerType (or VendorID) wildcard."""
ALL_LIDS = 0xFFFF
"""LIDRangeBegin meaning "from every port"."""
RESP_TIME_VALUE = 18
"""InformInfo RespTimeValue: 4.096 us * 2**18, ~1 s, how long the SA may wait for ReportResp."""
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
"""Back-off (seconds) of a renewal the SA did not accept: doubled up to the maximum."""


def _u(d: dict[str, Any], name: str) -> int:
    v = d[name]
    assert isinstance(v, int)
    return v


def _b(d: dict[str, Any], name: str) -> bytes:
    return bytes(d[name])


_DETAILS = {64: TRAP_64_65_DETAILS, 65: TRAP_64_65_DETAILS, 128: TRAP_128_DETAILS,
            144: TRAP_144_DETAILS}  # fmt: skip


@dataclass(frozen=True, slots=True)
class InformInfo:
    """``ib_inform_info_t``: what to be told about.

    Generic traps (``is_generic``): ``trap_number``, ``trap_type`` and
    ``producer_type`` (each a wildcard by default); vendor notices:
    ``trap_number`` is the DeviceID and ``producer_type`` the VendorID.  A
    non-zero ``gid`` (16 bytes) selects notices issued by that port, else
    ``lid_range_begin``..``lid_range_end`` the issuers' LIDs (begin
    :data:`ALL_LIDS`: every port; end 0: begin alone), as the SA filters them.
    """

    trap_number: int = ALL_TRAPS
    trap_type: int = ALL_TYPES
    producer_type: int = ALL_PRODUCERS
    is_generic: bool = True
    gid: bytes = bytes(16)
    lid_range_begin: int = ALL_LIDS
    lid_range_end: int = 0
    qpn: int = 1
    resp_time_value: int = RESP_TIME_VALUE

    def __post_init__(self) -> None:
        if len(self.gid) != 16:
            raise FieldError("range", "InformInfo: the GID is 16 bytes", "gid")
        self.encode(True)  # range checks, by the table

    def encode(self, subscribe: bool) -> bytes:
        """The InformInfo attribute with Subscribe 1 or 0."""
        return INFORM_INFO.encode(
            gid=self.gid, lid_range_begin=self.lid_range_begin, lid_range_end=self.lid_range_end,
            is_generic=int(self.is_generic), subscribe=int(subscribe), type=self.trap_type,
            trap_number=self.trap_number, qpn=self.qpn, resp_time_value=self.resp_time_value,
            producer_type=self.producer_type,
        )  # fmt: skip

    @classmethod
    def decode(cls, data: Buffer) -> InformInfo:
        d: dict[str, Any] = INFORM_INFO.decode(data)
        return cls(
            trap_number=_u(d, "trap_number"), trap_type=_u(d, "type"),
            producer_type=_u(d, "producer_type"), is_generic=bool(d["is_generic"]),
            gid=_b(d, "gid"), lid_range_begin=_u(d, "lid_range_begin"),
            lid_range_end=_u(d, "lid_range_end"), qpn=_u(d, "qpn"),
            resp_time_value=_u(d, "resp_time_value"),
        )  # fmt: skip

    def matches(self, notice: Notice) -> bool:
        """Whether the SA would forward ``notice`` for this subscription."""
        if notice.is_generic != self.is_generic:
            return False
        if self.is_generic and self.trap_type not in (ALL_TYPES, notice.type):
            return False
        if self.trap_number not in (ALL_TRAPS, notice.trap_number):
            return False
        if self.producer_type not in (ALL_PRODUCERS, notice.producer_type):
            return False
        if any(self.gid):
            return self.gid == notice.issuer_gid
        if self.lid_range_begin == ALL_LIDS:
            return True
        end = self.lid_range_end or self.lid_range_begin
        return self.lid_range_begin <= notice.issuer_lid <= end


@dataclass(frozen=True, slots=True)
class Notice:
    """``ib_mad_notice_attr_t``, decoded: the Notice an SA Report carries.

    ``details`` holds the DataDetails fields of traps 64/65 (``gid``: the port
    GID in / out of service), 128 (``lid``: the switch whose link state
    changed) and 144 (``lid``, ``capability_mask``...), ``{}`` for others
    (``data_details`` always has the 54 raw bytes).
    """

    is_generic: bool
    type: int
    producer_type: int
    trap_number: int
    issuer_lid: int
    notice_toggle: int
    notice_count: int
    issuer_gid: bytes
    data_details: bytes
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def device_id(self) -> int:
        """A vendor notice's DeviceID (the TrapNumber field)."""
        return self.trap_number

    @property
    def vendor_id(self) -> int:
        """A vendor notice's VendorID (the ProducerType field)."""
        return self.producer_type

    @classmethod
    def decode(cls, data: Buffer) -> Notice:
        """``FieldError('short')`` for fewer than 80 bytes; reserved bits are not checked
        (OpenSM leaves bytes of its stack in the DataDetails' reserved parts)."""
        d: dict[str, Any] = NOTICE.decode(bytes(data[: NOTICE.size]))
        generic = bool(d["is_generic"])
        details: dict[str, Any] = {}
        table = _DETAILS.get(_u(d, "trap_number")) if generic else None
        if table is not None:
            details = {k: v for k, v in table.decode(_b(d, "data_details")).items()
                       if not k.startswith("resv_")}  # fmt: skip
        return cls(
            is_generic=generic, type=_u(d, "type"), producer_type=_u(d, "producer_type"),
            trap_number=_u(d, "trap_number"), issuer_lid=_u(d, "issuer_lid"),
            notice_toggle=_u(d, "notice_toggle"), notice_count=_u(d, "notice_count"),
            issuer_gid=_b(d, "issuer_gid"), data_details=_b(d, "data_details"),
            details=details,
        )  # fmt: skip


class SubPhase(enum.Enum):
    NEW = "new"
    SUBSCRIBING = "subscribing"  # the first Set is unanswered
    ACTIVE = "active"  # the SA took it; reports are delivered
    FAILED = "failed"  # the first Set failed: nothing more happens
    UNSUBSCRIBING = "unsubscribing"  # the Set with Subscribe 0 is out
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class TransmitSet(sansio.Transmit):
    """SubnAdmSet(InformInfo) with this record; ``answer(tag, ...)`` follows."""

    tag: int
    subscribe: bool
    record: bytes


@dataclass(frozen=True, slots=True)
class CancelRequest(sansio.CancelRequest):
    """Give up the request of ``tag`` (its answer, if any, is ignored)."""

    tag: int


@dataclass(frozen=True, slots=True)
class SubDone:
    """The subscription's outcome (``pfn_sub_cb``): once, before any report."""

    status: Status
    mad_status: int = 0


@dataclass(frozen=True, slots=True)
class Deliver(sansio.Deliver):
    """A matching Report for the report callback."""

    notice: Notice


@dataclass(frozen=True, slots=True)
class ArmTimer(sansio.ArmTimer):
    """Call ``retry_due()`` after ``delay`` seconds (a renewal the SA did not take)."""

    delay: float


@dataclass(frozen=True, slots=True)
class Finish(sansio.Finish):
    """Nothing more will happen; ``status`` is the unsubscribe Set's outcome
    (``SUCCESS`` when none was needed)."""

    status: Status


Action = TransmitSet | CancelRequest | SubDone | Deliver | ArmTimer | Finish


class InformMachine:
    """One subscription's protocol (see the module docstring)."""

    def __init__(self, info: InformInfo) -> None:
        self.info = info
        self.phase = SubPhase.NEW
        self.renewals = 0
        """Renewals the SA accepted (after client reregister, SM or LID changes)."""
        self.last_renew_status: Status | None = None
        self.dropped_reports = 0
        """Reports that matched but came after an unsubscribe or a failed subscribe."""
        self._tag = 0
        self._inflight: int | None = None
        self._inflight_sub = True
        self._renew_due = False
        self._backoff = Backoff(RETRY_FIRST, RETRY_MAX)
        self._retry_armed = False
        self._held: list[Notice] = []
        self._was_active = False

    # ------------------------------------------------------------------ events
    def subscribe(self) -> list[Action]:
        if self.phase is not SubPhase.NEW:
            return []
        self.phase = SubPhase.SUBSCRIBING
        return [self._send(True)]

    def answer(
        self, tag: int, status: Status, mad_status: int = 0, records: tuple[bytes, ...] = ()
    ) -> list[Action]:
        """The outcome of the Set of ``tag`` (stale tags are ignored)."""
        if tag != self._inflight:
            return []
        self._inflight = None
        ok = status is Status.SUCCESS and self._confirmed(records)
        if ok is False and status is Status.SUCCESS:
            status = Status.ERROR  # the SA answered with a record that is not ours
        if self.phase is SubPhase.SUBSCRIBING:
            return self._first_outcome(status, mad_status)
        if self.phase is SubPhase.UNSUBSCRIBING:
            if not self._inflight_sub:
                return self._finish(status)
            if status is not Status.SUCCESS and not self._was_active:
                return self._finish(Status.SUCCESS)  # the SA never took it: nothing to undo
            # the (re)subscribe in flight when unsubscribe came: now the unsubscribe
            return [self._send(False)]
        if self.phase is SubPhase.ACTIVE:
            self.last_renew_status = status
            if status is Status.SUCCESS:
                self.renewals += 1
                self._backoff.reset()
                if self._renew_due:
                    self._renew_due = False
                    return [self._send(True)]
                return []
            if status is Status.CANCELED:
                return []
            return self._arm_retry()
        return []

    def report(self, notice: Notice) -> list[Action]:
        """An SA Report reached the port; delivered if it matches this subscription."""
        if not self.info.matches(notice):
            return []
        if self.phase is SubPhase.SUBSCRIBING:
            self._held.append(notice)
            return []
        if self.phase is SubPhase.ACTIVE:
            return [Deliver(notice)]
        self.dropped_reports += 1
        return []

    def reregister(self) -> list[Action]:
        """The SA may have forgotten us (client reregister, SM/LID change, port active)."""
        if self.phase is SubPhase.ACTIVE:
            if self._inflight is not None:
                self._renew_due = True
                return []
            return [self._send(True)]
        if self.phase is SubPhase.SUBSCRIBING:
            self._renew_due = True
        return []

    def retry_due(self) -> list[Action]:
        self._retry_armed = False
        if self.phase is SubPhase.ACTIVE and self._inflight is None:
            return [self._send(True)]
        return []

    def unsubscribe(self, shared: bool = False) -> list[Action]:
        """Stop reports now; tell the SA (Subscribe 0) when it may hold the subscription.

        ``shared``: another subscription of the port has the same InformInfo, and
        the SA keeps one record for both (OpenSM does): it is left alone."""
        phase = self.phase
        self.phase = SubPhase.UNSUBSCRIBING
        self._renew_due = False
        dropped, self._held = len(self._held), []
        self.dropped_reports += dropped
        if phase in (SubPhase.NEW, SubPhase.FAILED) or (shared and phase is not SubPhase.GONE):
            acts: list[Action] = [] if self._inflight is None else [CancelRequest(self._inflight)]
            self._inflight = None
            return [*acts, *self._finish(Status.SUCCESS)]
        if phase in (SubPhase.UNSUBSCRIBING, SubPhase.GONE):
            self.phase = phase
            return []
        if self._inflight is not None:
            return []  # the SA may take that Set yet: Subscribe 0 follows its answer
        return [self._send(False)]

    # ------------------------------------------------------------------ internals
    def _send(self, subscribe: bool) -> TransmitSet:
        self._tag += 1
        self._inflight = self._tag
        self._inflight_sub = subscribe
        return TransmitSet(self._tag, subscribe, self.info.encode(subscribe))

    def _confirmed(self, records: tuple[bytes, ...]) -> bool:
        """The SA echoes the InformInfo it took: same trap and filter (no record: trust it).

        OpenSM's AttributeOffset for InformInfo is 4 (32 bytes, its size rounded
        down), so the echo may lack the last 4 bytes (ProducerType): padded."""
        if not records:
            return True
        try:
            got = InformInfo.decode(records[0][: INFORM_INFO.size].ljust(INFORM_INFO.size, b"\0"))
        except FieldError:
            return False
        mine = self.info
        return (got.trap_number, got.is_generic, got.lid_range_begin) == (
            mine.trap_number, mine.is_generic, mine.lid_range_begin
        )  # fmt: skip

    def _first_outcome(self, status: Status, mad_status: int) -> list[Action]:
        held, self._held = self._held, []
        if status is not Status.SUCCESS:
            self.phase = SubPhase.FAILED
            self.dropped_reports += len(held)
            return [SubDone(status, mad_status)]
        self.phase = SubPhase.ACTIVE
        self._was_active = True
        out: list[Action] = [SubDone(status), *(Deliver(n) for n in held)]
        if self._renew_due:
            self._renew_due = False
            out.append(self._send(True))
        return out

    def _arm_retry(self) -> list[Action]:
        if self._retry_armed:
            return []
        self._retry_armed = True
        return [ArmTimer(self._backoff.next())]

    def _finish(self, status: Status) -> list[Action]:
        self.phase = SubPhase.GONE
        return [Finish(status)]
