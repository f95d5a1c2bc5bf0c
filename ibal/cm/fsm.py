"""The IB CM connection machine ("CEP", IBA vol. 1 chapter 12), sans-IO.

One :class:`Cep` per communication endpoint.  It does no I/O, starts no
threads and reads no clock: :meth:`Cep.handle` takes an event and ``now``
(seconds, the AL timer clock) and returns the actions the I/O layer
(``ibal.cm.service``) carries out, in order.  Messages travel as the 232-byte
CM data area (MAD bytes 24..255): API events carry the bytes ``ibal.cm.wire``
built, received messages come with their fields decoded by ``ibal.wire.mad.cm``.
The few messages the machine must originate itself (REJ Timeout, REJ
StaleConn, the DREP answering a crossing DREQ, what :class:`Destroy` sends)
are encoded here with the same ``ibal.wire.mad.cm`` tables and carry no private
data.

Every state change is a row of :data:`TRANSITIONS`; ``python -m ibal.docgen``
draws docs/cm-state-machine.md from it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ibal import sansio
from ibal.status import InvalidParameter, InvalidState, Status, Unsupported
from ibal.types import QpState
from ibal.wire.fields import Value
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason

__all__ = [
    "LAP_TRANSITIONS",
    "TRANSITIONS",
    "Action",
    "ApiEvent",
    "ArmTimer",
    "CancelTimer",
    "Cep",
    "CmState",
    "Deliver",
    "Destroy",
    "Drop",
    "EnterTimewait",
    "Event",
    "LapState",
    "Link",
    "ModifyQp",
    "QpEstablished",
    "RecvMsg",
    "Release",
    "RetransmitTimer",
    "SendApr",
    "SendDrep",
    "SendDreq",
    "SendLap",
    "SendMra",
    "SendRej",
    "SendRep",
    "SendReq",
    "SendRtu",
    "StaleConn",
    "TimerFired",
    "Transmit",
    "UpcallKind",
    "build_rej",
    "cm_ms",
    "event_key",
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
    """The QP reported communication established (data arrived before the RTU)."""


@dataclass(frozen=True, slots=True)
class StaleConn:
    """The I/O layer found a newer REQ/REP naming this connection's remote QPN and CA GUID."""


@dataclass(frozen=True, slots=True)
class Destroy:
    """The owner is gone (handle destroyed, AL closed): leave politely, no more upcalls."""


ApiEvent = (
    SendReq | SendRep | SendRtu | SendRej | SendMra | SendDreq | SendDrep | SendLap | SendApr
)  # fmt: skip
Event = ApiEvent | RecvMsg | TimerFired | QpEstablished | StaleConn | Destroy

# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Transmit(sansio.Transmit):
    """Send this CM message (the I/O layer adds the MAD header: TID, address)."""

    attr: CmAttr
    msg: bytes


@dataclass(frozen=True, slots=True)
class ArmTimer(sansio.ArmTimer):
    """(Re)arm the endpoint's one timer for ``at``; deliver ``TimerFired(generation)``."""

    at: float
    generation: int


@dataclass(frozen=True, slots=True)
class CancelTimer(sansio.CancelTimer):
    """Disarm the timer (a late ``TimerFired`` is ignored by generation anyway)."""


class UpcallKind(enum.StrEnum):
    """Which user callback a :class:`Deliver` is (IBAL's ``pfn_cm_*_cb``)."""

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
class Deliver(sansio.Deliver):
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
    Transmit | ArmTimer | CancelTimer | Deliver | ModifyQp | EnterTimewait | Release | Drop
)  # fmt: skip


# ---------------------------------------------------------------- messages the machine originates

_ARI_SIZE = 72


def build_rej(
    local_comm_id: int,
    remote_comm_id: int,
    reason: RejReason,
    rejected: MessageMraed = MessageMraed.OTHER,
    ari: bytes = b"",
) -> bytes:
    """A REJ without private data (also for the I/O layer: no listen, stale REQ/REP).

    ``rejected`` is MessageRejected: REQ, REP, or OTHER ("no message", value 2).
    """
    return cm.REJ.encode(
        local_comm_id=local_comm_id, remote_comm_id=remote_comm_id, message_rejected=rejected,
        reject_info_length=len(ari), reason=reason, ari=ari.ljust(_ARI_SIZE, b"\0"),
    )  # fmt: skip


def _num(f: Mapping[str, Value], name: str) -> int | None:
    v = f.get(name)
    return v if isinstance(v, int) else None


# ---------------------------------------------------------------- the transition table

S = CmState
L = LapState

_PRE_REP = (S.REQ_SENT, S.MRA_REQ_RCVD)  # active, waiting for REP
_WAIT_RTU = (S.REP_SENT, S.MRA_REP_RCVD)  # passive, waiting for RTU
_GOT_REQ = (S.REQ_RCVD, S.MRA_REQ_SENT)  # passive, user deciding
_GOT_REP = (S.REP_RCVD, S.MRA_REP_SENT)  # active, user deciding

Row = tuple[CmState, str, CmState, str]
LapRow = tuple[LapState, str, LapState, str]


def _rows(froms: tuple[CmState, ...], trigger: str, to: CmState | None, does: str) -> list[Row]:
    """One row per ``from`` state; ``to`` None means "stays where it is"."""
    return [(a, trigger, a if to is None else to, does) for a in froms]


# (from, trigger, to, what it does).  The trigger is the event's key and, where
# the outcome depends on more than the state, a guard after " / ".  Entering
# DREQ_SENT, DREQ_RCVD, TIMEWAIT or CLOSED with a QP bound also moves it to
# ERROR (once); entering TIMEWAIT arms its end, entering CLOSED releases.
TRANSITIONS: tuple[Row, ...] = tuple([
    # active establishment
    (S.IDLE, "send REQ", S.REQ_SENT, "send REQ, arm retransmit"),
    *_rows(_PRE_REP, "timeout / retries left", None, "resend REQ"),
    *_rows(_PRE_REP, "timeout / retries exhausted", S.CLOSED,
           "send REJ(Timeout, ARI = CA GUID); rep upcall TIMEOUT"),
    (S.REQ_SENT, "recv MRA", S.MRA_REQ_RCVD,
     "stretch the timer by the MRA's service timeout; mra upcall"),
    *_rows(_PRE_REP, "recv REP", S.REP_RCVD, "cancel timer; rep upcall"),
    (S.REQ_SENT, "recv REQ / peer-to-peer, local (CA GUID, QPN) greater", S.REQ_SENT,
     "ignore the peer's REQ: this side stays active"),
    (S.REQ_SENT, "recv REQ / peer-to-peer, local (CA GUID, QPN) smaller", S.REQ_RCVD,
     "cancel own REQ; become passive; req upcall"),
    *_rows(_GOT_REP, "send RTU", S.ESTABLISHED, "send RTU (QP already RTS)"),
    (S.REP_RCVD, "send MRA", S.MRA_REP_SENT, "send MRA"),
    (S.MRA_REP_SENT, "recv REP / duplicate", S.MRA_REP_SENT, "resend MRA"),
    (S.ESTABLISHED, "recv REP / duplicate (RTU lost)", S.ESTABLISHED, "resend RTU"),
    # passive establishment
    (S.LISTEN, "recv REQ", S.REQ_RCVD, "req upcall"),
    *_rows(_GOT_REQ, "send REP", S.REP_SENT, "send REP, arm retransmit"),
    (S.REQ_RCVD, "send MRA", S.MRA_REQ_SENT, "send MRA"),
    (S.MRA_REQ_SENT, "recv REQ / duplicate", S.MRA_REQ_SENT, "resend MRA"),
    (S.REP_SENT, "recv REQ / duplicate", S.REP_SENT, "resend REP"),
    *_rows(_WAIT_RTU, "timeout / retries left", None, "resend REP"),
    *_rows(_WAIT_RTU, "timeout / retries exhausted", S.CLOSED,
           "send REJ(Timeout, ARI = CA GUID); rtu upcall TIMEOUT"),
    (S.REP_SENT, "recv MRA", S.MRA_REP_RCVD,
     "stretch the timer by the MRA's service timeout; mra upcall"),
    *_rows(_WAIT_RTU, "recv RTU", S.ESTABLISHED, "cancel timer; QP to RTS; rtu upcall"),
    *_rows(_WAIT_RTU, "QP established", S.ESTABLISHED,
           "cancel timer; QP to RTS; rtu upcall (data came before the RTU)"),
    (S.ESTABLISHED, "QP established", S.ESTABLISHED, "nothing (the RTU came first)"),
    # rejects
    *_rows(_GOT_REQ + _PRE_REP + _WAIT_RTU, "send REJ", S.CLOSED, "cancel timer; send REJ"),
    *_rows(_GOT_REP, "send REJ", S.TIMEWAIT, "send REJ"),
    *_rows(_PRE_REP + _WAIT_RTU + _GOT_REQ, "recv REJ", S.CLOSED, "cancel timer; rej upcall"),
    *_rows(_PRE_REP + _WAIT_RTU + _GOT_REQ, "recv REJ / stale connection", S.TIMEWAIT,
           "cancel timer; rej upcall"),
    *_rows((*_GOT_REP, S.ESTABLISHED), "recv REJ", S.TIMEWAIT, "cancel timer; rej upcall"),
    *_rows((*_GOT_REP, S.ESTABLISHED), "recv REJ / stale connection", S.TIMEWAIT,
           "cancel timer; rej upcall"),
    # stale connections: a newer REQ/REP names this remote QPN and CA GUID
    (S.ESTABLISHED, "stale", S.DREQ_SENT, "send DREQ, arm retransmit; stale upcall"),
    *_rows(_WAIT_RTU + _GOT_REP, "stale", S.TIMEWAIT, "cancel timer; send REJ(StaleConn); "
           "stale upcall"),
    (S.TIMEWAIT, "recv REQ / duplicate", S.TIMEWAIT, "send REJ(StaleConn)"),
    # disconnect
    (S.ESTABLISHED, "send DREQ", S.DREQ_SENT, "send DREQ, arm retransmit"),
    (S.DREQ_SENT, "timeout / retries left", S.DREQ_SENT, "resend DREQ"),
    (S.DREQ_SENT, "timeout / retries exhausted", S.TIMEWAIT, "drep upcall TIMEOUT"),
    (S.DREQ_SENT, "recv DREP", S.TIMEWAIT, "cancel timer; drep upcall"),
    (S.DREQ_SENT, "recv DREQ / crossing", S.TIMEWAIT,
     "cancel timer; send DREP; drep upcall (with the peer's DREQ)"),
    (S.ESTABLISHED, "recv DREQ", S.DREQ_RCVD, "cancel a LAP timer; dreq upcall"),
    *_rows(_WAIT_RTU, "recv DREQ", S.DREQ_RCVD, "cancel timer; dreq upcall (RTU lost)"),
    (S.DREQ_RCVD, "send DREP", S.TIMEWAIT, "send DREP"),
    (S.TIMEWAIT, "recv DREQ / duplicate", S.TIMEWAIT, "resend DREP"),
    (S.TIMEWAIT, "recv DREP / late", S.TIMEWAIT, "nothing (answer to a crossed DREQ)"),
    (S.TIMEWAIT, "timeout", S.CLOSED, "release"),
    # the owner went away: leave without upcalls
    *_rows((S.IDLE, S.LISTEN), "destroy", S.CLOSED, "release"),
    *_rows(_PRE_REP, "destroy", S.CLOSED, "send REJ(Timeout, ARI = CA GUID)"),
    *_rows(_GOT_REQ + _WAIT_RTU, "destroy", S.CLOSED, "send REJ(ConsumerDefined)"),
    *_rows(_GOT_REP, "destroy", S.TIMEWAIT, "send REJ(ConsumerDefined)"),
    (S.ESTABLISHED, "destroy", S.DREQ_SENT, "send DREQ, arm retransmit"),
    (S.DREQ_RCVD, "destroy", S.TIMEWAIT, "send DREP"),
    *_rows((S.DREQ_SENT, S.TIMEWAIT), "destroy", None, "nothing (already leaving)"),
])  # fmt: skip

# The alternate-path exchange inside ESTABLISHED.  In ESTABLISHED these
# triggers are looked up here, with the LAP sub-state.
LAP_TRANSITIONS: tuple[LapRow, ...] = (
    (L.IDLE, "send LAP", L.LAP_SENT, "send LAP, arm retransmit (active side only)"),
    (L.LAP_SENT, "timeout / retries left", L.LAP_SENT, "resend LAP"),
    (L.MRA_LAP_RCVD, "timeout / retries left", L.MRA_LAP_RCVD, "resend LAP"),
    (L.LAP_SENT, "timeout / retries exhausted", L.IDLE, "apr upcall TIMEOUT"),
    (L.MRA_LAP_RCVD, "timeout / retries exhausted", L.IDLE, "apr upcall TIMEOUT"),
    (L.LAP_SENT, "recv MRA", L.MRA_LAP_RCVD, "stretch the timer; mra upcall"),
    (L.LAP_SENT, "recv APR", L.IDLE, "cancel timer; apr upcall"),
    (L.MRA_LAP_RCVD, "recv APR", L.IDLE, "cancel timer; apr upcall"),
    (L.IDLE, "recv LAP", L.LAP_RCVD, "lap upcall"),
    (L.LAP_RCVD, "send MRA", L.MRA_LAP_SENT, "send MRA"),
    (L.MRA_LAP_SENT, "recv LAP / duplicate", L.MRA_LAP_SENT, "resend MRA"),
    (L.LAP_RCVD, "send APR", L.IDLE, "send APR"),
    (L.MRA_LAP_SENT, "send APR", L.IDLE, "send APR"),
)

_LAP_KEYS = frozenset(
    {"send LAP", "send APR", "send MRA", "recv LAP", "recv APR", "recv MRA", "timeout"}
)


def _index(rows: tuple[tuple[Any, str, Any, str], ...]) -> dict[tuple[Any, str], dict[str, Any]]:
    out: dict[tuple[Any, str], dict[str, Any]] = {}
    for a, trigger, b, _ in rows:
        key, _sep, guard = trigger.partition(" / ")
        out.setdefault((a, key), {})[guard] = b
    return out


_MAIN = _index(TRANSITIONS)
_LAP = _index(LAP_TRANSITIONS)

_API_KEYS: dict[type, str] = {
    SendReq: "send REQ", SendRep: "send REP", SendRtu: "send RTU", SendRej: "send REJ",
    SendMra: "send MRA", SendDreq: "send DREQ", SendDrep: "send DREP", SendLap: "send LAP",
    SendApr: "send APR",
}  # fmt: skip
_API_ATTR: dict[type, CmAttr] = {
    SendReq: CmAttr.REQ, SendRep: CmAttr.REP, SendRtu: CmAttr.RTU, SendRej: CmAttr.REJ,
    SendMra: CmAttr.MRA, SendDreq: CmAttr.DREQ, SendDrep: CmAttr.DREP, SendLap: CmAttr.LAP,
    SendApr: CmAttr.APR,
}  # fmt: skip
_OTHER_KEYS: dict[type, str] = {
    TimerFired: "timeout", QpEstablished: "QP established", StaleConn: "stale",
    Destroy: "destroy",
}  # fmt: skip

# States whose entry puts a bound QP into ERROR.
_QP_DEAD = frozenset({S.DREQ_SENT, S.DREQ_RCVD, S.TIMEWAIT, S.CLOSED})


def event_key(event: Event) -> str:
    """The trigger an event is looked up by (before any guard)."""
    if isinstance(event, RecvMsg):
        return f"recv {CmAttr(event.attr).name}"
    return _API_KEYS.get(type(event)) or _OTHER_KEYS[type(event)]


class _Dropped(Exception):
    """A received message that does not fit: becomes a :class:`Drop`, state unchanged."""


class RetransmitTimer:
    """An endpoint's one timer, and the message it resends until answered.

    Each arm takes a new generation, so a ``TimerFired`` of an earlier one
    (a timer the I/O layer could not cancel in time) is recognised as stale.
    """

    def __init__(self) -> None:
        self.generation = 0
        self.at: float | None = None
        self._resend: Transmit | None = None
        self._interval_ms = 0
        self._retries_left = 0

    def is_current(self, ev: TimerFired) -> bool:
        return ev.generation == self.generation and self.at is not None

    def _arm(self, at: float) -> ArmTimer:
        self.generation += 1
        self.at = at
        return ArmTimer(at, self.generation)

    def arm(self, at: float) -> ArmTimer:
        """A plain timer (nothing to resend): TIMEWAIT's end."""
        self._resend = None
        return self._arm(at)

    def cancel(self) -> list[Action]:
        """Stop resending; a CancelTimer if a timer was armed."""
        self._resend = None
        if self.at is None:
            return []
        self.generation += 1
        self.at = None
        return [CancelTimer()]

    def start(self, attr: CmAttr, msg: bytes, interval_ms: int, retries: int,
              now: float) -> list[Action]:  # fmt: skip
        """Send ``msg`` and resend it every ``interval_ms`` up to ``retries`` times."""
        self._resend = Transmit(attr, msg)
        self._interval_ms, self._retries_left = interval_ms, retries
        return [self._resend, self._arm(now + interval_ms / 1000)]

    def stretch(self, interval_ms: int, now: float) -> ArmTimer:
        """The peer sent MRA: wait ``interval_ms`` from now, and as long between resends."""
        self._interval_ms = interval_ms
        return self._arm(now + interval_ms / 1000)

    def fired(self, now: float) -> list[Action]:
        """The current timer expired: the resend and re-arm, or [] (plain, or retries over)."""
        self.at = None
        r = self._resend
        if r is None or self._retries_left <= 0:
            self._resend = None
            return []
        self._retries_left -= 1
        return [r, self._arm(now + self._interval_ms / 1000)]


class Link:
    """Who a connection joins, learned from its REQ and REP, and the messages
    the machine builds from that (REJ, DREQ, DREP without private data)."""

    def __init__(self, local_comm_id: int) -> None:
        self.local_comm_id = local_comm_id
        self.remote_comm_id: int | None = None
        self.remote_ca_guid: int | None = None
        self.remote_qpn: int | None = None
        self.local_ca_guid = 0
        self.local_qpn: int | None = None
        self.ack_timeout = 0  # the REQ's primary local ACK timeout: TIMEWAIT, MRA slack
        self.timeout_ms = 0  # the REQ's (active) or REP's (passive) retransmit settings,
        self.retries = 0  # for the DREQ the machine sends itself

    def learn_local(self, f: Mapping[str, Value], timeout_ms: int, retries: int) -> None:
        """From our own REQ or REP."""
        self.local_ca_guid = _num(f, "local_ca_guid") or 0
        self.local_qpn = _num(f, "local_qpn")
        self.timeout_ms, self.retries = timeout_ms, retries

    def learn_peer(self, f: Mapping[str, Value]) -> None:
        """From the peer's REQ or REP: its comm ID, CA GUID and QPN."""
        self.remote_comm_id = _num(f, "local_comm_id")
        self.remote_ca_guid = _num(f, "local_ca_guid")
        self.remote_qpn = _num(f, "local_qpn")

    def learn_req(self, f: Mapping[str, Value]) -> None:
        """From the peer's REQ: as learn_peer, and the path's ACK timeout."""
        self.learn_peer(f)
        self.ack_timeout = _num(f, "primary_local_ack_timeout") or 0

    def mismatch(self, ev: RecvMsg) -> str | None:
        """Why a received message is not for this connection, or None."""
        f = ev.fields
        rc = _num(f, "remote_comm_id")
        # A REJ(Timeout) from a peer that never saw our message names no remote ID
        # (it names itself by local comm ID and CA GUID in the ARI).
        timeout_rej = ev.attr is CmAttr.REJ and f.get("reason") == RejReason.TIMEOUT
        if rc is not None and rc != self.local_comm_id and not (timeout_rej and rc == 0):
            return f"{ev.attr.name} for comm ID {rc:#x}, this is {self.local_comm_id:#x}"
        lc = _num(f, "local_comm_id")
        if self.remote_comm_id is not None and lc is not None and lc != self.remote_comm_id:
            return f"{ev.attr.name} from comm ID {lc:#x}, peer is {self.remote_comm_id:#x}"
        return None

    def rej(self, reason: RejReason, rejected: MessageMraed = MessageMraed.OTHER,
            ari: bytes = b"") -> bytes:  # fmt: skip
        return build_rej(self.local_comm_id, self.remote_comm_id or 0, reason, rejected, ari)

    def dreq(self) -> bytes:
        return cm.DREQ.encode(local_comm_id=self.local_comm_id,
                              remote_comm_id=self.remote_comm_id or 0,
                              remote_qpn=self.remote_qpn or 0)  # fmt: skip

    def drep(self) -> bytes:
        return cm.DREP.encode(local_comm_id=self.local_comm_id,
                              remote_comm_id=self.remote_comm_id or 0)  # fmt: skip

    def guid_ari(self) -> bytes:
        """ARI of a REJ(Timeout): the rejecting CA's GUID."""
        return self.local_ca_guid.to_bytes(8, "big")


# ---------------------------------------------------------------- the machine


class Cep:
    """One connection endpoint's CM state (pure: no I/O, no threads, no clock reads).

    An active endpoint starts in IDLE and takes :class:`SendReq`; a passive
    one starts in LISTEN and takes the received REQ.  Peer-to-peer: when a
    ``SendReq(peer_to_peer=True)`` endpoint in REQ_SENT receives a REQ, the
    side whose (local CA GUID, local QPN) is greater stays active and ignores
    it; the smaller side drops its own REQ and answers the peer's as a
    passive side.  /work/shared/spec has no text on the rule; this is the
    comparison Linux cm.c once declared as ``cm_is_active_peer`` (Linux itself
    never implemented peer-to-peer), documented in docs/cm-state-machine.md.

    The I/O layer moves the QP to RTR/RTS itself before feeding
    :class:`SendRtu` (active) and to RTR before :class:`SendRep` (passive);
    the machine asks for RTS on the passive side (RTU or data received) and
    for ERROR (once) when the connection dies.
    """

    def __init__(self, local_comm_id: int, *, active: bool, now: float) -> None:
        self.local_comm_id = local_comm_id
        self.active = active
        self.state = S.IDLE if active else S.LISTEN
        self.lap_state = L.IDLE
        self.link = Link(local_comm_id)
        self.peer_to_peer = False
        self.timer = RetransmitTimer()
        self.created = now
        # (from, trigger, to) of the last transition taken: tests check every row is reached.
        self.last_transition: tuple[CmState | LapState, str, CmState | LapState] | None = None
        self._sent: dict[CmAttr, bytes] = {}
        self._qp_bound = False
        self._qp_error = False
        self._muted = False

    @property
    def generation(self) -> int:
        """The generation of the last timer armed or cancelled."""
        return self.timer.generation

    @property
    def timer_at(self) -> float | None:
        """When the armed timer expires, if one is armed."""
        return self.timer.at

    @property
    def remote_comm_id(self) -> int | None:
        return self.link.remote_comm_id

    @property
    def remote_ca_guid(self) -> int | None:
        return self.link.remote_ca_guid

    @property
    def remote_qpn(self) -> int | None:
        return self.link.remote_qpn

    @property
    def timewait_ms(self) -> int:
        """TIMEWAIT length: ms(path ACK timeout) (roce-wire.md 3.5)."""
        return cm_ms(self.link.ack_timeout)

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply ``event``; return the actions, in order.

        Raises ``InvalidState`` for an API event the state does not allow
        (``Unsupported`` for LAP on the passive side, ``InvalidParameter``
        for a message that is not 232 bytes or names another endpoint).  A
        received message that does not fit gives :class:`Drop`; a stale
        timer, and a QP/stale/destroy event with nothing to do, give nothing.
        """
        key = event_key(event)
        if isinstance(event, TimerFired) and not self.timer.is_current(event):
            return []
        lap = self.state is S.ESTABLISHED and key in _LAP_KEYS
        cur: CmState | LapState = self.lap_state if lap else self.state
        outcomes = (_LAP if lap else _MAIN).get((cur, key))
        if isinstance(event, ApiEvent):
            self._check_api(event, key, outcomes is not None)
        if outcomes is None:
            if isinstance(event, RecvMsg):
                return [Drop(f"unexpected {key[5:]} in {self._where()}")]
            return []
        if isinstance(event, Destroy):
            self._muted = True
        try:
            guard, acts = self._dispatch(event, key, now)
        except _Dropped as e:
            return [Drop(str(e))]
        to = outcomes.get(guard)
        if to is None:  # a handler chose a guard its table lacks: a bug here, not input
            raise AssertionError(f"cm.fsm: no row ({cur}, {key!r}, {guard!r})")
        trigger = f"{key} / {guard}" if guard else key
        self.last_transition = (cur, trigger, to)
        if lap:
            self.lap_state = to
        else:
            acts = self._enter(to, acts, now)
        if self._muted:
            acts = [a for a in acts if not isinstance(a, Deliver)]
        return acts

    # -- helpers

    def _where(self) -> str:
        if self.state is S.ESTABLISHED and self.lap_state is not L.IDLE:
            return f"{self.state.value} ({self.lap_state.value})"
        return self.state.value

    def _check_api(self, event: ApiEvent, key: str, allowed: bool) -> None:
        if isinstance(event, SendLap) and allowed and not self.active:
            raise Unsupported("LAP is sent by the active side only")
        if not allowed:
            raise InvalidState(f"cannot {key} in state {self._where()}")
        msg = event.msg
        if len(msg) != cm.MAD_DATA:
            raise InvalidParameter(f"{key}: a CM message is {cm.MAD_DATA} bytes, got {len(msg)}")
        own = _num(cm.TABLES[_API_ATTR[type(event)]].decode(msg), "local_comm_id")
        if own is not None and own != self.local_comm_id:
            raise InvalidParameter(
                f"{key}: message carries local comm ID {own:#x}, "
                f"endpoint is {self.local_comm_id:#x}"
            )

    def _cancel(self) -> list[Action]:
        return self.timer.cancel()

    def _start(self, attr: CmAttr, msg: bytes, timeout_ms: int, retries: int,
               now: float) -> list[Action]:  # fmt: skip
        self._sent[attr] = msg
        return self.timer.start(attr, msg, timeout_ms, retries, now)

    def _send(self, attr: CmAttr, msg: bytes) -> Transmit:
        self._sent[attr] = msg
        return Transmit(attr, msg)

    def _resend(self, attr: CmAttr) -> list[Action]:
        return [Transmit(attr, self._sent[attr])]

    def _rej(self, reason: RejReason, rejected: MessageMraed = MessageMraed.OTHER,
             ari: bytes = b"") -> Transmit:  # fmt: skip
        return self._send(CmAttr.REJ, self.link.rej(reason, rejected, ari))

    def _dreq(self, now: float) -> list[Action]:
        link = self.link
        return self._start(CmAttr.DREQ, link.dreq(), link.timeout_ms, link.retries, now)

    def _drep(self) -> Transmit:
        return self._send(CmAttr.DREP, self.link.drep())

    def _enter(self, to: CmState, acts: list[Action], now: float) -> list[Action]:
        """The state change's own actions around the handler's."""
        if to is self.state:
            return acts
        if self.state is S.ESTABLISHED:
            self.lap_state = L.IDLE
        if to in _QP_DEAD and self._qp_bound and not self._qp_error:
            self._qp_error = True
            at = next((i for i, a in enumerate(acts) if isinstance(a, Deliver)), len(acts))
            acts.insert(at, ModifyQp(QpState.ERROR))
        if to is S.TIMEWAIT:
            until = now + self.timewait_ms / 1000
            acts += [EnterTimewait(until), self.timer.arm(until)]
        elif to is S.CLOSED:
            acts += [*self._cancel(), Release()]
        self.state = to
        return acts

    # -- dispatch: each returns (guard, actions) or raises _Dropped

    def _dispatch(self, ev: Event, key: str, now: float) -> tuple[str, list[Action]]:
        if isinstance(ev, RecvMsg):
            why = self.link.mismatch(ev)
            if why:
                raise _Dropped(why)
            return _RECV[ev.attr](self, ev, now)
        if isinstance(ev, TimerFired):
            return self._on_timeout(now)
        if isinstance(ev, QpEstablished):
            return self._on_established()
        if isinstance(ev, StaleConn):
            return self._on_stale(now)
        if isinstance(ev, Destroy):
            return self._on_destroy(now)
        return self._on_api(ev, now)

    def _on_api(self, ev: Event, now: float) -> tuple[str, list[Action]]:
        if isinstance(ev, SendReq):
            f = cm.REQ.decode(ev.msg)
            self.link.learn_local(f, ev.timeout_ms, ev.retries)
            self.link.ack_timeout = _num(f, "primary_local_ack_timeout") or 0
            self.peer_to_peer = ev.peer_to_peer
            self._qp_bound = True
            return "", self._start(CmAttr.REQ, ev.msg, ev.timeout_ms, ev.retries, now)
        if isinstance(ev, SendRep):
            self.link.learn_local(cm.REP.decode(ev.msg), ev.timeout_ms, ev.retries)
            self._qp_bound = True
            return "", self._start(CmAttr.REP, ev.msg, ev.timeout_ms, ev.retries, now)
        if isinstance(ev, SendDreq | SendLap):
            attr = CmAttr.DREQ if isinstance(ev, SendDreq) else CmAttr.LAP
            return "", [*self._cancel(), *self._start(attr, ev.msg, ev.timeout_ms,
                                                      ev.retries, now)]  # fmt: skip
        if isinstance(ev, SendRej):
            return "", [*self._cancel(), self._send(CmAttr.REJ, ev.msg)]
        assert isinstance(ev, SendRtu | SendMra | SendDrep | SendApr)
        return "", [self._send(_API_ATTR[type(ev)], ev.msg)]

    def _on_timeout(self, now: float) -> tuple[str, list[Action]]:
        resend = self.timer.fired(now)
        if self.state is S.TIMEWAIT:
            return "", []
        if resend:
            return "retries left", resend
        timeout = Status.TIMEOUT
        if self.state in _PRE_REP + _WAIT_RTU:
            kind = UpcallKind.REP if self.state in _PRE_REP else UpcallKind.RTU
            rej = self._rej(RejReason.TIMEOUT, ari=self.link.guid_ari())
            return "retries exhausted", [rej, Deliver(kind, None, None, timeout)]
        if self.state is S.DREQ_SENT:
            return "retries exhausted", [Deliver(UpcallKind.DREP, None, None, timeout)]
        return "retries exhausted", [Deliver(UpcallKind.APR, None, None, timeout)]  # LAP

    def _on_established(self) -> tuple[str, list[Action]]:
        if self.state is S.ESTABLISHED:
            return "", []
        return "", [*self._cancel(), ModifyQp(QpState.RTS),
                    Deliver(UpcallKind.RTU, None, None, Status.SUCCESS)]  # fmt: skip

    def _on_stale(self, now: float) -> tuple[str, list[Action]]:
        up = Deliver(UpcallKind.STALE, None, None, Status.SUCCESS)
        if self.state is S.ESTABLISHED:
            return "", [*self._cancel(), *self._dreq(now), up]
        rejected = MessageMraed.REP if self.state in _GOT_REP else MessageMraed.OTHER
        return "", [*self._cancel(), self._rej(RejReason.STALE_CONN, rejected), up]

    def _on_destroy(self, now: float) -> tuple[str, list[Action]]:
        st = self.state
        if st in _PRE_REP:
            rej = self._rej(RejReason.TIMEOUT, ari=self.link.guid_ari())
            return "", [*self._cancel(), rej]
        if st in _GOT_REQ + _WAIT_RTU + _GOT_REP:
            rejected = {S.REQ_RCVD: MessageMraed.REQ, S.MRA_REQ_SENT: MessageMraed.REQ,
                        S.REP_RCVD: MessageMraed.REP, S.MRA_REP_SENT: MessageMraed.REP,
                        }.get(st, MessageMraed.OTHER)  # fmt: skip
            return "", [*self._cancel(), self._rej(RejReason.CONSUMER_DEFINED, rejected)]
        if st is S.ESTABLISHED:
            return "", [*self._cancel(), *self._dreq(now)]
        if st is S.DREQ_RCVD:
            return "", [self._drep()]
        return "", []  # IDLE, LISTEN, DREQ_SENT, TIMEWAIT

    # -- received messages (ids already checked)

    def _on_req(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        f = ev.fields
        up = Deliver(UpcallKind.REQ, ev.attr, f, Status.SUCCESS)
        st = self.state
        if st is S.LISTEN:
            self.link.learn_req(f)
            return "", [up]
        if st is S.REQ_SENT:
            if not self.peer_to_peer:
                raise _Dropped("REQ for an active endpoint that is not peer-to-peer")
            mine = (self.link.local_ca_guid, self.link.local_qpn or 0)
            theirs = (_num(f, "local_ca_guid") or 0, _num(f, "local_qpn") or 0)
            if mine == theirs:
                raise _Dropped("peer-to-peer REQ from this endpoint's own QP")
            if mine > theirs:
                return "peer-to-peer, local (CA GUID, QPN) greater", []
            self.link.learn_req(f)
            self.active = False
            return "peer-to-peer, local (CA GUID, QPN) smaller", [*self._cancel(), up]
        if self.remote_comm_id is None:  # duplicates name the REQ we know
            raise _Dropped(f"unexpected REQ in {self._where()}")
        if st is S.MRA_REQ_SENT:
            return "duplicate", self._resend(CmAttr.MRA)
        if st is S.REP_SENT:
            return "duplicate", self._resend(CmAttr.REP)
        # TIMEWAIT: the peer reuses an old connection's identity
        return "duplicate", [self._rej(RejReason.STALE_CONN, MessageMraed.REQ)]

    def _on_rep(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        if self.state in _PRE_REP:
            self.link.learn_peer(ev.fields)
            return "", [*self._cancel(), Deliver(UpcallKind.REP, ev.attr, ev.fields,
                                                Status.SUCCESS)]  # fmt: skip
        if self.state is S.MRA_REP_SENT:
            return "duplicate", self._resend(CmAttr.MRA)
        if CmAttr.RTU not in self._sent:  # ESTABLISHED passive: no RTU of ours to repeat
            raise _Dropped(f"unexpected REP in {self._where()} (passive side)")
        return "duplicate (RTU lost)", self._resend(CmAttr.RTU)

    def _on_rtu(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        return "", [*self._cancel(), ModifyQp(QpState.RTS),
                    Deliver(UpcallKind.RTU, ev.attr, ev.fields, Status.SUCCESS)]  # fmt: skip

    def _on_rej(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        stale = ev.fields.get("reason") == RejReason.STALE_CONN
        up = Deliver(UpcallKind.REJ, ev.attr, ev.fields, Status.SUCCESS)
        return ("stale connection" if stale else ""), [*self._cancel(), up]

    def _on_mra(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        want = {S.REQ_SENT: MessageMraed.REQ, S.REP_SENT: MessageMraed.REP,
                S.ESTABLISHED: MessageMraed.LAP}[self.state]  # fmt: skip
        got = _num(ev.fields, "message_mraed")
        if got != want:
            raise _Dropped(f"MRA of message {got} in {self._where()}")
        # The peer promised an answer within its service timeout: wait that long
        # (plus a path ACK time) before resending.
        wait = cm_ms(_num(ev.fields, "service_timeout") or 0) + cm_ms(self.link.ack_timeout)
        up = Deliver(UpcallKind.MRA, ev.attr, ev.fields, Status.SUCCESS)
        return "", [self.timer.stretch(wait, now), up]

    def _on_dreq(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        qpn = _num(ev.fields, "remote_qpn")
        mine = self.link.local_qpn
        if mine is not None and qpn is not None and qpn != mine:
            raise _Dropped(f"DREQ for QPN {qpn:#x}, this connection's is {mine:#x}")
        if self.state is S.DREQ_SENT:
            up = Deliver(UpcallKind.DREP, ev.attr, ev.fields, Status.SUCCESS)
            return "crossing", [*self._cancel(), self._drep(), up]
        if self.state is S.TIMEWAIT:
            return "duplicate", [self._resend(CmAttr.DREP)[0] if CmAttr.DREP in self._sent
                                 else self._drep()]  # fmt: skip
        return "", [*self._cancel(), Deliver(UpcallKind.DREQ, ev.attr, ev.fields,
                                            Status.SUCCESS)]  # fmt: skip

    def _on_drep(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        if self.state is S.TIMEWAIT:
            return "late", []
        return "", [*self._cancel(), Deliver(UpcallKind.DREP, ev.attr, ev.fields,
                                            Status.SUCCESS)]  # fmt: skip

    def _on_lap(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        if self.lap_state is L.MRA_LAP_SENT:
            return "duplicate", self._resend(CmAttr.MRA)
        return "", [Deliver(UpcallKind.LAP, ev.attr, ev.fields, Status.SUCCESS)]

    def _on_apr(self, ev: RecvMsg, now: float) -> tuple[str, list[Action]]:
        return "", [*self._cancel(), Deliver(UpcallKind.APR, ev.attr, ev.fields, Status.SUCCESS)]


_RECV: dict[CmAttr, Callable[[Cep, RecvMsg, float], tuple[str, list[Action]]]] = {
    CmAttr.REQ: Cep._on_req, CmAttr.REP: Cep._on_rep, CmAttr.RTU: Cep._on_rtu,
    CmAttr.REJ: Cep._on_rej, CmAttr.MRA: Cep._on_mra, CmAttr.DREQ: Cep._on_dreq,
    CmAttr.DREP: Cep._on_drep, CmAttr.LAP: Cep._on_lap, CmAttr.APR: Cep._on_apr,
}  # fmt: skip
