"""Where the IBA text and kernel rxe differ: named policies of the transport core.

The core (:class:`~ibal.transport.core.QpCore`) follows one set of rules; each
question on which a provider must choose between the IBA reading and kernel
rxe's behaviour is a field here, and a provider hands its policy to every
core it builds.  rxe uses :data:`RXE_POLICY` (it must be a peer of the
kernel); :data:`IBA_POLICY` is the specification's reading, the one the mock's
engine implements (docs/decisions.md, "Transport engines").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ibal.transport.psn import PSN_HALF
from ibal.transport.qp import RXE_MAX_PKT_PER_ACK, RXE_MAX_UNACKED_PSNS


@dataclass(frozen=True, slots=True)
class TransportPolicy:
    """One provider's answers to the questions the IBA text and kernel rxe answer apart."""

    name: str
    infinite_retry_at_7: bool
    """A transport ``retry_cnt`` of 7 never runs out (kernel rxe); else 7 retries (IBA)."""
    ack_every_duplicate: bool
    """A duplicate SEND/WRITE is ACKed whether or not it asks (IBA 9.7.5.1.2, kernel
    rxe); else only one with AckReq, so a go-back-N does not cost an ACK per packet."""
    enforce_resp_res: bool
    """A READ or atomic beyond ``max(1, resp_res)`` outstanding is NAKed invalid
    request; else the responder takes as many as arrive."""
    max_unacked_psns: int
    """The requester sends no PSN this far past the oldest unacknowledged one."""
    max_pkt_per_ack: int
    """AckReq is forced after this many packets without it (besides each last packet)."""

    def __post_init__(self) -> None:
        if not 0 < self.max_unacked_psns < PSN_HALF:
            raise ValueError(f"max_unacked_psns {self.max_unacked_psns} outside 1..{PSN_HALF - 1}")
        if self.max_pkt_per_ack <= 0:
            raise ValueError(f"max_pkt_per_ack {self.max_pkt_per_ack} must be positive")


RXE_POLICY: Final = TransportPolicy(
    name="rxe",
    infinite_retry_at_7=True,
    ack_every_duplicate=False,
    enforce_resp_res=True,
    max_unacked_psns=RXE_MAX_UNACKED_PSNS,
    max_pkt_per_ack=RXE_MAX_PKT_PER_ACK,
)
"""What the rxe provider's cores follow (the duplicate ACK rule is ibal's own, see
docs/decisions.md; the rest is kernel rxe's)."""

IBA_POLICY: Final = TransportPolicy(
    name="iba",
    infinite_retry_at_7=False,
    ack_every_duplicate=True,
    enforce_resp_res=False,
    # IBA bounds outstanding PSNs only by the half-space a PSN compare can tell apart
    max_unacked_psns=PSN_HALF - 1,
    # no message spans this many packets (2^31 bytes at MTU 256 is 2^23): AckReq
    # only on each message's last packet
    max_pkt_per_ack=1 << 24,
)
"""The specification's reading, as the mock's engine has it."""
