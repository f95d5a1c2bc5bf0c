"""Service ID resolution (SIDR_REQ / SIDR_REP, IBA ch. 12) as a sans-IO machine.

Same shape and action types as :mod:`ibal.cm.fsm`: the requester sends
SIDR_REQ, resends it every ``timeout_ms`` up to ``retries`` times, and reports
the SIDR_REP whose request ID matches, or a time-out; the responder reports
the SIDR_REQ and sends one SIDR_REP.  Every state change is a row of
:data:`SIDR_TRANSITIONS` (drawn in docs/cm-state-machine.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ibal.cm.fsm import (
    Action,
    Deliver,
    Destroy,
    Drop,
    RecvMsg,
    Release,
    RetransmitTimer,
    TimerFired,
    Transmit,
    UpcallKind,
)
from ibal.status import InvalidParameter, InvalidState, Status
from ibal.wire.fields import Value
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, SidrStatus

__all__ = [
    "SIDR_TRANSITIONS", "SendSidrRep", "SendSidrReq", "SidrCep", "SidrEvent", "SidrState",
]  # fmt: skip


class SidrState(enum.Enum):
    IDLE = "idle"
    LISTEN = "listen"
    SIDR_REQ_SENT = "SIDR_REQ sent"
    SIDR_REQ_RCVD = "SIDR_REQ rcvd"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class SendSidrReq:
    """API: send this SIDR_REQ; resend every ``timeout_ms`` up to ``retries`` times."""

    msg: bytes
    timeout_ms: int
    retries: int


@dataclass(frozen=True, slots=True)
class SendSidrRep:
    """API: answer the received SIDR_REQ."""

    msg: bytes


SidrEvent = SendSidrReq | SendSidrRep | RecvMsg | TimerFired | Destroy

D = SidrState

SIDR_TRANSITIONS: tuple[tuple[SidrState, str, SidrState, str], ...] = (
    (D.IDLE, "send SIDR_REQ", D.SIDR_REQ_SENT, "send SIDR_REQ, arm retransmit"),
    (D.SIDR_REQ_SENT, "timeout / retries left", D.SIDR_REQ_SENT, "resend SIDR_REQ"),
    (D.SIDR_REQ_SENT, "timeout / retries exhausted", D.CLOSED, "sidr_rep upcall TIMEOUT"),
    (D.SIDR_REQ_SENT, "recv SIDR_REP", D.CLOSED, "cancel timer; sidr_rep upcall"),
    (D.LISTEN, "recv SIDR_REQ", D.SIDR_REQ_RCVD, "sidr_req upcall"),
    (D.SIDR_REQ_RCVD, "send SIDR_REP", D.CLOSED, "send SIDR_REP"),
    (D.IDLE, "destroy", D.CLOSED, "release"),
    (D.LISTEN, "destroy", D.CLOSED, "release"),
    (D.SIDR_REQ_SENT, "destroy", D.CLOSED, "cancel timer"),
    (D.SIDR_REQ_RCVD, "destroy", D.CLOSED, "send SIDR_REP(Reject)"),
)

_NEXT: dict[tuple[SidrState, str], SidrState] = {(a, t): b for a, t, b, _ in SIDR_TRANSITIONS}


def _key(event: SidrEvent) -> str:
    if isinstance(event, RecvMsg):
        return f"recv {CmAttr(event.attr).name}"
    if isinstance(event, SendSidrReq):
        return "send SIDR_REQ"
    if isinstance(event, SendSidrRep):
        return "send SIDR_REP"
    return "timeout" if isinstance(event, TimerFired) else "destroy"


def _hex(v: Value | None) -> str:
    return f"{v:#x}" if isinstance(v, int) else repr(v)


class _Mismatch(Exception):
    """A SIDR message for another request ID: dropped."""


class SidrCep:
    """One SIDR exchange, keyed by its request ID (pure: no I/O, no clock reads)."""

    def __init__(self, request_id: int, *, active: bool, now: float) -> None:
        self.request_id = request_id
        self.active = active
        self.state = D.IDLE if active else D.LISTEN
        self.timer = RetransmitTimer()
        self.last_transition: tuple[SidrState, str, SidrState] | None = None
        self._service_id = 0
        self._muted = False

    @property
    def generation(self) -> int:
        return self.timer.generation

    def handle(self, event: SidrEvent, now: float) -> list[Action]:
        """Apply ``event``; return the actions.

        ``InvalidState`` for an API call out of place, ``InvalidParameter``
        for a message that is not 232 bytes or carries another request ID; a
        message that does not fit gives :class:`~ibal.cm.fsm.Drop`.
        """
        key = _key(event)
        if isinstance(event, TimerFired) and not self.timer.is_current(event):
            return []
        allowed = any((self.state, t) in _NEXT for t in (key, f"{key} / retries left"))
        if isinstance(event, SendSidrReq | SendSidrRep):
            self._check_api(event, key, allowed)
        if not allowed:
            if isinstance(event, RecvMsg):
                return [Drop(f"unexpected {key[5:]} in {self.state.value}")]
            return []
        try:
            guard, acts = self._step(event, now)
        except _Mismatch as e:
            return [Drop(str(e))]
        trigger = f"{key} / {guard}" if guard else key
        to = _NEXT[(self.state, trigger)]
        self.last_transition = (self.state, trigger, to)
        self.state = to
        if to is D.CLOSED:
            acts.append(Release())
        if self._muted:
            acts = [a for a in acts if not isinstance(a, Deliver)]
        return acts

    def _check_api(self, event: SendSidrReq | SendSidrRep, key: str, allowed: bool) -> None:
        if not allowed:
            raise InvalidState(f"cannot {key} in state {self.state.value}")
        if len(event.msg) != cm.MAD_DATA:
            raise InvalidParameter(f"{key}: a CM message is {cm.MAD_DATA} bytes")
        table = cm.SIDR_REQ if isinstance(event, SendSidrReq) else cm.SIDR_REP
        rid = table.decode(event.msg)["request_id"]
        if rid != self.request_id:
            raise InvalidParameter(
                f"{key}: request ID {_hex(rid)}, exchange is {self.request_id:#x}"
            )

    def _step(self, event: SidrEvent, now: float) -> tuple[str, list[Action]]:
        if isinstance(event, SendSidrReq):
            return "", self.timer.start(CmAttr.SIDR_REQ, event.msg, event.timeout_ms,
                                        event.retries, now)  # fmt: skip
        if isinstance(event, SendSidrRep):
            return "", [Transmit(CmAttr.SIDR_REP, event.msg)]
        if isinstance(event, TimerFired):
            resend = self.timer.fired(now)
            if resend:
                return "retries left", resend
            return "retries exhausted", [Deliver(UpcallKind.SIDR_REP, None, None, Status.TIMEOUT)]
        if isinstance(event, Destroy):
            self._muted = True
            if self.state is D.SIDR_REQ_RCVD:
                rep = cm.SIDR_REP.encode(request_id=self.request_id, status=SidrStatus.REJECT,
                                         service_id=self._service_id)  # fmt: skip
                return "", [Transmit(CmAttr.SIDR_REP, rep)]
            return "", self.timer.cancel()
        rid = event.fields.get("request_id")
        if rid != self.request_id:
            raise _Mismatch(f"{event.attr.name} for request ID {_hex(rid)}, this is "
                            f"{self.request_id:#x}")  # fmt: skip
        if self.state is D.LISTEN:
            sid = event.fields.get("service_id")
            self._service_id = sid if isinstance(sid, int) else 0
            return "", [Deliver(UpcallKind.SIDR_REQ, event.attr, event.fields, Status.SUCCESS)]
        up = Deliver(UpcallKind.SIDR_REP, event.attr, event.fields, Status.SUCCESS)
        return "", [*self.timer.cancel(), up]
