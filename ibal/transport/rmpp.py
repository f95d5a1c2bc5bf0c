"""RMPP (IBA vol.1 13.6): the sender and receiver as sans-IO machines.

A message larger than one MAD travels as DATA segments of 256-byte MADs; the
receiver opens a sliding window with ACKs (``NewWindowLast``), the sender
retransmits what is unacknowledged when its response timer expires, and
either side ends the transfer with ABORT (a protocol error, with a status) or
the receiver with STOP (no resources).

The machines are pure: :meth:`RmppSender.start`, ``handle(mad, now)`` and
``on_timer(now)`` return a list of actions in :mod:`ibal.sansio`'s vocabulary
(:class:`Transmit`, :class:`ArmTimer`, :class:`CancelTimer`, :class:`Deliver`,
and the outcomes :class:`Complete` and :class:`Fail`) and never block, sleep or
touch a socket; :mod:`ibal.transport.rmpp_io` drives them over a send function and
a timer service.  Every state change goes through :data:`TRANSITIONS`, the
table ``python -m ibal.docgen`` draws docs/rmpp-state-machine.md from.

The header itself is :mod:`ibal.wire.mad.rmpp`. Segment layout: bytes 0..23 the
common MAD header, 24..35 the RMPP header, then 220 bytes per segment. A class
with a class header (SA: 20 bytes at 36..55) repeats it in every segment and
carries ``220 - len(header)`` data bytes; PayloadLength counts the 220-byte
areas (class header included), so the first segment says ``segments * 220 -
pad`` and the last ``220 - pad``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ibal import sansio
from ibal.wire.fields import Buffer
from ibal.wire.mad.consts import MAD_SIZE, RESPONSE_BIT, is_vendor_range2
from ibal.wire.mad.rmpp import (
    ABORT_STATUSES,
    COMMON_HEADER_SIZE,
    METHOD_BYTE,
    NO_RESP_TIME,
    RMPP_DATA,
    RMPP_HEADER,
    RMPP_OFFSET,
    RMPP_VERSION,
    SEGMENT_AREA,
    VENDOR_HEADER_SIZE,
    RmppFlags,
    RmppHeader,
    RmppStatus,
    RmppType,
    is_rmpp,
)

# -- actions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transmit(sansio.Transmit):
    """Send this 256-byte MAD to the peer."""

    mad: bytes


@dataclass(frozen=True, slots=True)
class ArmTimer(sansio.ArmTimer):
    """Call ``on_timer`` at ``at`` (replaces the machine's earlier deadline)."""

    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer(sansio.CancelTimer):
    """Disarm the machine's deadline."""


@dataclass(frozen=True, slots=True)
class Deliver(sansio.Deliver):
    """The reassembled message: common header and class header of segment 1, and the data."""

    header: bytes
    class_header: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class Complete(sansio.Finish):
    """The sender's message is acknowledged in full (``switch``: the peer answered with DATA)."""

    switch: bool = False


@dataclass(frozen=True, slots=True)
class Fail(sansio.Finish):
    """The transfer ended unsuccessfully; ``sent`` says whether this end sent the ABORT/STOP."""

    status: RmppStatus
    sent: bool


Action = Transmit | ArmTimer | CancelTimer | Deliver | Complete | Fail


# -- the transition table -----------------------------------------------------


class State(enum.Enum):
    SENDING = "sending"  # sender: segments outstanding
    WAIT_LAST_ACK = "wait last ACK"  # sender: every segment sent once, last not ACKed
    RECEIVING = "receiving"
    DONE = "done"  # receiver: delivered, still ACKing duplicates until the linger time
    COMPLETE = "complete"
    FAILED = "failed"
    CLOSED = "closed"


TRANSITIONS: tuple[tuple[str, State, str, State], ...] = (
    ("sender", State.SENDING, "ACK, more to send", State.SENDING),
    ("sender", State.SENDING, "time-out, retries left / resend from the hole", State.SENDING),
    ("sender", State.WAIT_LAST_ACK, "time-out, retries left / resend from the hole", State.SENDING),
    ("sender", State.SENDING, "sent the last segment", State.WAIT_LAST_ACK),
    ("sender", State.WAIT_LAST_ACK, "ACK of a middle segment", State.WAIT_LAST_ACK),
    ("sender", State.WAIT_LAST_ACK, "ACK of the last segment", State.COMPLETE),
    ("sender", State.WAIT_LAST_ACK, "DATA from the peer (response)", State.COMPLETE),
    ("sender", State.SENDING, "retries or total time exhausted / send ABORT", State.FAILED),
    ("sender", State.WAIT_LAST_ACK, "retries or total time exhausted / send ABORT",
     State.FAILED),
    ("sender", State.SENDING, "malformed or bad ACK / send ABORT", State.FAILED),
    ("sender", State.WAIT_LAST_ACK, "malformed or bad ACK / send ABORT", State.FAILED),
    ("sender", State.SENDING, "ABORT or STOP received", State.FAILED),
    ("sender", State.WAIT_LAST_ACK, "ABORT or STOP received", State.FAILED),
    ("receiver", State.RECEIVING, "DATA in sequence", State.RECEIVING),
    ("receiver", State.RECEIVING, "DATA with Last / deliver, ACK", State.DONE),
    ("receiver", State.RECEIVING, "malformed DATA / send ABORT", State.FAILED),
    ("receiver", State.RECEIVING, "message too large / send STOP", State.FAILED),
    ("receiver", State.RECEIVING, "total time-out / send ABORT", State.FAILED),
    ("receiver", State.RECEIVING, "ABORT or STOP received", State.FAILED),
    ("receiver", State.DONE, "duplicate DATA / re-ACK", State.DONE),
    ("receiver", State.DONE, "linger time over", State.CLOSED),
)  # fmt: skip

_ALLOWED = {(who, a, b) for who, a, _, b in TRANSITIONS}


class RmppError(ValueError):
    """A state change the transition table does not have (a bug, never a peer's doing)."""


@dataclass
class RmppCounters:
    """Per-machine counts, summed by the driver."""

    sent: int = 0
    resent: int = 0
    received: int = 0
    duplicates: int = 0
    dropped: int = 0  # out of window/order, or stale
    malformed: int = 0  # answered with ABORT (or dropped when no answer is allowed)


@dataclass
class _Machine:
    role: str = field(init=False, default="")
    state: State = field(init=False, default=State.SENDING)
    counters: RmppCounters = field(init=False, default_factory=RmppCounters)
    status: RmppStatus | None = field(init=False, default=None)

    def _move(self, to: State) -> None:
        if (self.role, self.state, to) not in _ALLOWED:
            raise RmppError(f"{self.role}: no transition {self.state.value} -> {to.value}")
        self.state = to

    @property
    def finished(self) -> bool:
        return self.state in (State.COMPLETE, State.FAILED, State.CLOSED, State.DONE)


def _reply_header(mad: Buffer) -> bytearray:
    """A MAD answering ``mad`` in the other direction (response bit flipped, body zero).

    A vendor range 2 class keeps its class header (reserved byte, OUI) after the
    RMPP header: MAD layers route those classes by the OUI (the kernel's ACKs
    carry it too), so an ACK without it would reach no agent."""
    out = bytearray(MAD_SIZE)
    out[:COMMON_HEADER_SIZE] = mad[:COMMON_HEADER_SIZE]
    if is_vendor_range2(mad[1]):
        vendor = slice(RMPP_DATA, RMPP_DATA + VENDOR_HEADER_SIZE)
        out[vendor] = mad[vendor]
    out[METHOD_BYTE] ^= RESPONSE_BIT
    return out


def _control(base: bytearray, kind: RmppType, status: int = 0, seg: int = 0, d2: int = 0) -> bytes:
    RMPP_HEADER.pack_into(
        base, RMPP_OFFSET, RMPP_VERSION, kind, NO_RESP_TIME, RmppFlags.ACTIVE, status, seg, d2
    )
    return bytes(base)


def _check_common(h: RmppHeader) -> RmppStatus | None:
    """The checks every RMPP MAD gets before its type is looked at."""
    if h.version != RMPP_VERSION:
        return RmppStatus.UNSUPPORTED_VERSION
    if h.type not in (RmppType.DATA, RmppType.ACK, RmppType.STOP, RmppType.ABORT):
        return RmppStatus.BAD_TYPE
    if h.status != RmppStatus.NORMAL:
        return RmppStatus.ILLEGAL_STATUS
    return None


def _remote_status(h: RmppHeader) -> RmppStatus:
    """The status an ABORT/STOP reports (an illegal one reads as UNSPECIFIED)."""
    ok = ABORT_STATUSES if h.type == RmppType.ABORT else {RmppStatus.RESOURCES_EXHAUSTED}
    return RmppStatus(h.status) if h.status in ok else RmppStatus.UNSPECIFIED


# -- sender --------------------------------------------------------------------


@dataclass
class RmppSender(_Machine):
    """Sends one message as DATA segments.

    ``header`` is the 24-byte common MAD header every segment carries
    (class, method, TID...); ``class_header`` the class header repeated in
    each segment (20 bytes for SA, empty for most classes).
    """

    header: bytes
    data: bytes
    class_header: bytes = b""
    resp_timeout: float = 1.0
    retries: int = 5
    total_timeout: float = 30.0
    resp_time: int = NO_RESP_TIME

    def __post_init__(self) -> None:
        self.role = "sender"
        if len(self.header) != COMMON_HEADER_SIZE:
            raise ValueError("header must be the 24-byte common MAD header")
        if len(self.class_header) >= SEGMENT_AREA:
            raise ValueError("class header leaves no room for data")
        per = SEGMENT_AREA - len(self.class_header)
        self.count = max(1, -(-len(self.data) // per))
        self.pad = self.count * per - len(self.data)
        self.window_last = 1  # the receiver opens the window with its first ACK
        self.last_acked = 0
        self.next_seg = 1
        self.high_sent = 0
        self.tries = 0
        self._start: float | None = None
        self._resp_deadline = 0.0

    @property
    def per_segment(self) -> int:
        return SEGMENT_AREA - len(self.class_header)

    def segment(self, n: int) -> bytes:
        """DATA segment ``n`` (1-based), exactly as sent."""
        if not 1 <= n <= self.count:
            raise ValueError(f"segment {n} not in 1..{self.count}")
        per = self.per_segment
        flags = RmppFlags.ACTIVE
        paylen = 0
        if n == 1:
            flags |= RmppFlags.FIRST
            paylen = self.count * SEGMENT_AREA - self.pad
        if n == self.count:
            flags |= RmppFlags.LAST
            paylen = SEGMENT_AREA - self.pad
        out = bytearray(MAD_SIZE)
        out[:COMMON_HEADER_SIZE] = self.header
        RMPP_HEADER.pack_into(
            out, RMPP_OFFSET, RMPP_VERSION, RmppType.DATA, self.resp_time, flags, 0, n, paylen
        )
        body = RMPP_DATA + len(self.class_header)
        out[RMPP_DATA:body] = self.class_header
        chunk = self.data[(n - 1) * per : n * per]
        out[body : body + len(chunk)] = chunk
        return bytes(out)

    def start(self, now: float) -> list[Action]:
        """Send the first window (one segment: the receiver's ACK opens the rest)."""
        if self._start is not None:
            raise RmppError("sender already started")
        self._start = now
        return self._pump(now)

    def _deadline(self) -> float:
        assert self._start is not None
        return min(self._resp_deadline, self._start + self.total_timeout)

    def _pump(self, now: float) -> list[Action]:
        out: list[Action] = []
        top = min(self.window_last, self.count)
        while self.next_seg <= top:
            out.append(Transmit(self.segment(self.next_seg)))
            self.counters.sent += 1
            self.high_sent = max(self.high_sent, self.next_seg)
            self.next_seg += 1
        if self.next_seg > self.count and self.state is State.SENDING:
            self._move(State.WAIT_LAST_ACK)
        self._resp_deadline = now + self.resp_timeout
        out.append(ArmTimer(self._deadline()))
        return out

    def _abort(self, status: RmppStatus, ref: bytes) -> list[Action]:
        self.status = status
        self._move(State.FAILED)
        base = bytearray(MAD_SIZE)
        base[:COMMON_HEADER_SIZE] = ref[:COMMON_HEADER_SIZE]
        return [Transmit(_control(base, RmppType.ABORT, status)), CancelTimer(), Fail(status, True)]

    def handle(self, mad: Buffer, now: float) -> list[Action]:
        """A MAD of this transaction from the peer (ACK, STOP, ABORT, or DATA of a response)."""
        if self.state not in (State.SENDING, State.WAIT_LAST_ACK):
            self.counters.dropped += 1
            return []
        if len(mad) < RMPP_DATA or not is_rmpp(mad):
            self.counters.malformed += 1
            return []
        self.counters.received += 1
        h = RmppHeader.of(mad)
        if h.type in (RmppType.ABORT, RmppType.STOP):
            return self._fail_remote(h)  # never answered, so two ends cannot loop
        bad = _check_common(h)
        if bad is not None:
            self.counters.malformed += 1
            return self._abort(bad, self.header)
        if h.type == RmppType.DATA:
            if mad[METHOD_BYTE] == self.header[METHOD_BYTE]:
                self.counters.malformed += 1  # DATA in our own direction: not for a sender
                return self._abort(RmppStatus.BAD_TYPE, self.header)
            if self.state is State.WAIT_LAST_ACK and h.segment_number == 1:
                # double-sided: the response's first segment acknowledges the request
                self.status = RmppStatus.NORMAL
                self._move(State.COMPLETE)
                return [CancelTimer(), Complete(switch=True)]
            # a late segment of the other direction (a request we are answering)
            self.counters.dropped += 1
            return []
        return self._ack(h, now)

    def _fail_remote(self, h: RmppHeader) -> list[Action]:
        self.status = _remote_status(h)
        self._move(State.FAILED)
        return [CancelTimer(), Fail(self.status, False)]

    def _ack(self, h: RmppHeader, now: float) -> list[Action]:
        seg, wl = h.segment_number, h.payload_length
        if seg > self.count or seg > self.high_sent:
            self.counters.malformed += 1
            return self._abort(RmppStatus.SEGMENT_TOO_BIG, self.header)
        if wl < seg:
            self.counters.malformed += 1
            return self._abort(RmppStatus.WINDOW_LAST_TOO_SMALL, self.header)
        if seg < self.last_acked or (seg == self.last_acked and wl <= self.window_last):
            self.counters.duplicates += 1
            return []
        self.last_acked = seg
        self.window_last = max(self.window_last, wl)
        self.tries = 0
        if seg == self.count:
            self.status = RmppStatus.NORMAL
            self._move(State.COMPLETE)
            return [CancelTimer(), Complete()]
        if self.state is State.WAIT_LAST_ACK and self.next_seg <= self.count:
            self._move(State.SENDING)
        return self._pump(now)

    def on_timer(self, now: float) -> list[Action]:
        """The deadline from the last :class:`ArmTimer` came: resend, or give up."""
        if self.state not in (State.SENDING, State.WAIT_LAST_ACK) or self._start is None:
            return []
        if now >= self._start + self.total_timeout:
            return self._abort(RmppStatus.TOTAL_TIME_TOO_LONG, self.header)
        if now < self._resp_deadline:
            return [ArmTimer(self._deadline())]
        if self.tries >= self.retries:
            return self._abort(RmppStatus.TOO_MANY_RETRIES, self.header)
        self.tries += 1
        # go back to the first unacknowledged segment
        resend_to = min(self.window_last, self.count, self.next_seg - 1)
        self.counters.resent += resend_to - self.last_acked
        self.next_seg = self.last_acked + 1
        if self.state is State.WAIT_LAST_ACK:
            self._move(State.SENDING)
        return self._pump(now)


# -- receiver -------------------------------------------------------------------


@dataclass
class RmppReceiver(_Machine):
    """Reassembles one message from DATA segments, ACKing each window.

    Created for the first segment of a transaction (the driver keys receivers
    by peer, class and TID); ``class_header_size`` is the class's header
    length repeated per segment (20 for SA).
    """

    class_header_size: int = 0
    window: int = 16
    total_timeout: float = 30.0
    linger: float = 5.0
    max_size: int = 1 << 24
    created: float = 0.0

    def __post_init__(self) -> None:
        self.role = "receiver"
        self.state = State.RECEIVING
        if not 0 <= self.class_header_size < SEGMENT_AREA:
            raise ValueError("class header size out of range")
        if self.window < 1:
            raise ValueError("window must be at least 1")
        self.expected = 1
        self.window_last = 1
        self.total: int | None = None  # PayloadLength of segment 1 (0: not given)
        self.chunks: list[bytes] = []
        self.header = b""
        self.class_header = b""
        self.ref = b""  # common header of the first MAD seen, for ABORTs
        self._deadline = self.created + self.total_timeout

    def _last_ack(self, ref: Buffer) -> bytes:
        seg = self.expected - 1
        return _control(_reply_header(ref), RmppType.ACK, 0, seg, self.window_last)

    def _abort(
        self, status: RmppStatus, ref: Buffer, kind: RmppType = RmppType.ABORT
    ) -> list[Action]:
        self.status = status
        if kind == RmppType.ABORT and status != RmppStatus.TOTAL_TIME_TOO_LONG:
            self.counters.malformed += 1
        self._move(State.FAILED)
        reply = _control(_reply_header(ref), kind, status)
        return [Transmit(reply), CancelTimer(), Fail(status, True)]

    def start(self, now: float) -> list[Action]:
        """Arm the total transaction time-out (call once, before the first ``handle``)."""
        self.created = now
        self._deadline = now + self.total_timeout
        return [ArmTimer(self._deadline)]

    def handle(self, mad: Buffer, now: float) -> list[Action]:
        """A MAD of this transaction from the sender."""
        if self.state in (State.FAILED, State.CLOSED) or len(mad) < RMPP_DATA or not is_rmpp(mad):
            self.counters.dropped += 1
            return []
        self.counters.received += 1
        if not self.ref:
            self.ref = bytes(mad[:COMMON_HEADER_SIZE])
        h = RmppHeader.of(mad)
        bad = _check_common(h)
        if bad is None and h.type == RmppType.ACK:
            bad = RmppStatus.BAD_TYPE  # ACKs go to senders
        if self.state is State.DONE:
            if bad is None and h.type == RmppType.DATA and h.segment_number < self.expected:
                self.counters.duplicates += 1
                return [Transmit(self._last_ack(mad))]
            self.counters.dropped += 1
            return []
        if h.type in (RmppType.ABORT, RmppType.STOP):
            self.status = _remote_status(h)
            self._move(State.FAILED)
            return [CancelTimer(), Fail(self.status, False)]
        if bad is not None:
            return self._abort(bad, mad)
        return self._data(h, mad, now)

    def _data(self, h: RmppHeader, mad: Buffer, now: float) -> list[Action]:
        seg = h.segment_number
        first = bool(h.flags & RmppFlags.FIRST)
        last = bool(h.flags & RmppFlags.LAST)
        if seg == 0 or first != (seg == 1):
            return self._abort(RmppStatus.INCONSISTENT_FIRST_SEGMENT, mad)
        if seg < self.expected:
            self.counters.duplicates += 1
            return [Transmit(self._last_ack(mad))] if self.expected > 1 else []
        if seg > self.window_last:
            return self._abort(RmppStatus.SEGMENT_TOO_BIG, mad)
        if seg > self.expected:
            self.counters.dropped += 1  # a gap: the sender's time-out resends from the hole
            return []
        ch = self.class_header_size
        if first:
            self.total = h.payload_length
            if self.total and self.total // SEGMENT_AREA * (SEGMENT_AREA - ch) > self.max_size:
                return self._abort(RmppStatus.RESOURCES_EXHAUSTED, mad, RmppType.STOP)
            self.header = bytes(mad[:COMMON_HEADER_SIZE])
            self.class_header = bytes(mad[RMPP_DATA : RMPP_DATA + ch])
        if self.total:
            segs = -(-self.total // SEGMENT_AREA)
            if seg > segs or (seg == segs) != last:
                return self._abort(RmppStatus.INCONSISTENT_LAST_LENGTH, mad)
        if last:
            plen = h.payload_length
            ok = ch <= plen <= SEGMENT_AREA and (
                plen > ch or seg == 1  # an empty last segment only for an empty message
            )
            if not ok or (self.total and self.total != (seg - 1) * SEGMENT_AREA + plen):
                return self._abort(RmppStatus.INCONSISTENT_LAST_LENGTH, mad)
            self.chunks.append(bytes(mad[RMPP_DATA + ch : RMPP_DATA + plen]))
        else:
            self.chunks.append(bytes(mad[RMPP_DATA + ch : MAD_SIZE]))
            if len(self.chunks) * (SEGMENT_AREA - ch) > self.max_size:
                return self._abort(RmppStatus.RESOURCES_EXHAUSTED, mad, RmppType.STOP)
        self.expected = seg + 1
        if last:
            self.window_last = max(self.window_last, seg)
            self.status = RmppStatus.NORMAL
            self._move(State.DONE)
            self._deadline = now + self.linger
            msg = Deliver(self.header, self.class_header, b"".join(self.chunks))
            self.chunks = []
            return [Transmit(self._last_ack(mad)), msg, ArmTimer(self._deadline)]
        self._move(State.RECEIVING)
        if seg == self.window_last:
            self.window_last = seg + self.window
            return [Transmit(self._last_ack(mad))]
        return []

    def on_timer(self, now: float) -> list[Action]:
        """Total time-out while receiving (ABORT), or the end of the linger time."""
        if now < self._deadline or self.state in (State.FAILED, State.CLOSED):
            return [] if self.state in (State.FAILED, State.CLOSED) else [ArmTimer(self._deadline)]
        if self.state is State.DONE:
            self._move(State.CLOSED)
            return [CancelTimer()]
        return self._abort(RmppStatus.TOTAL_TIME_TOO_LONG, self.ref or bytes(MAD_SIZE))


def segments_for(size: int, class_header_size: int = 0) -> int:
    """How many segments a ``size``-byte message takes."""
    return max(1, -(-size // (SEGMENT_AREA - class_header_size)))
