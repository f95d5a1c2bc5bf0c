"""What a MAD service is and the pure rules it applies (no I/O, no state).

:class:`MadSvc` describes a service (``ib_mad_svc_t``); the functions check a
description, an element about to be sent, and a MAD that arrived.  Header
fields are read at named offsets of the common MAD header (IBA 13.4.3) and
the RMPP header (13.6.2).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ibal.mad.pool import ElementState, MadElement
from ibal.status import InvalidParameter, InvalidSetting
from ibal.types import MAD_SIZE, OPENIB_OUI, MadAddr, WcStatus, is_int
from ibal.wire.mad.consts import Method, MgmtClass, is_vendor_range2
from ibal.wire.mad.header import header
from ibal.wire.mad.rmpp import RMPP_DATA, is_rmpp

# The common header's fields come from ibal.wire.mad.header's table; the TID's low half (the
# caller's) and the reserved 16 bits are slices the table has no field for.
CLASS = 1
TID_LO = slice(12, 16)
RESERVED = slice(18, 20)
SM_CLASSES = frozenset({MgmtClass.SUBN_LID, MgmtClass.SUBN_DR})
RMPP_CLASSES = frozenset({0x03, 0x06, 0x10, 0x12, *range(0x30, 0x50)})
"""Classes whose MADs carry an RMPP header: SA, DM, device administration, BIS and
vendor range 2 (where a DEFAULT service does RMPP, as IBAL's and Linux's MAD layers do)."""

_TRAP_REPRESS = int(Method.TRAP_REPRESS)
MadCallback = Callable[[MadElement], object]
Taker = Callable[[WcStatus, "MadElement | None"], None]
"""Gets a request's outcome instead of ``send_cb``/``recv_cb``: (status, response)."""


class MadSvcType(enum.IntEnum):
    """``ib_mad_svc_type_t``."""

    DEFAULT = 0
    """Retransmissions, and RMPP for the classes IBA defines with it."""
    RMPP = 1
    """Retransmissions; every MAD carries an RMPP header, RMPP active per send."""
    RAW = 2
    """Neither retransmissions nor RMPP."""


@dataclass(frozen=True)
class MadSvc:
    """``ib_mad_svc_t``: what a service handles and who hears about it.

    ``methods`` are the request methods whose unsolicited MADs reach
    ``recv_cb`` (only with ``support_unsol``; each (class, version, method) has
    one service per port).  ``attributes`` optionally narrows a method to
    attribute IDs: a Get/Set for another attribute is answered "unsupported
    method/attribute" (0x000C) by the service.  ``max_unsolicited`` bounds the
    unsolicited elements the user holds; past it they are dropped and counted
    (responses to this service's requests never are).  ``oui`` is an ibal
    addition (IBAL's MAD layer took every OUI): for a vendor range 2 class
    (0x30..0x4F) the vendor whose requests reach the service, as the class
    header carries it; 0 means OpenIB's 00:14:05, libibumad's default.
    """

    mgmt_class: int
    mgmt_version: int
    recv_cb: MadCallback
    send_cb: MadCallback | None = None
    methods: frozenset[int] = frozenset()
    support_unsol: bool = False
    svc_type: MadSvcType = MadSvcType.DEFAULT
    attributes: Mapping[int, frozenset[int]] | None = None
    max_unsolicited: int = 256
    context: Any = None
    oui: int = 0


class RmppSessions(Protocol):
    """The seam to the RMPP sender/receiver.

    Set ``service.rmpp`` to one; the service then hands it a send whose element
    has ``rmpp_version`` != 0 (:meth:`start`) and every received MAD whose RMPP
    header is active (:meth:`feed`, with its sender), keyed by the transaction
    (peer, TID).  :class:`ibal.mad.rmpp_service.TransferSessions` is the one over
    ``ibal.transport.rmpp``.
    ``send`` puts one segment or ACK on the wire through the service's agent
    (no retries: RMPP times its own).  Whole messages and failures come back
    through the callbacks the sessions object was made with.
    """

    def start(self, key: Hashable, element: MadElement, send: Callable[[bytes], None]) -> None:
        ...

    def feed(
        self, key: Hashable, mad: bytes, addr: MadAddr, send: Callable[[bytes], None]
    ) -> bool: ...


def check_svc(svc: object, qp_num: int) -> MadSvc:
    """``svc`` as a valid description for a service on QP ``qp_num``, else ``InvalidParameter``."""
    if not isinstance(svc, MadSvc):
        raise InvalidParameter("a MadSvc is required")
    if not callable(svc.recv_cb) or (svc.send_cb is not None and not callable(svc.send_cb)):
        raise InvalidParameter("recv_cb and send_cb must be callable")
    if not isinstance(svc.svc_type, MadSvcType):
        raise InvalidParameter("svc_type must be a MadSvcType")
    if (svc.mgmt_class in SM_CLASSES) != (qp_num == 0):
        raise InvalidParameter("subnet management classes on QP0, every other class on QP1")
    if svc.support_unsol and not (svc.mgmt_class and svc.mgmt_version and svc.methods):
        raise InvalidParameter("an unsolicited service needs a class, a version and methods")
    if not is_int(svc.oui) or not 0 <= svc.oui <= 0xFFFFFF:
        raise InvalidParameter("oui must be a 24-bit int")
    if svc.oui and not is_vendor_range2(svc.mgmt_class):
        raise InvalidParameter("only vendor range 2 classes (0x30..0x4f) have an OUI")
    if not is_int(svc.max_unsolicited) or svc.max_unsolicited < 1:
        raise InvalidParameter("max_unsolicited must be a positive int")
    return svc


def svc_oui(svc: MadSvc) -> int:
    """The OUI a vendor range 2 service's requests carry (0: OpenIB's), 0 for other classes."""
    if not is_vendor_range2(svc.mgmt_class):
        return 0
    return svc.oui or OPENIB_OUI


def check_element(e: object, svc: MadSvc) -> MadElement:
    """``e`` as an element ``svc`` may send, else ``InvalidParameter``/``InvalidSetting``."""
    if not isinstance(e, MadElement):
        raise InvalidParameter("send takes MadElements")
    if e.state is not ElementState.USER:
        raise InvalidParameter(f"a MAD element that is {e.state.value} cannot be sent")
    if not isinstance(e.addr, MadAddr):
        raise InvalidParameter("the element has no address (MadElement.addr)")
    if e.rmpp_version not in (0, 1):
        raise InvalidSetting(f"RMPP version {e.rmpp_version} is not supported")
    if e.rmpp_version and svc.svc_type is MadSvcType.RAW:
        raise InvalidSetting("a RAW MAD service does no RMPP")
    if e.size != MAD_SIZE and not e.rmpp_version:
        raise InvalidParameter(f"a MAD without RMPP is {MAD_SIZE} bytes")
    if e.mad[CLASS] != svc.mgmt_class:
        raise InvalidParameter("the MAD's class is not the service's")
    if e.resp_expected and not e.is_response:
        for name, v in (("timeout_ms", e.timeout_ms), ("retry_cnt", e.retry_cnt)):
            if (type(v) is not int and not is_int(v)) or v < 0:
                raise InvalidParameter(f"{name} must be a non-negative int")
        if e.timeout_ms == 0:
            raise InvalidParameter("a request that expects a response needs timeout_ms > 0")
    return e


def malformed(mad: bytes, svc: MadSvc, whole: bool = False) -> str | None:
    """Why a received MAD is dropped, or ``None`` (checks beyond the transport's)."""
    # A reassembled message (``whole``) has its exact length: a short one is under 256.
    if len(mad) < (RMPP_DATA if whole else MAD_SIZE) or (len(mad) != MAD_SIZE and not whole):
        return "dropped_bad_length"
    # BaseVersion, MgmtClass, ClassVersion: the header's first three bytes (every MAD
    # received goes through here: no header object for three bytes).
    if mad[0] != 1:
        return "dropped_bad_base_version"
    if mad[CLASS] != svc.mgmt_class:
        return "dropped_wrong_class"
    if mad[2] != svc.mgmt_version:
        return "dropped_bad_class_version"
    if any(mad[RESERVED]):
        return "dropped_reserved"
    return None


def unserved_attr(mad: bytes, svc: MadSvc) -> bool:
    """Whether ``svc`` narrows the request's method to attributes and this is not one."""
    attrs = svc.attributes
    h = header(mad)
    if not attrs or h.method not in attrs:
        return False
    return h.attr_id not in attrs[h.method]


def rmpp_active(mad: bytes, svc: MadSvc) -> bool:
    """Whether the MAD is an RMPP segment/ACK this service must hand to RMPP."""
    if svc.svc_type is MadSvcType.RAW:
        return False
    if svc.svc_type is MadSvcType.DEFAULT and svc.mgmt_class not in RMPP_CLASSES:
        return False
    return is_rmpp(mad)


def is_response(mad: bytes | bytearray) -> bool:
    """Whether the MAD answers a request (the R bit, or TrapRepress)."""
    if len(mad) < 24:
        header(mad)  # FieldError('short'), as for any header read
    method = mad[3]  # the Method byte of the common header
    return bool(method & 0x80) or method == _TRAP_REPRESS
