"""Service ID resolution (SIDR_REQ / SIDR_REP, IBA 12.11) as a sans-IO machine.

Same shape as :mod:`ibal.cm.fsm` and the same action types: the requester
sends SIDR_REQ, resends it every ``timeout_ms`` up to ``retries`` times and
reports the SIDR_REP whose request ID matches, or a time-out; the responder
reports the SIDR_REQ and sends one SIDR_REP.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ibal.cm.fsm import Action, Destroy, RecvMsg, TimerFired

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

SIDR_TRANSITIONS: tuple[tuple[SidrState, str, SidrState], ...] = ()


class SidrCep:
    """One SIDR exchange (pure)."""

    def __init__(self, request_id: int, *, active: bool, now: float) -> None:
        self.request_id = request_id
        self.active = active
        self.state = SidrState.IDLE if active else SidrState.LISTEN
        self.generation = 0

    def handle(self, event: SidrEvent, now: float) -> list[Action]:
        """Apply ``event``; return the actions (InvalidState for an API call out of place)."""
        raise NotImplementedError
