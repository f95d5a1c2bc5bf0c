"""One SA transaction as a sans-IO machine: request, tries, time-outs, answer.

:class:`SaTxn` never sends, sleeps or reads a clock: its methods take events
(``start(now)``, ``on_timer(now)``, ``on_response(mad)``, ``on_send_failed``,
``cancel()``) and return actions (:class:`SendTry`, :class:`Abandon`,
:class:`ArmTimer`, :class:`Finish`) for the I/O layer (:mod:`ibal.sa.port`) to
carry out.  Each try is a fresh TID: a late answer to a try given up is not
this transaction's (under umad2sim nothing times a request out, so the tries
are timed here, ``timeout_ms`` apart, ``1 + retry_cnt`` of them, then
``TIMEOUT``).

:func:`decode_answer` turns an SA response (a whole, possibly reassembled
MAD) into an :class:`SaAnswer`: the SA's MAD status (non-zero: ``REMOTE_ERROR``),
the records split by the SA header's AttributeOffset, and ``ERROR`` when the
answer is an RMPP transfer cut short (ibsim carries only its first segment:
its RMPP header stays active without the Last flag).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ibal import sansio
from ibal.status import Status
from ibal.wire.fields import Buffer, FieldError
from ibal.wire.mad import header as mad_header
from ibal.wire.mad.consts import MAD_SIZE, Method, MgmtClass
from ibal.wire.mad.rmpp import RMPP_DATA, RmppFlags, RmppHeader

__all__ = [
    "SA_DATA",
    "SA_HEADER_SIZE",
    "Abandon",
    "Action",
    "ArmTimer",
    "Finish",
    "SaAnswer",
    "SaTxn",
    "SendTry",
    "TxnState",
    "build_request",
    "decode_answer",
]

SA_DATA = mad_header.SA_DATA  # 56: records start here
SA_HEADER_SIZE = SA_DATA - RMPP_DATA  # 20: the SA class header (SM_Key, AttributeOffset, mask)
_TABLE_METHODS = frozenset({Method.GET_TABLE_RESP, Method.GET_MULTI_RESP, 0x93})  # 0x93: trace
_SLACK = 1e-9  # a timer armed for a deadline may fire a rounding error before it
_ATTR_OFFSET = SA_DATA - SA_HEADER_SIZE + 8  # 44: AttributeOffset (16 bits) in the SA header
_RMPP_ACTIVE = int(RmppFlags.ACTIVE)  # plain ints: IntFlag arithmetic is slow per MAD
_RMPP_LAST = int(RmppFlags.LAST)
_SA_CLASS = int(MgmtClass.SUBN_ADM)


@dataclass(frozen=True)
class SaAnswer:
    """How an SA request ended (the one shape every ``ibal.sa`` module reads).

    ``status``: ``SUCCESS``, ``TIMEOUT`` (no answer after the tries),
    ``CANCELED``, ``REMOTE_ERROR`` (the SA answered with ``mad_status``),
    ``ERROR`` (the answer was cut: an RMPP transfer that never completed, or a
    MAD that does not read as an SA answer), ``UNSUPPORTED`` (no SA for that
    question on the port).  ``records``: each ``attr_offset * 8`` bytes (the
    whole 200-byte data area for a response without AttributeOffset).
    """

    status: Status
    mad_status: int = 0
    method: int = 0
    attr_id: int = 0
    records: tuple[bytes, ...] = ()
    mad: bytes = b""
    detail: str = ""
    """Why, for a status other than SUCCESS (for messages and logs)."""

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


def build_request(
    method: int, attr_id: int, data: Buffer, comp_mask: int, attr_mod: int, tid: int,
    sm_key: int = 0,
) -> bytearray:
    """The 256-byte SA request (class 0x03, version 2) with ``tid``; ``FieldError`` if a
    field does not fit."""
    return mad_header.build(MgmtClass.SUBN_ADM, method, attr_id, tid=tid, attr_mod=attr_mod,
                            data=data, comp_mask=comp_mask, sm_key=sm_key)  # fmt: skip


@functools.lru_cache(maxsize=256)
def _template(method: int, attr_id: int, data: bytes, comp_mask: int, attr_mod: int) -> bytes:
    """The request with TID 0, encoded (and checked) once per question: a loop asking
    the same question (a benchmark, ``path_records`` over many pairs with one mask)
    patches only the TID of each try."""
    return bytes(build_request(method, attr_id, data, comp_mask, attr_mod, 0))


def _cut(mad: bytes) -> str | None:
    """Why an RMPP answer is incomplete, or ``None`` (whole, or not RMPP at all).

    The MAD service delivers a whole transfer with its RMPP header zero; one that
    still has it active without the Last flag, in one MAD, is a first segment alone.
    """
    flags = mad[26]  # the caller made sure there are SA_DATA bytes
    if not flags & _RMPP_ACTIVE or flags & _RMPP_LAST or len(mad) > MAD_SIZE:
        return None
    h = RmppHeader.of(mad)
    # A sender that leaves segmentation to its kernel (OpenSM) writes only version, DATA
    # and Active: segment 0, PayloadLength 0; our own senders fill them in.
    return (f"the SA's answer is an RMPP transfer cut short: one MAD arrived, without "
            f"the Last flag (segment {h.segment_number}, PayloadLength "
            f"{h.payload_length}); the transport carried no RMPP")


def decode_answer(mad: Buffer) -> SaAnswer:
    """An :class:`SaAnswer` from a whole SA response (a reassembled message may be longer
    than 256 bytes; the records are what its length holds)."""
    raw = mad if type(mad) is bytes else bytes(mad)
    try:
        h = mad_header.header(raw)  # parsed once here, for every answer
    except FieldError as exc:
        return SaAnswer(Status.ERROR, mad=raw, detail=f"not an SA answer: {exc}")
    method, status, attr_id = h.method, h.status, h.attr_id
    if h.mgmt_class != _SA_CLASS or len(raw) < SA_DATA:
        return SaAnswer(Status.ERROR, method=method, attr_id=attr_id, mad=raw,
                        detail="not an SA answer (class or length)")  # fmt: skip
    if status:
        return SaAnswer(Status.REMOTE_ERROR, status, method, attr_id, (), raw,
                        f"the SA answered with MAD status 0x{status:04x}")  # fmt: skip
    cut = _cut(raw)
    if cut is not None:
        return SaAnswer(Status.ERROR, 0, method, attr_id, (), raw, cut)
    step = int.from_bytes(raw[_ATTR_OFFSET : _ATTR_OFFSET + 2], "big") * 8
    data = raw[SA_DATA:]
    if method in _TABLE_METHODS:
        if step == 0:
            records: tuple[bytes, ...] = ()
        else:
            records = tuple(data[i : i + step] for i in range(0, len(data) - step + 1, step))
    else:
        records = (data[:step] if step else data[: MAD_SIZE - SA_DATA],)
    return SaAnswer(Status.SUCCESS, 0, method, attr_id, records, raw)


# ---------------------------------------------------------------- the machine


@dataclass(frozen=True, slots=True)
class SendTry:
    """Put ``mad`` on the wire to the SA: a new try, TID ``tid`` (low 32 bits unique)."""

    tid: int
    mad: bytes
    attempt: int


@dataclass(frozen=True, slots=True)
class Abandon:
    """Stop waiting for the try with TID ``tid`` (cancel its send)."""

    tid: int


@dataclass(frozen=True, slots=True)
class ArmTimer(sansio.ArmTimer):
    """Call ``on_timer`` at clock time ``at`` (``None``: disarm)."""

    at: float | None


@dataclass(frozen=True, slots=True)
class Finish(sansio.Finish):
    """The transaction ended: deliver ``answer`` (exactly once)."""

    answer: SaAnswer


Action = SendTry | Abandon | ArmTimer | Finish


class TxnState(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    DONE = "done"


@dataclass
class SaTxn:
    """One SA request: ``1 + retry_cnt`` tries ``timeout_ms`` apart, each a new TID.

    ``new_tid()`` gives the TIDs (the I/O layer keeps them unique among its
    requests).  Not thread-safe: the I/O layer serialises the events.
    """

    method: int
    attr_id: int
    data: bytes = b""
    comp_mask: int = 0
    attr_mod: int = 0
    timeout_ms: int = 1000
    retry_cnt: int = 3
    new_tid: Callable[[], int] = field(default=lambda: 1, repr=False)
    state: TxnState = TxnState.NEW
    attempts: int = 0
    answer: SaAnswer | None = None
    stale: int = 0
    """Responses that matched no live try (late answers to tries given up)."""
    _tid: int | None = None
    _deadline: float = 0.0
    _template: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int) \
                or self.timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be a positive int, not {self.timeout_ms!r}")
        if isinstance(self.retry_cnt, bool) or not isinstance(self.retry_cnt, int) \
                or self.retry_cnt < 0:
            raise ValueError(f"retry_cnt must be a non-negative int, not {self.retry_cnt!r}")
        # Built once per question (FieldError now, at the caller, for a field that does
        # not fit); a TypeError for an unhashable ``data`` is avoided by bytes().
        self._template = _template(self.method, self.attr_id, bytes(self.data),
                                   self.comp_mask, self.attr_mod)  # fmt: skip

    @property
    def done(self) -> bool:
        return self.state is TxnState.DONE

    @property
    def tid(self) -> int | None:
        """The TID of the try being waited for."""
        return self._tid

    def _try(self, now: float) -> list[Action]:
        self.attempts += 1
        tid = self.new_tid()
        self._tid = tid
        t = self._template
        mad = t[:8] + tid.to_bytes(8, "big") + t[16:]
        self._deadline = now + self.timeout_ms / 1000
        return [SendTry(tid, mad, self.attempts), ArmTimer(self._deadline)]

    def _finish(self, answer: SaAnswer) -> list[Action]:
        out: list[Action] = []
        if self._tid is not None:  # a try still out: its send is stopped
            out.append(Abandon(self._tid))
        self._tid = None
        self.state = TxnState.DONE
        self.answer = answer
        return [*out, ArmTimer(None), Finish(answer)]

    def start(self, now: float) -> list[Action]:
        """Send the first try."""
        if self.state is not TxnState.NEW:
            raise RuntimeError("the transaction has started")
        self.state = TxnState.WAITING
        return self._try(now)

    def on_timer(self, now: float) -> list[Action]:
        """The timer fired: another try, or ``TIMEOUT`` after the last."""
        if self.state is not TxnState.WAITING:
            return []
        if now + _SLACK < self._deadline:
            return [ArmTimer(self._deadline)]
        if self.attempts > self.retry_cnt:
            return self._finish(SaAnswer(
                Status.TIMEOUT, detail=f"no answer from the SA after {self.attempts} tries "
                                       f"of {self.timeout_ms} ms"))  # fmt: skip
        assert self._tid is not None
        return [Abandon(self._tid), *self._try(now)]

    def on_response(self, mad: Buffer) -> list[Action]:
        """A response arrived for one of this transaction's TIDs (low 32 bits compared:
        the transport owns the high half)."""
        if self.state is not TxnState.WAITING or len(mad) < 16 or self._tid is None:
            self.stale += 1
            return []
        if int.from_bytes(mad[12:16], "big") != self._tid & 0xFFFFFFFF:
            self.stale += 1
            return []
        self._tid = None  # answered: nothing to abandon
        return self._finish(decode_answer(mad))

    def on_send_failed(self, tid: int, detail: str) -> list[Action]:
        """The try ``tid`` could not be sent: the transaction fails with ``ERROR`` (a
        retry of a local failure would fail the same way)."""
        if self.state is not TxnState.WAITING or tid != self._tid:
            return []
        self._tid = None
        return self._finish(SaAnswer(Status.ERROR, detail=f"the request was not sent: {detail}"))

    def cancel(self, detail: str = "canceled") -> list[Action]:
        """``CANCELED`` (nothing if it already ended)."""
        if self.state is TxnState.DONE:
            return []
        self.state = TxnState.WAITING
        return self._finish(SaAnswer(Status.CANCELED, detail=detail))

    def resolve(self, answer: SaAnswer) -> list[Action]:
        """End now with ``answer``, found without the wire (RoCE paths, a port gone ...)."""
        if self.state is TxnState.DONE:
            return []
        return self._finish(answer)


class SaRequestLike(Protocol):
    """A request in flight, as its sender keeps it (:class:`ibal.sa.port.SaRequest`)."""

    def cancel(self) -> None: ...


class SaRequester(Protocol):
    """The SA as seen from one port: :class:`ibal.sa.port.SaPort`, or a test's stand-in."""

    @property
    def port_guid(self) -> int: ...

    def request(
        self,
        method: int,
        attr_id: int,
        data: bytes = ...,
        comp_mask: int = ...,
        *,
        attr_mod: int = ...,
        timeout_ms: int = ...,
        retry_cnt: int = ...,
        callback: Callable[[SaAnswer], None] | None = ...,
    ) -> SaRequestLike: ...
