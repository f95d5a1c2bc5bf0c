"""The IB CM connection machine ("CEP", IBA vol. 1 chapter 12), sans-IO.

One :class:`Cep` per communication endpoint.  It does no I/O, starts no
threads and reads no clock: :meth:`Cep.handle` takes an event and ``now``
(seconds, the AL timer clock) and returns the actions the I/O layer
(``ibal.cm.service``) carries out, in order.  Messages travel as the 232-byte
CM data area (MAD bytes 24..255): API events carry the bytes ``ibal.cm.wire``
built, received messages come with their fields decoded by ``ibal.mad.cm``.
The few messages the machine must originate itself (REJ Timeout, REJ
StaleConn, the DREP answering a crossing DREQ, what :class:`Destroy` sends)
are encoded here with the same ``ibal.mad.cm`` tables and carry no private
data.

Every state change is a row of :data:`TRANSITIONS`; ``python -m ibal.docgen``
draws docs/cm-state-machine.md from it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from ibal.mad.cm import CmAttr
from ibal.status import Status
from ibal.types import QpState
from ibal.wire.fields import Value

__all__ = [
    "TRANSITIONS", "Action", "ArmTimer", "CancelTimer", "Cep", "CmState", "Destroy", "Drop",
    "EnterTimewait", "Event", "LapState", "ModifyQp", "QpEstablished", "RecvMsg", "Release",
    "SendApr", "SendDrep", "SendDreq", "SendLap", "SendMra", "SendRej", "SendRep", "SendReq",
    "SendRtu", "StaleConn", "TimerFired", "Transmit", "Upcall", "UpcallKind", "cm_ms",
    "retransmit_ms",
]  # fmt: skip


def cm_ms(t: int) -> int:
    """A CM timeout exponent in ms: ``1 << max(t - 8, 0)`` (4.096 us * 2**t, rounded as Linux)."""
    return 1 << max(t - 8, 0)


def retransmit_ms(packet_life: int, resp_timeout: int) -> int:
    """REQ/REP/DREQ/LAP retransmit interval: 2 * ms(packet life) + ms(response timeout)."""
    return 2 * cm_ms(packet_life) + cm_ms(resp_timeout)


class CmState(enum.Enum):
    """Connection states (Linux ``enum ib_cm_state``; CLOSED = freed)."""

    IDLE = "idle"
    LISTEN = "listen"
    REQ_SENT = "REQ sent"
    REQ_RCVD = "REQ rcvd"
    MRA_REQ_SENT = "MRA(REQ) sent"
    MRA_REQ_RCVD = "MRA(REQ) rcvd"
    REP_SENT = "REP sent"
    REP_RCVD = "REP rcvd"
    MRA_REP_SENT = "MRA(REP) sent"
    MRA_REP_RCVD = "MRA(REP) rcvd"
    ESTABLISHED = "established"
    DREQ_SENT = "DREQ sent"
    DREQ_RCVD = "DREQ rcvd"
    TIMEWAIT = "timewait"
    CLOSED = "closed"


class LapState(enum.Enum):
    """The alternate-path sub-state of an ESTABLISHED connection."""

    IDLE = "idle"
    LAP_SENT = "LAP sent"
    LAP_RCVD = "LAP rcvd"
    MRA_LAP_SENT = "MRA(LAP) sent"
    MRA_LAP_RCVD = "MRA(LAP) rcvd"


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class SendReq:
    """API: send this REQ; resend every ``timeout_ms`` up to ``retries`` times.

    ``peer_to_peer``: both sides send REQ; a crossing REQ is resolved by
    comparing (CA GUID, QPN) (see :class:`Cep`).
    """

    msg: bytes
    timeout_ms: int
    retries: int
    peer_to_peer: bool = False


@dataclass(frozen=True, slots=True)
class SendRep:
    """API: accept the REQ (the QP is moved to RTR first); resend until RTU."""

    msg: bytes
    timeout_ms: int
    retries: int


@dataclass(frozen=True, slots=True)
class SendRtu:
    """API: complete establishment on the active side (QP to RTR and RTS first)."""

    msg: bytes


@dataclass(frozen=True, slots=True)
class SendRej:
    """API: reject a received REQ or REP."""

    msg: bytes


@dataclass(frozen=True, slots=True)
class SendMra:
    """API: ask the peer to wait for a REQ, REP or LAP being processed (its service timeout)."""

    msg: bytes


@dataclass(frozen=True, slots=True)
class SendDreq:
    """API: disconnect; resend until DREP."""

    msg: bytes
    timeout_ms: int
    retries: int


@dataclass(frozen=True, slots=True)
class SendDrep:
    """API: answer a received DREQ."""

    msg: bytes


@dataclass(frozen=True, slots=True)
class SendLap:
    """API (active side only): load this alternate path; resend until APR."""

    msg: bytes
    timeout_ms: int
    retries: int


@dataclass(frozen=True, slots=True)
class SendApr:
    """API: answer a received LAP."""

    msg: bytes


@dataclass(frozen=True, slots=True)
class RecvMsg:
    """A CM message for this endpoint: its attribute, 232 data bytes, decoded fields."""

    attr: CmAttr
    msg: bytes
    fields: Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class TimerFired:
    """The timer armed with ``generation`` expired (an older generation is ignored)."""

    generation: int


@dataclass(frozen=True, slots=True)
class QpEstablished:
    """The QP reported communication established (data before the RTU, IBA 12.9.6.2)."""


@dataclass(frozen=True, slots=True)
class StaleConn:
    """The I/O layer found a newer REQ/REP naming this connection's remote QPN and CA GUID."""


@dataclass(frozen=True, slots=True)
class Destroy:
    """The owner is gone (handle destroyed, AL closed): leave politely, no more upcalls."""


Event = (
    SendReq | SendRep | SendRtu | SendRej | SendMra | SendDreq | SendDrep | SendLap | SendApr
    | RecvMsg | TimerFired | QpEstablished | StaleConn | Destroy
)  # fmt: skip

# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send this CM message (the I/O layer adds the MAD header: TID, address)."""

    attr: CmAttr
    msg: bytes


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """(Re)arm the endpoint's one timer for ``at``; deliver ``TimerFired(generation)``."""

    at: float
    generation: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Disarm the timer (a late ``TimerFired`` is ignored by generation anyway)."""


class UpcallKind(enum.StrEnum):
    """Which user callback an :class:`Upcall` is (IBAL's ``pfn_cm_*_cb``)."""

    REQ = "req"
    REP = "rep"  # also the REQ's time-out (fields None, status TIMEOUT)
    MRA = "mra"
    REJ = "rej"
    RTU = "rtu"  # passive side established (RTU or data); status TIMEOUT if none came
    DREQ = "dreq"
    DREP = "drep"  # DREP arrived, or TIMEOUT
    LAP = "lap"
    APR = "apr"  # APR arrived, or TIMEOUT
    STALE = "stale"  # the connection was found stale and is being torn down
    SIDR_REQ = "sidr_req"
    SIDR_REP = "sidr_rep"  # SIDR_REP arrived, or TIMEOUT


@dataclass(frozen=True, slots=True)
class Upcall:
    """Deliver a callback: the received message's fields, or None for a time-out."""

    kind: UpcallKind
    attr: CmAttr | None
    fields: Mapping[str, Value] | None
    status: Status


@dataclass(frozen=True, slots=True)
class ModifyQp:
    """Move the connection's QP (RTR/RTS derived from REQ/REP by ``ibal.cm.wire``; ERROR)."""

    target: QpState


@dataclass(frozen=True, slots=True)
class EnterTimewait:
    """The connection is in TIMEWAIT until ``until`` (a timer is armed for it too)."""

    until: float


@dataclass(frozen=True, slots=True)
class Release:
    """The endpoint is finished: free its comm ID and routing entries."""


@dataclass(frozen=True, slots=True)
class Drop:
    """A received message or timer that does not fit the state: count it (``reason``)."""

    reason: str


Action = (
    Transmit | ArmTimer | CancelTimer | Upcall | ModifyQp | EnterTimewait | Release | Drop
)  # fmt: skip


# ---------------------------------------------------------------- the machine

S = CmState

# (from, trigger, to): the trigger is the event's key (see Cep.handle) and,
# where the outcome depends on more than the state, a guard after " / ".
TRANSITIONS: tuple[tuple[CmState, str, CmState], ...] = ()


class Cep:
    """One connection endpoint's CM state (pure: no I/O, no threads, no clock reads)."""

    def __init__(self, local_comm_id: int, *, active: bool, now: float) -> None:
        self.local_comm_id = local_comm_id
        self.active = active
        self.state = S.IDLE if active else S.LISTEN
        self.lap_state = LapState.IDLE
        self.remote_comm_id: int | None = None
        self.generation = 0
        self.created = now

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply ``event``; return the actions, in order.

        Raises ``InvalidState`` for an API event the state does not allow; a
        received message or timer that does not fit gives :class:`Drop`.
        """
        raise NotImplementedError
