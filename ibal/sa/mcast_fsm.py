"""Multicast membership as a sans-IO state machine (IBA 15.2.5.17, MCMemberRecord).

:class:`MemberRec` is ``ib_member_rec_t``: one MCMemberRecord, encoded and
decoded through :data:`ibal.wire.mad.sa.MCMEMBER_RECORD`.  :class:`McastMachine`
is one membership's life: ``JOINING -> JOINED -> LEAVING -> LEFT``.  It does no
I/O: each input (:meth:`~McastMachine.join`, :meth:`~McastMachine.answer`,
:meth:`~McastMachine.reregister`, :meth:`~McastMachine.retry_due`,
:meth:`~McastMachine.leave`) returns the actions the I/O layer
(:mod:`ibal.sa.mcast`) carries out, in order:

* :class:`TransmitSet` / :class:`TransmitDelete`: an SA request (``tag`` names it;
  an answer carrying another tag is stale and ignored), :class:`CancelRequest` one;
* :class:`Attach` / :class:`Detach`: the UD QP joins or leaves ``(mgid, mlid)``;
* :class:`Deliver`: the membership's callback (join result, rejoin, error);
* :class:`ArmTimer`: call :meth:`~McastMachine.retry_due` after ``delay`` s;
* :class:`Finish`: the leave is over (the Delete's outcome).

A join that fails the first time reports and ends (``LEFT``).  A *re*join (the
port's SM asked clients to re-register, the SM or the port's LID changed) that
fails reports the error and tries again after a back-off that doubles up to
``max_backoff``: after an SM restart the SA may answer late, and a group
somebody else created may come back only when its creator rejoined.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ibal import sansio
from ibal.sa.backoff import Backoff
from ibal.status import Status
from ibal.types import Gid
from ibal.wire.fields import FieldError
from ibal.wire.mad.sa import MCMEMBER_RECORD, component_mask

ZERO_GID = Gid(0)


class JoinState(enum.IntFlag):
    """MCMemberRecord.JoinState bits."""

    FULL = 0x1
    NON = 0x2
    SENDONLY = 0x4


class McastPhase(enum.Enum):
    """Where a membership is."""

    JOINING = "joining"
    JOINED = "joined"
    LEAVING = "leaving"
    LEFT = "left"


class Scope(enum.IntEnum):
    """The scope nibble of an MGID and MCMemberRecord.Scope (IBA 4.1.1)."""

    LINK_LOCAL = 0x2
    SITE_LOCAL = 0x5
    ORGANIZATION_LOCAL = 0x8
    GLOBAL = 0xE


@dataclass(frozen=True, slots=True)
class MemberRec:
    """``ib_member_rec_t``: one MCMemberRecord, field names as the wire table's."""

    mgid: Gid = ZERO_GID
    port_gid: Gid = ZERO_GID
    q_key: int = 0
    mlid: int = 0
    mtu_selector: int = 0
    mtu: int = 0
    tclass: int = 0
    p_key: int = 0
    rate_selector: int = 0
    rate: int = 0
    packet_life_time_selector: int = 0
    packet_life_time: int = 0
    sl: int = 0
    flow_label: int = 0
    hop_limit: int = 0
    scope: int = Scope.LINK_LOCAL
    join_state: JoinState = JoinState.FULL
    proxy_join: int = 0

    def encode(self) -> bytes:
        """The record's 52 bytes (``FieldError`` for a value out of its field's range)."""
        values: dict[str, int | bytes] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            values[f.name] = v.packed if isinstance(v, Gid) else int(v)
        return MCMEMBER_RECORD.encode(values)

    @classmethod
    def decode(cls, data: bytes) -> MemberRec:
        """A record from its bytes (``FieldError`` if too short)."""
        d = MCMEMBER_RECORD.decode(data)
        kw: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            v = d[f.name]
            kw[f.name] = Gid(v) if isinstance(v, bytes) else v
        kw["join_state"] = JoinState(int(d["join_state"]))
        return cls(**kw)  # type: ignore[arg-type]


JOIN_COMPONENTS = ("mgid", "port_gid", "join_state")
"""What every join carries (OpenSM refuses a join without them)."""
CREATE_COMPONENTS = (*JOIN_COMPONENTS, "q_key", "tclass", "p_key", "flow_label", "sl")
"""What a join that may create the group must carry besides (IBA o15-0.1.11, rule 111)."""


def join_mask(names: Sequence[str], *, create: bool) -> int:
    """The ComponentMask of a join: the required components plus ``names``."""
    base = CREATE_COMPONENTS if create else JOIN_COMPONENTS
    return component_mask(MCMEMBER_RECORD, dict.fromkeys((*base, *names)))


LEAVE_MASK = component_mask(MCMEMBER_RECORD, JOIN_COMPONENTS)


# ---------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class TransmitSet(sansio.Transmit):
    """SubnAdmSet(MCMemberRecord): join (or create) the group."""

    tag: int
    record: bytes
    comp_mask: int


@dataclass(frozen=True, slots=True)
class TransmitDelete(sansio.Transmit):
    """SubnAdmDelete(MCMemberRecord): leave."""

    tag: int
    record: bytes
    comp_mask: int


@dataclass(frozen=True, slots=True)
class CancelRequest(sansio.CancelRequest):
    """Cancel the request ``tag`` (its answer will be stale)."""

    tag: int


@dataclass(frozen=True, slots=True)
class Attach:
    """Attach the QP to the group."""

    mgid: Gid
    mlid: int


@dataclass(frozen=True, slots=True)
class Detach:
    """Detach the QP from the group it is attached to."""


@dataclass(frozen=True, slots=True)
class Deliver(sansio.Deliver):
    """Tell the membership's callback: a join's (or rejoin's) outcome."""

    status: Status
    mad_status: int = 0
    record: MemberRec | None = None
    rejoin: bool = False


@dataclass(frozen=True, slots=True)
class ArmTimer(sansio.ArmTimer):
    """Call ``retry_due()`` after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True)
class Finish(sansio.Finish):
    """The leave is over: ``status`` is the Delete's outcome (SUCCESS, TIMEOUT, ...)."""

    status: Status
    mad_status: int = 0


Action = (
    TransmitSet | TransmitDelete | CancelRequest | Attach | Detach | Deliver | ArmTimer | Finish
)


class McastMachine:
    """One membership: see the module docstring.  Not thread-safe (the I/O layer locks)."""

    def __init__(
        self,
        request: MemberRec,
        comp_mask: int,
        *,
        first_backoff: float = 1.0,
        max_backoff: float = 64.0,
    ) -> None:
        if not request.join_state or request.join_state & ~JoinState(0x7):
            raise ValueError(f"bad join state {request.join_state!r}")
        self.request = request
        self.comp_mask = comp_mask
        self.phase = McastPhase.JOINING
        self.record: MemberRec | None = None
        """The SA's answer to the last successful join (MGID, MLID, Q_Key...)."""
        self.attached: tuple[Gid, int] | None = None
        self._backoff = Backoff(first_backoff, max_backoff)
        self._tag = 0
        self._pending: int | None = None  # the request in flight
        self._waiting = False  # a rejoin waits for ArmRetry's retry_due()
        self._ever_joined = False
        self._started = False
        self._recreate = False  # an SA-assigned group was gone at a rejoin: create anew
        self._create_only = join_mask((), create=True) & ~join_mask((), create=False)

    # ------------------------------------------------------------------ inputs
    def join(self) -> list[Action]:
        """Start: the first SubnAdmSet."""
        if self._started:
            raise RuntimeError("join() runs once")
        self._started = True
        return [self._send_set()]

    def answer(
        self, tag: int, status: Status, mad_status: int = 0, records: Sequence[bytes] = ()
    ) -> list[Action]:
        """The SA answered request ``tag`` (a stale tag is ignored)."""
        if tag != self._pending:
            return []
        self._pending = None
        if self.phase is McastPhase.LEAVING:
            self.phase = McastPhase.LEFT
            return [Finish(status, mad_status)]
        if self.phase is not McastPhase.JOINING:
            return []
        rec: MemberRec | None = None
        if status is Status.SUCCESS:
            try:
                rec = MemberRec.decode(records[0]) if records else None
            except FieldError:
                rec = None
            if rec is None:
                status = Status.ERROR  # a GetResp without its record
        if rec is None:
            return self._failed(status, mad_status)
        return self._joined(rec)

    def reregister(self) -> list[Action]:
        """The port's SM wants the membership again (client reregister, SM/LID change)."""
        if not self._started or self.phase in (McastPhase.LEAVING, McastPhase.LEFT):
            return []
        out: list[Action] = []
        if self._pending is not None:
            out.append(CancelRequest(self._pending))
            self._pending = None
        self._waiting = False
        self.phase = McastPhase.JOINING
        out.append(self._send_set())
        return out

    def retry_due(self) -> list[Action]:
        """The back-off armed by :class:`ArmTimer` ran out."""
        if not self._waiting or self.phase is not McastPhase.JOINING:
            return []
        self._waiting = False
        return [self._send_set()]

    def leave(self) -> list[Action]:
        """Leave: detach at once, then SubnAdmDelete (also when the join is still pending:
        the SA may have taken it).  A second leave does nothing."""
        if self.phase in (McastPhase.LEAVING, McastPhase.LEFT):
            return []
        out: list[Action] = []
        if self._pending is not None:
            out.append(CancelRequest(self._pending))
            self._pending = None
        self._waiting = False
        if self.attached is not None:
            out.append(Detach())
            self.attached = None
        if not self._ever_joined and self._started:
            out.append(Deliver(Status.CANCELED))
        if not self._started:
            self.phase = McastPhase.LEFT
            return [*out, Finish(Status.SUCCESS)]
        self.phase = McastPhase.LEAVING
        self._tag += 1
        self._pending = self._tag
        out.append(TransmitDelete(self._tag, self._leave_record().encode(), LEAVE_MASK))
        return out

    # ------------------------------------------------------------------ internals
    def _send_set(self) -> TransmitSet:
        self._tag += 1
        self._pending = self._tag
        req, mask = self.request, self.comp_mask
        if self.record is not None and req.mgid == ZERO_GID and not self._recreate:
            # The SA assigned the MGID: a rejoin joins that group as it is.  Not as
            # a create: OpenSM refuses to create a group whose MGID has its own
            # signature (0xA01B), so if the group is gone the next try asks anew.
            req = dataclasses.replace(req, mgid=self.record.mgid)
            mask &= ~self._create_only
        return TransmitSet(self._tag, req.encode(), mask)

    def _leave_record(self) -> MemberRec:
        mgid = self.record.mgid if self.record is not None else self.request.mgid
        return MemberRec(
            mgid=mgid, port_gid=self.request.port_gid, join_state=self.request.join_state
        )

    def _joined(self, rec: MemberRec) -> list[Action]:
        rejoin = self._ever_joined
        self._recreate = False
        self.record = rec
        self._ever_joined = True
        self._backoff.reset()
        self.phase = McastPhase.JOINED
        out: list[Action] = []
        target = (rec.mgid, rec.mlid)
        if self.attached != target:
            if self.attached is not None:
                out.append(Detach())
            out.append(Attach(*target))
            self.attached = target
        out.append(Deliver(Status.SUCCESS, 0, rec, rejoin))
        return out

    def _failed(self, status: Status, mad_status: int) -> list[Action]:
        if status is Status.CANCELED:
            return []  # only ours cancel, and they are stale by then
        if not self._ever_joined:
            self.phase = McastPhase.LEFT
            return [Deliver(status, mad_status), Finish(status, mad_status)]
        if status is Status.REMOTE_ERROR and self.request.mgid == ZERO_GID and not self._recreate:
            self._recreate = True  # the assigned group is gone: let the SA assign again
            return [Deliver(status, mad_status, None, True), self._send_set()]
        self._waiting = True
        return [Deliver(status, mad_status, None, True), ArmTimer(self._backoff.next())]


__all__ = [
    "CREATE_COMPONENTS",
    "JOIN_COMPONENTS",
    "LEAVE_MASK",
    "Action",
    "ArmTimer",
    "Attach",
    "CancelRequest",
    "Deliver",
    "Detach",
    "Finish",
    "JoinState",
    "McastMachine",
    "McastPhase",
    "MemberRec",
    "Scope",
    "TransmitDelete",
    "TransmitSet",
    "join_mask",
]
