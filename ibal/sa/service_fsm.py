"""The life of one service registration as a sans-IO machine (no I/O, no threads, no clock).

:class:`ServiceLease` is fed events -- ``start``, the SA's ``answer`` to a
request it asked for, its ``timer`` firing, ``reregister`` (the SM forgot
registrations: PnP ``CLIENT_REREGISTER`` / ``SM_CHANGE``) and ``stop`` --
each with the current time, and returns the actions the I/O layer performs
(:class:`Transmit`, :class:`CancelRequest`, :class:`ArmTimer`, :class:`Deliver`,
:class:`Finish`).  :mod:`ibal.sa.service` drives it on the AL's timers and
``SaPort``; the unit tests drive it with numbers.

Lease renewal: the SA drops a ServiceRecord ``ServiceLease`` seconds after
its last Set (IBA 15.2.5.14; ``0xFFFFFFFF`` is infinite).  A successful Set
sent at ``t`` is renewed at ``t + lease * RENEW_AT`` (the send time, not the
answer's: the SA's clock started no earlier).  A failed renewal is reported
and tried again halfway to the lease's end (at least ``MIN_RETRY`` s later),
then, once the lease may have lapsed, every ``lease * RENEW_AT`` seconds --
re-registering is the same Set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from ibal import sansio
from ibal.status import Status
from ibal.wire.mad.consts import Method
from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

INFINITE_LEASE: Final = 0xFFFFFFFF
"""ServiceLease meaning "never expires" (no renewal)."""
RENEW_AT: Final = 0.5
"""Renew when this fraction of the lease has passed."""
MIN_RETRY: Final = 1.0
"""Seconds at least between a failed renewal and the next try."""

_LEASE_BIT: Final = component_mask(SERVICE_RECORD, ["service_lease"])


class Attempt(enum.Enum):
    """Why a ServiceRecord Set was sent (reported with its outcome)."""

    REGISTER = "register"
    RENEW = "renew"
    REREGISTER = "reregister"


class Phase(enum.Enum):
    NEW = "new"
    SETTING = "setting"  # a Set in flight
    ACTIVE = "active"  # registered (or retrying a failed renewal), a timer may be armed
    DELETING = "deleting"  # the Delete in flight
    DONE = "done"


# ---------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Transmit(sansio.Transmit):
    """Send ``method`` (SET or DELETE) of ``record`` with ``comp_mask``; answer with ``token``."""

    token: int
    method: Method
    record: bytes
    comp_mask: int


@dataclass(frozen=True)
class CancelRequest(sansio.CancelRequest):
    """Cancel the request sent with ``token`` (its answer is then ignored)."""

    token: int


@dataclass(frozen=True)
class ArmTimer(sansio.ArmTimer):
    """Fire ``timer`` at clock time ``at``; ``None`` disarms."""

    at: float | None


@dataclass(frozen=True)
class Deliver(sansio.Deliver):
    """Tell the user: the outcome of a Set (``mad_status`` is the SA's, with REMOTE_ERROR)."""

    attempt: Attempt
    status: Status
    mad_status: int
    record: bytes


@dataclass(frozen=True)
class Finish(sansio.Finish):
    """Nothing more will happen; ``deleted`` is the Delete's status (``None``: none sent)."""

    deleted: Status | None
    registered: bool
    """False when the first Set failed (the registration never existed)."""
    mad_status: int = 0
    """The SA's MAD status for the Delete (with ``REMOTE_ERROR``)."""


Action = Transmit | CancelRequest | ArmTimer | Deliver | Finish


def lease_of(record: bytes) -> int:
    """The ServiceLease of an encoded ServiceRecord."""
    return int(SERVICE_RECORD.decode(record)["service_lease"])


class ServiceLease:
    """One registration: Set, renew, re-register, Delete; see the module docstring.

    ``record`` is the encoded ServiceRecord registered (and renewed and
    deleted: the SA keys records by ServiceID, GID and P_Key) with
    ``comp_mask``; without the ServiceLease bit the SA grants an infinite lease.
    ``renew=False`` leaves a finite lease to run out (IBAL's behaviour).
    """

    def __init__(self, record: bytes, comp_mask: int, *, renew: bool = True) -> None:
        if len(record) != SERVICE_RECORD.size:
            raise ValueError(f"a ServiceRecord is {SERVICE_RECORD.size} bytes")
        self.record = bytes(record)
        self.comp_mask = comp_mask
        self.renew = renew
        self.phase = Phase.NEW
        self.answered: bytes = self.record
        """The record as the SA last answered it (ServiceKey zeroed by OpenSM)."""
        self.expires: float | None = None
        """When the SA forgets the record unless renewed (``None``: never / not registered)."""
        self.renew_at: float | None = None
        self._token = 0
        self._inflight: int | None = None
        self._attempt = Attempt.REGISTER
        self._sent_at = 0.0
        self._registered = False  # a Set ever succeeded
        self._failing = False  # the last reported outcome was a failure
        self._again = False  # re-register once the Set in flight is answered

    # ------------------------------------------------------------------ helpers
    @property
    def lease(self) -> int:
        """The lease asked for, in seconds (infinite without the ServiceLease bit)."""
        if not self.comp_mask & _LEASE_BIT:
            return INFINITE_LEASE
        return lease_of(self.record)

    def _send(self, method: Method, now: float, out: list[Action]) -> None:
        self._token += 1
        self._inflight = self._token
        self._sent_at = now
        out.append(Transmit(self._token, method, self.record, self.comp_mask))

    def _set(self, attempt: Attempt, now: float, out: list[Action]) -> None:
        self._attempt = attempt
        self.phase = Phase.SETTING
        self.renew_at = None
        out.append(ArmTimer(None))
        self._send(Method.SET, now, out)

    def _arm(self, at: float | None, out: list[Action]) -> None:
        self.renew_at = at
        out.append(ArmTimer(at))

    # ------------------------------------------------------------------ events
    def start(self, now: float) -> list[Action]:
        """Send the first Set."""
        if self.phase is not Phase.NEW:
            return []
        out: list[Action] = []
        self._set(Attempt.REGISTER, now, out)
        return out

    def answer(
        self, token: int, status: Status, mad_status: int, record: bytes | None, now: float
    ) -> list[Action]:
        """The SA answered (or the request ended) ``token``; stale tokens are ignored."""
        if token != self._inflight:
            return []
        self._inflight = None
        out: list[Action] = []
        if self.phase is Phase.DELETING:
            self.phase = Phase.DONE
            out.append(Finish(status, self._registered, mad_status))
            return out
        if self.phase is not Phase.SETTING:  # pragma: no cover  (in flight means one of two)
            return out
        ok = status is Status.SUCCESS
        attempt = self._attempt
        if ok:
            if record is not None and len(record) >= SERVICE_RECORD.size:
                self.answered = bytes(record[: SERVICE_RECORD.size])
            self._registered = True
            self.phase = Phase.ACTIVE
            granted = lease_of(self.answered) if self.comp_mask & _LEASE_BIT else INFINITE_LEASE
            lease = granted if 0 < granted < INFINITE_LEASE else self.lease
            if 0 < lease < INFINITE_LEASE:
                self.expires = self._sent_at + lease
                if self.renew:
                    self._arm(self._sent_at + lease * RENEW_AT, out)
            else:
                self.expires = None
            if attempt is Attempt.REGISTER or self._failing:
                out.append(Deliver(attempt, status, 0, self.answered))
            self._failing = False
        else:
            out.append(Deliver(attempt, status, mad_status, self.answered))
            self._failing = True
            if attempt is Attempt.REGISTER:  # IBAL: a failed registration is gone
                self.phase = Phase.DONE
                out.append(Finish(None, False))
                return out
            self.phase = Phase.ACTIVE
            self._arm(self._retry_at(now), out)
        if self._again:
            self._again = False
            self._set(Attempt.REREGISTER, now, out)
        return out

    def _retry_at(self, now: float) -> float:
        lease = self.lease
        step = lease * RENEW_AT if 0 < lease < INFINITE_LEASE else MIN_RETRY
        if self.expires is not None and now < self.expires:
            step = min(step, (self.expires - now) / 2)
        return now + max(step, MIN_RETRY)

    def timer(self, now: float) -> list[Action]:
        """The renewal (or retry) time came."""
        if self.phase is not Phase.ACTIVE or self.renew_at is None or now < self.renew_at:
            return []
        out: list[Action] = []
        self._set(Attempt.RENEW, now, out)
        return out

    def reregister(self, now: float) -> list[Action]:
        """The SM may have forgotten the record: Set it again now."""
        if self.phase is Phase.SETTING:
            # Answered by the old SM, or by the new one before it forgot: ask again after.
            self._again = True
            return []
        if self.phase is not Phase.ACTIVE:
            return []
        out: list[Action] = []
        self._set(Attempt.REREGISTER, now, out)
        return out

    def stop(self, now: float) -> list[Action]:
        """Deregister: cancel what is in flight, Delete the record, then finish."""
        out: list[Action] = []
        if self.phase in (Phase.DELETING, Phase.DONE):
            return out
        if self.phase is Phase.NEW:
            self.phase = Phase.DONE
            out.append(Finish(None, False))
            return out
        self._arm(None, out)
        self._again = False
        if self.phase is Phase.SETTING and self._inflight is not None:
            out.append(CancelRequest(self._inflight))
            if self._attempt is Attempt.REGISTER:  # IBAL: the first outcome is CANCELED
                out.append(Deliver(Attempt.REGISTER, Status.CANCELED, 0, self.answered))
        # The SA may have processed a Set whose answer we did not see: always Delete.
        self.phase = Phase.DELETING
        self.expires = None
        self._send(Method.DELETE, now, out)
        return out


__all__ = [
    "INFINITE_LEASE",
    "MIN_RETRY",
    "RENEW_AT",
    "Action",
    "ArmTimer",
    "Attempt",
    "CancelRequest",
    "Deliver",
    "Finish",
    "Phase",
    "ServiceLease",
    "Transmit",
    "lease_of",
]
