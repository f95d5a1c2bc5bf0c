"""Service registration (``ib_reg_svc`` / ``ib_dereg_svc``): ServiceRecords kept at the SA.

``register_service(al, name=, service_id=, ...)`` Sets a ServiceRecord at the
SA through the port that has the service GID and returns a
:class:`ServiceRegistration` at once.  The registration keeps the record
alive: a finite lease is renewed at half of it, a failed renewal is reported
and retried, and the record is Set again when the SM asks the port's clients
to re-register (PnP ``CLIENT_REREGISTER``) or the SM changes.  ``dereg()``
Deletes it; closing the AL does too.  The logic is the sans-IO
:class:`~ibal.sa.service_fsm.ServiceLease`; this module feeds it the SA's
answers, the AL's timers and PnP events.

The callback ``callback(RegSvcRec)`` (``ib_pfn_reg_svc_cb_t``) runs on the
AL's misc queue and must not block: once with the registration's outcome
(``req_status`` ``SUCCESS``, ``TIMEOUT``, ``CANCELED``, or ``REMOTE_ERROR``
with the SA's MAD status in ``resp_status``), then whenever a renewal or
re-registration fails, and when one succeeds after a failure.  A first Set
that fails ends the registration (as in IBAL: there is nothing to keep).
``wait()`` and ``await`` give the first outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from ibal.al import AccessLayer, Dependent, PnpClass, PnpEvent, PnpRec, call_user, in_callback
from ibal.sa.service_fsm import (
    INFINITE_LEASE,
    Action,
    ArmTimer,
    Attempt,
    CancelRequest,
    Deliver,
    Finish,
    ServiceLease,
    Transmit,
)
from ibal.sa.txn import SaRequester
from ibal.sa.waitable import FirstOutcome
from ibal.status import (
    IbError,
    InvalidGid,
    InvalidHandle,
    InvalidParameter,
    InvalidState,
    Status,
    error_class,
)
from ibal.types import ZERO_GID, Gid, is_int
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

if TYPE_CHECKING:

    from ibal.al import DestroyCallback, PnpRegistration, Timer
    from ibal.sa.txn import SaAnswer

__all__ = [
    "INFINITE_LEASE",
    "Attempt",
    "RegSvcFlags",
    "RegSvcRec",
    "RegSvcReq",
    "ServiceRecord",
    "ServiceRegistration",
    "dereg_svc",
    "reg_svc",
    "register_service",
    "service_mask",
]

NAME_SIZE: Final = 64
KEY_SIZE: Final = 16
log = logging.getLogger("ibal.sa")

_COUNTS: Final = {8: 16, 16: 8, 32: 4, 64: 2}
_REREGISTER_EVENTS: Final = frozenset({PnpEvent.CLIENT_REREGISTER, PnpEvent.SM_CHANGE})


class RegSvcFlags(enum.IntFlag):
    """``ib_al_flags_t`` for ``ib_reg_svc_req_t.flags``."""

    NONE = 0
    SYNC = 0x00000001
    """Return only after the callback with the registration's outcome ran."""


def _gid(value: object) -> Gid:
    try:
        return value if isinstance(value, Gid) else Gid(value)
    except (ValueError, TypeError):
        raise InvalidParameter(f"{value!r} is not a GID") from None


@dataclass(frozen=True)
class ServiceRecord:
    """``ib_service_record_t`` (IBA 15.2.5.14); ``encode``/``decode`` use
    ``ibal.wire.mad.sa``'s table.

    ``service_name`` is up to 64 bytes (NUL-padded on the wire; :attr:`name`
    reads it as text); ``service_lease`` is in seconds, ``INFINITE_LEASE``
    for none; ``data8``..``data64`` are the ServiceData arrays.
    """

    service_id: int = 0
    service_gid: Gid = ZERO_GID
    service_p_key: int = 0xFFFF
    service_lease: int = INFINITE_LEASE
    service_key: bytes = bytes(KEY_SIZE)
    service_name: bytes = b""
    data8: tuple[int, ...] = (0,) * 16
    data16: tuple[int, ...] = (0,) * 8
    data32: tuple[int, ...] = (0,) * 4
    data64: tuple[int, ...] = (0,) * 2

    @property
    def name(self) -> str:
        """``service_name`` up to its first NUL, as UTF-8 text."""
        return self.service_name.split(b"\0", 1)[0].decode("utf-8", "replace")

    def encode(self) -> bytes:
        """The 176-byte wire form (``InvalidParameter`` for a value that does not fit)."""
        if len(self.service_name) > NAME_SIZE or len(self.service_key) > KEY_SIZE:
            raise InvalidParameter("service_name is at most 64 bytes, service_key 16")
        values: dict[str, Any] = {
            "service_id": self.service_id,
            "service_gid": _gid(self.service_gid).packed,
            "service_p_key": self.service_p_key,
            "service_lease": self.service_lease,
            "service_key": bytes(self.service_key).ljust(KEY_SIZE, b"\0"),
            "service_name": bytes(self.service_name).ljust(NAME_SIZE, b"\0"),
        }
        for bits, count in _COUNTS.items():
            arr = getattr(self, f"data{bits}")
            if len(arr) != count:
                raise InvalidParameter(f"data{bits} has {count} elements")
            for i, v in enumerate(arr):
                values[f"service_data{bits}_{i}"] = v
        try:
            return SERVICE_RECORD.encode(values)
        except (ValueError, TypeError) as exc:
            raise InvalidParameter(str(exc)) from None

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> ServiceRecord:
        d = SERVICE_RECORD.decode(buf)
        name = bytes(d["service_name"])
        return cls(
            service_id=int(d["service_id"]),
            service_gid=Gid(bytes(d["service_gid"])),
            service_p_key=int(d["service_p_key"]),
            service_lease=int(d["service_lease"]),
            service_key=bytes(d["service_key"]),
            service_name=name.rstrip(b"\0"),
            **{
                f"data{bits}": tuple(int(d[f"service_data{bits}_{i}"])
                                     for i in range(count))
                for bits, count in _COUNTS.items()
            },
        )  # fmt: skip


_BASE_COMPONENTS: Final = ("service_id", "service_gid", "service_p_key", "service_name")


def service_mask(*, lease: bool = True, key: bool = False, data: tuple[str, ...] = ()) -> int:
    """The component mask of a registration: ID, GID, P_Key, name, and the lease
    (``lease``), the key (``key``) and the ServiceData elements named
    ``"data8_0"``..``"data64_1"`` (``data``)."""
    names = list(_BASE_COMPONENTS)
    if lease:
        names.append("service_lease")
    if key:
        names.append("service_key")
    names += [f"service_{d}" for d in data]
    try:
        return component_mask(SERVICE_RECORD, names)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None


@dataclass
class RegSvcRec:
    """``ib_reg_svc_rec_t``: what the callback gets."""

    svc_context: Any
    reg: ServiceRegistration | None
    """``h_reg_svc``: the registration (``None`` when it failed and is gone)."""
    req_status: Status
    resp_status: int
    """The SA's MAD status (with ``REMOTE_ERROR``), else 0."""
    svc_rec: ServiceRecord
    attempt: Attempt = Attempt.REGISTER
    """ibal: which Set this outcome is for (register, renew, re-register)."""

    @property
    def ok(self) -> bool:
        return self.req_status is Status.SUCCESS

    def raise_for_status(self) -> None:
        """Raise the status's exception unless it is ``SUCCESS``."""
        if self.req_status is not Status.SUCCESS:
            extra = f" (SA MAD status 0x{self.resp_status:04x})" if self.resp_status else ""
            raise error_class(self.req_status)(
                f"service {self.svc_rec.name!r} {self.attempt.value}: "
                f"{self.req_status.name}{extra}"
            )


RegSvcCallback = Callable[[RegSvcRec], object]


@dataclass
class RegSvcReq:
    """``ib_reg_svc_req_t``; ``svc_data_mask`` is the Set's whole component mask."""

    svc_rec: ServiceRecord
    port_guid: int | None = None
    """The port to register through; ``None``/0: the port that has ``svc_rec.service_gid``."""
    timeout_ms: int = 1000
    retry_cnt: int = 3
    flags: RegSvcFlags = RegSvcFlags.NONE
    svc_context: Any = None
    svc_data_mask: int = field(default_factory=service_mask)
    pfn_reg_svc_cb: RegSvcCallback | None = None
    renew: bool = True
    """ibal's addition: renew a finite lease (IBAL lets it run out: ``False``)."""


class _Requester(SaRequester, Protocol):
    """What a registration needs of :class:`~ibal.sa.port.SaPort` (a fake in unit tests)."""

    def close(self) -> None: ...


class ServiceRegistration(Dependent):
    """A ServiceRecord kept at the SA (``ib_reg_svc_handle_t``); see the module docstring.

    A child of its AL: ``al.close()`` deregisters it.  ``destroy_cb(context)``
    runs once, after the last callback, once the Delete was answered (or
    gave up).
    """

    _kind = "service registration"

    def __init__(
        self,
        al: AccessLayer,
        sa: _Requester,
        record: ServiceRecord,
        comp_mask: int,
        *,
        callback: RegSvcCallback | None = None,
        context: Any = None,
        timeout_ms: int = 1000,
        retry_cnt: int = 3,
        renew: bool = True,
        destroy_cb: DestroyCallback | None = None,
    ) -> None:
        try:
            if callback is not None and not callable(callback):
                raise InvalidParameter("callback must be callable")
            if not (is_int(timeout_ms) and timeout_ms > 0 and is_int(retry_cnt)
                    and retry_cnt >= 0):  # fmt: skip
                raise InvalidParameter("timeout_ms > 0 and retry_cnt >= 0 are ints")
            if not is_int(comp_mask) or not 0 <= comp_mask < 1 << 64:
                raise InvalidParameter("the component mask is a 64-bit int")
            self._machine = ServiceLease(record.encode(), comp_mask, renew=bool(renew))
        except BaseException:
            sa.close()
            raise
        self.sa = sa
        self.port_guid = sa.port_guid
        self._callback = callback
        self._timeout_ms = timeout_ms
        self._retry_cnt = retry_cnt
        self._feed_lock = threading.Lock()
        self._inbox: deque[Callable[[float], list[Action]]] = deque()
        self._feeding = False
        self._requests: dict[int, Any] = {}  # token -> the SaRequest in flight
        self._timer: Timer | None = None
        self._pnp: PnpRegistration | None = None
        self._first: FirstOutcome[RegSvcRec] = FirstOutcome("outcome", _checked)
        self._pin: contextlib.AbstractContextManager[None] | None = None
        self.stats = {"set": 0, "delete": 0}
        """Requests sent: Sets (register, renew, re-register) and Deletes."""
        self.deleted: Status | None = None
        """The status of the Delete sent on deregistration (``None``: none, or not yet)."""
        self.deleted_mad_status = 0
        """The SA's MAD status for that Delete (with ``REMOTE_ERROR``)."""
        self.record = record
        """The record as the SA last answered it (its ServiceKey zeroed by OpenSM)."""
        try:
            # An SaPort that goes (its CA withdrawn) takes the registration along.
            uses = (sa,) if isinstance(sa, Dependent) else ()
            super().__init__(al, context=context, destroy_cb=destroy_cb, uses=uses)
        except BaseException:
            sa.close()
            raise
        # IBAL holds a reference while the Delete is in flight: the destroy completes
        # (destroy callback, al.close() returning) only once the SA answered it.
        self._pin = self.use()
        self._pin.__enter__()
        try:
            self._pnp = al.reg_pnp(PnpClass.PORT, self._on_pnp)
        except IbError:
            self.destroy()
            raise
        self._feed(self._machine.start)

    def __repr__(self) -> str:
        return (f"<ServiceRegistration {self.record.name!r} 0x{self.record.service_id:016x} "
                f"{self._machine.phase.value}>")  # fmt: skip

    # ------------------------------------------------------------------ public
    @property
    def expires(self) -> float | None:
        """When (on the AL's clock) the SA forgets the record unless renewed; ``None``:
        never, or not registered."""
        return self._machine.expires

    @property
    def renew_at(self) -> float | None:
        """When the next renewal (or retry) goes out, if one is armed."""
        return self._machine.renew_at

    def wait(self, timeout: float | None = None) -> RegSvcRec:
        """Block for the first outcome (after the callback ran); raise its status's error
        unless ``SUCCESS``.  ``InvalidState`` on an AL callback thread."""
        if self._first.value is None and in_callback():
            raise InvalidState("ServiceRegistration.wait blocks: not on the AL's threads")
        return self._first.wait(timeout)

    def __await__(self) -> Generator[Any, None, RegSvcRec]:
        return self._first.__await__()

    def dereg(
        self,
        destroy_cb: DestroyCallback | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_dereg_svc``: Delete the record; ``destroy_cb(context)`` once it is done.

        ``wait=True`` blocks until then (not on an AL callback thread: the
        SA's answer comes through one).  ``InvalidHandle`` if already deregistered.
        """
        if wait and in_callback():
            raise InvalidState("dereg(wait=True) waits for the SA's answer: not on AL threads")
        self.destroy(destroy_cb, wait=wait, timeout=timeout)

    # ------------------------------------------------------------------ the machine
    def _now(self) -> float:
        return self.al.timers.clock.now()

    def _feed(self, event: Callable[[float], list[Action]]) -> None:
        """Run ``event`` on the machine, one event at a time across threads (an event
        raised while one runs -- e.g. an answer delivered inline -- is queued behind it)."""
        with self._feed_lock:
            self._inbox.append(event)
            if self._feeding:
                return
            self._feeding = True
        while True:
            with self._feed_lock:
                if not self._inbox:
                    self._feeding = False
                    return
                ev = self._inbox.popleft()
            try:
                for action in ev(self._now()):
                    self._do(action)
            except Exception:  # keep feeding: a broken action must not wedge the machine
                log.exception("ibal: service registration %r", self)

    def _do(self, a: Action) -> None:
        if isinstance(a, Transmit):
            self._send(a)
        elif isinstance(a, CancelRequest):
            req = self._requests.pop(a.token, None)
            if req is not None:
                with contextlib.suppress(IbError):
                    req.cancel()
        elif isinstance(a, ArmTimer):
            self._arm(a.at)
        elif isinstance(a, Deliver):
            self._report(a)
        elif isinstance(a, Finish):
            self._finished(a)

    def _send(self, a: Transmit) -> None:
        token = a.token
        self.stats["set" if a.method == Method.SET else "delete"] += 1

        def answered(ans: SaAnswer) -> None:
            self._requests.pop(token, None)
            record = ans.records[0] if ans.records else None
            self._feed(lambda now: self._machine.answer(token, ans.status, ans.mad_status,
                                                        record, now))  # fmt: skip

        try:
            req = self.sa.request(a.method, SaAttr.SERVICE_RECORD, a.record, a.comp_mask,
                                  timeout_ms=self._timeout_ms, retry_cnt=self._retry_cnt,
                                  callback=answered)  # fmt: skip
        except IbError as exc:  # the SA port is gone (closing AL, port removed)
            status = exc.status if isinstance(exc.status, Status) else Status.ERROR
            self._feed(lambda now: self._machine.answer(token, status, 0, None, now))
            return
        self._requests[token] = req
        if getattr(req, "done", False):  # answered already (on another thread)
            self._requests.pop(token, None)

    def _arm(self, at: float | None) -> None:
        t, self._timer = self._timer, None
        if t is not None:
            t.cancel()
        if at is None:
            return
        with contextlib.suppress(IbError):  # dying: its timers are refused
            self._timer = self.call_later(max(at - self._now(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._feed(self._machine.timer)

    def _on_pnp(self, rec: PnpRec) -> None:
        if rec.event in _REREGISTER_EVENTS and rec.guid == self.port_guid:
            self._feed(self._machine.reregister)

    def _report(self, a: Deliver) -> None:
        record = ServiceRecord.decode(a.record)
        if a.status is Status.SUCCESS:
            self.record = record
        first = self._first.value is None
        rec = RegSvcRec(
            svc_context=self.context,
            reg=self if a.status is Status.SUCCESS or not first else None,
            req_status=a.status, resp_status=a.mad_status, svc_rec=record, attempt=a.attempt,
        )  # fmt: skip
        # Straight on the misc queue (not post_callback): a CANCELED outcome comes while
        # the registration is dying; the pin keeps the destroy callback behind it.
        self.al.manager.queues.misc.post(self._deliver, rec, first)

    def _deliver(self, rec: RegSvcRec, first: bool) -> None:
        if self._callback is not None:
            call_user(self._callback, rec)
        if first:
            self._first.set(rec)

    def _finished(self, a: Finish) -> None:
        self.deleted, self.deleted_mad_status = a.deleted, a.mad_status
        self._arm(None)
        if self.alive:  # the first Set failed: the registration ends by itself
            with contextlib.suppress(IbError):
                self.destroy()
        # After the reports queued before it: the destroy callback follows them.
        self.al.manager.queues.misc.post(self._unpin)

    def _unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.__exit__(None, None, None)

    # ------------------------------------------------------------------ Dependent hooks
    def on_destroying(self) -> None:
        pnp, self._pnp = self._pnp, None
        if pnp is not None:
            with contextlib.suppress(IbError):
                pnp.dereg()
        self._feed(self._machine.stop)

    def cleanup(self) -> None:
        with contextlib.suppress(IbError):
            self.sa.close()


def _checked(rec: RegSvcRec) -> RegSvcRec:
    rec.raise_for_status()
    return rec


# ---------------------------------------------------------------------- entry points
def _open_port(al: AccessLayer, port_guid: int | None, gid: Gid | None) -> tuple[Any, Gid]:
    """The SaPort to register through and the service GID (checked against the port)."""
    from ibal.sa.port import SaPort

    if not isinstance(al, AccessLayer):
        raise InvalidParameter("the first argument is an AccessLayer")
    if port_guid is not None and not is_int(port_guid):
        raise InvalidParameter("port_guid is an int")
    if gid is not None and gid != ZERO_GID and not port_guid:
        port_guid = al.get_port_by_gid(gid)  # NotFound: no local CA has the GID
    sa = SaPort.open(al, port_guid or None)  # InvalidGuid: no such port
    try:
        gids = [g for g in sa.ca.query_port(sa.port_num).gids if g != ZERO_GID]
        if gid is None or gid == ZERO_GID:
            if not gids:
                raise InvalidGid(f"port 0x{sa.port_guid:016x} has no GID")
            gid = gids[0]
        elif gid not in gids:
            raise InvalidGid(f"port 0x{sa.port_guid:016x} does not have GID {gid}")
    except BaseException:
        sa.close()
        raise
    return sa, gid


def register_service(
    al: AccessLayer,
    *,
    name: str | bytes,
    service_id: int,
    gid: Gid | str | None = None,
    port_guid: int | None = None,
    p_key: int = 0xFFFF,
    lease: int | None = None,
    key: bytes | None = None,
    data: Mapping[str, int] | None = None,
    callback: RegSvcCallback | None = None,
    context: Any = None,
    timeout_ms: int = 1000,
    retry_cnt: int = 3,
    renew: bool = True,
    destroy_cb: DestroyCallback | None = None,
) -> ServiceRegistration:
    """Register service ``name``/``service_id`` at the SA; returns at once.

    ``gid``: the service's GID (default: GID 0 of ``port_guid``, or of the
    first active port); the registration goes through the port that has it
    (``NotFound`` if no local port does, ``InvalidGid`` if ``port_guid``'s
    port does not).  ``lease``: seconds (``None``: infinite), renewed at half
    of it unless ``renew=False``.  ``data``: ServiceData elements by name, ``{"data8_0": 7,
    "data64_1": ...}``; only those given (and the name, ID, GID, P_Key,
    lease, and ``key`` if given) are in the component mask.  ``wait()`` /
    ``await`` give the outcome; ``callback(RegSvcRec)`` gets it and later
    renewal failures (see the module docstring).
    """
    raw_name = name.encode() if isinstance(name, str) else bytes(name)
    values: dict[str, int] = dict(data or {})
    arrays = {bits: [0] * count for bits, count in _COUNTS.items()}
    for k, v in values.items():
        bits, _, idx = k.removeprefix("data").partition("_")
        if not (bits.isdigit() and int(bits) in arrays and idx.isdigit()
                and int(idx) < len(arrays[int(bits)])):  # fmt: skip
            raise InvalidParameter(f"no ServiceData element {k!r} (data8_0 .. data64_1)")
        if not is_int(v):
            raise InvalidParameter(f"{k} is an int")
        arrays[int(bits)][int(idx)] = v
    if lease is not None and (not is_int(lease) or not 0 < lease <= INFINITE_LEASE):
        raise InvalidParameter("lease is a number of seconds, 1 .. 0xFFFFFFFF")
    if not is_int(service_id):
        raise InvalidParameter("service_id is an int")
    want = None if gid is None else _gid(gid)
    sa, service_gid = _open_port(al, port_guid, want)
    try:
        record = ServiceRecord(
            service_id=service_id, service_gid=service_gid, service_p_key=p_key,
            service_lease=INFINITE_LEASE if lease is None else lease,
            service_key=b"" if key is None else bytes(key), service_name=raw_name,
            data8=tuple(arrays[8]), data16=tuple(arrays[16]), data32=tuple(arrays[32]),
            data64=tuple(arrays[64]),
        )  # fmt: skip
        mask = service_mask(lease=True, key=key is not None, data=tuple(values))
    except BaseException:
        sa.close()
        raise
    # The registration owns the port's hold from here (closed with it, or on failure).
    return ServiceRegistration(
        al, sa, record, mask, callback=callback, context=context, timeout_ms=timeout_ms,
        retry_cnt=retry_cnt, renew=renew, destroy_cb=destroy_cb,
    )  # fmt: skip


def reg_svc(al: AccessLayer, req: RegSvcReq) -> ServiceRegistration:
    """``ib_reg_svc(h_al, p_reg_svc_req, ph_reg_svc)``: the registration; with
    ``RegSvcFlags.SYNC`` it returns after the callback with the outcome ran."""
    if not isinstance(req, RegSvcReq) or not isinstance(req.svc_rec, ServiceRecord):
        raise InvalidParameter("reg_svc takes a RegSvcReq with a ServiceRecord")
    if not isinstance(req.flags, int) or int(req.flags) & ~int(RegSvcFlags.SYNC):
        raise InvalidParameter(f"unknown flags {req.flags!r}")
    if req.flags & RegSvcFlags.SYNC and in_callback():
        raise InvalidState("a SYNC reg_svc waits for the SA's answer: not on AL threads")
    gid = _gid(req.svc_rec.service_gid)
    sa, service_gid = _open_port(al, req.port_guid, gid)
    record = req.svc_rec
    if record.service_gid != service_gid:
        record = dataclasses.replace(record, service_gid=service_gid)
    reg = ServiceRegistration(
        al, sa, record, req.svc_data_mask, callback=req.pfn_reg_svc_cb,
        context=req.svc_context, timeout_ms=req.timeout_ms, retry_cnt=req.retry_cnt,
        renew=req.renew,
    )  # fmt: skip
    if req.flags & RegSvcFlags.SYNC:
        reg._first.arrived()
    return reg


def dereg_svc(
    reg: ServiceRegistration, destroy_cb: DestroyCallback | None = None, *, wait: bool = False
) -> None:
    """``ib_dereg_svc(h_reg_svc, pfn_destroy_cb)``."""
    if not isinstance(reg, ServiceRegistration):
        raise InvalidHandle("expected a service registration handle")
    reg.dereg(destroy_cb, wait=wait)
