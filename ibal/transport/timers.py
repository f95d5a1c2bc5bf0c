"""Transport timer formulas: RNR NAK timer codes and the local ACK timeout."""

from __future__ import annotations

from typing import Final

# IBA table 45: RNR NAK timer field -> milliseconds.  (Linux rxe has 61.41 for
# code 25, a typo; the spec value is used.)
RNR_TIMER_MS: Final[tuple[float, ...]] = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12,
    0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
    2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
    40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
)  # fmt: skip

INFINITE_RETRY: Final = 7
"""A 3-bit retry count of 7: RNR retry is never used up (IBA), nor, in Linux rxe,
the transport retry."""


def rnr_seconds(code: int) -> float:
    """The wait an RNR NAK's 5-bit timer code asks for, in seconds."""
    return RNR_TIMER_MS[code & 31] / 1000.0


def ack_timeout_seconds(code: int) -> float:
    """IBA local ACK timeout: 4.096 us * 2^code; 0 means infinite (``0.0`` here)."""
    return 0.0 if code == 0 else 4.096e-6 * (1 << code)
