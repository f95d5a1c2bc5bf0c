"""MAD addressing and agents: what the AL and providers exchange per MAD, and header helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ibal.records import record
from ibal.types.address import Grh
from ibal.types.work import WcStatus

MAD_SIZE = 256


QP1_WELL_KNOWN_QKEY = 0x80010000


MAD_HEADER_SIZE = 24
"""The common MAD header: base/class version, class, method, status, TID, attribute."""


def mad_is_response(mad: bytes | bytearray | memoryview) -> bool:
    """Whether a MAD answers a request (R bit in the method, or TrapRepress)."""
    method = mad[3]
    return bool(method & 0x80) or method == 0x07


MAD_STATUS_BAD_VERSION = 0x0004
"""MAD status: the class (or its class version) is not supported here."""
MAD_STATUS_UNSUPPORTED_METHOD = 0x0008
"""MAD status: the class is supported, the method is not."""
MAD_STATUS_UNSUPPORTED_METHOD_ATTR = 0x000C
"""MAD status: the method is supported, not with this attribute."""


def mad_error_reply(mad: bytes | bytearray | memoryview, status: int) -> bytes | None:
    """The GetResp a management agent owes an unserved Get/Set request, else ``None``.

    Only Get and Set requests are answered (responses, traps, Sends and the
    other methods are not); the reply keeps the request's TID and attribute and
    carries ``status``.  Directed-route SMPs (class 0x81) get none here: their
    reply needs the path reversed, which is the SMA's job.
    """
    if len(mad) < MAD_HEADER_SIZE or mad[3] not in (0x01, 0x02) or mad[1] == 0x81:
        return None
    reply = bytearray(mad)
    reply[3] = 0x81
    reply[4:6] = status.to_bytes(2, "big")
    return bytes(reply)


@record(frozen=True)
class MadAddr:
    """Where a MAD goes (send) or came from (receive): ``ib_mad_addr`` as a record.

    On a receive, ``dlid`` is the sender's LID, ``remote_qp`` its QP and
    ``grh.dgid`` its GID, so the record addresses the reply as it stands.
    """

    remote_qp: int = 1
    remote_qkey: int = QP1_WELL_KNOWN_QKEY
    dlid: int = 0
    sl: int = 0
    path_bits: int = 0
    pkey_index: int = 0
    grh: Grh | None = None


@record(frozen=True)
class MadSend:
    """One MAD to send through a MAD agent.

    ``mad`` is exactly :data:`MAD_SIZE` bytes.  For a request (no R bit) the
    transport owns the high 32 bits of the TID: it writes the agent's id
    there, so the response comes back to this agent.  A request with
    ``timeout_ms > 0`` waits for its response (matched by the TID's low 32
    bits), re-sent up to ``retries`` times; only then is a response delivered
    (as the kernel's MAD layer does).  ``context`` comes back in the
    :class:`MadSendDone`.  ``quiet`` (an ibal extension, for a datagram that
    waits for nothing: ``timeout_ms`` 0) says nobody listens for its
    :class:`MadSendDone`: the AL's special-QP transport reports none (no hand-off
    to the completion queue per send); where the kernel owns QP1 one may come.
    """

    mad: bytes
    addr: MadAddr
    timeout_ms: int = 0
    retries: int = 0
    context: Any = None
    quiet: bool = False


@record(frozen=True)
class MadSendDone:
    """How a send ended, once per send.

    ``SUCCESS``: on the wire (``timeout_ms == 0``) or answered (reported
    before the response's ``recv_cb``, as IBAL orders them);
    ``TIMEOUT_RETRY_ERR``: no response after the retries; ``CANCELED``: the
    agent went away first; other statuses: the send failed locally.
    """

    context: Any
    status: WcStatus = WcStatus.SUCCESS


@record(frozen=True)
class MadRecv:
    """A MAD that reached an agent: the bytes, who sent it, on which port and QP."""

    mad: bytes
    addr: MadAddr
    port_num: int
    qp_num: int


MadRecvCallback = Callable[[MadRecv], object]
MadSendCallback = Callable[[MadSendDone], object]


@record(frozen=True)
class MadAgentSpec:
    """What ``register_mad_agent`` takes: one MAD client of a port's QP0 or QP1.

    Requests (no R bit) of ``mgmt_class``/``class_version`` whose method is
    in ``methods`` reach ``recv_cb``; so do responses to the requests this
    agent sent (matched by the TID's high 32 bits).  ``methods`` may be empty
    (an agent that only sends requests).  ``rmpp_version`` 0 means the caller
    does RMPP itself (segments pass through unchanged).  ``oui``: for a vendor
    range 2 class (0x30..0x4F) only the requests whose class header carries
    this OUI (bytes 37..39) reach the agent, 0 meaning OpenIB's
    (:data:`OPENIB_OUI`, what libibumad's ``umad_register`` uses); it must be 0
    for every other class.
    ``recv_batch_cb`` (optional): the provider may hand several received MADs
    of the agent over in one call, in arrival order, instead of one
    ``recv_cb`` each.
    """

    port_num: int
    qp_num: int
    mgmt_class: int
    class_version: int
    recv_cb: MadRecvCallback
    send_cb: MadSendCallback | None = None
    methods: frozenset[int] = frozenset()
    rmpp_version: int = 0
    oui: int = 0
    recv_batch_cb: Callable[[Sequence[MadRecv]], object] | None = None
    send_cb_any_thread: bool = False
    """``send_cb`` only queues the report: a transport may call it on any thread, even
    inside ``send`` (the AL's queued agents); otherwise only on the transport's own."""

    @property
    def vendor_oui(self) -> int:
        """The OUI requests must carry to reach the agent (0: the class has none)."""
        if not VENDOR_RANGE2_FIRST <= self.mgmt_class <= VENDOR_RANGE2_LAST:
            return 0
        return self.oui or OPENIB_OUI


VENDOR_RANGE2_FIRST, VENDOR_RANGE2_LAST = 0x30, 0x4F
"""Vendor management classes whose MADs carry an OUI (IBA 13.4.4)."""
OPENIB_OUI = 0x001405
"""OpenIB's OUI: libibumad registers vendor range 2 classes under it by default."""
VENDOR_OUI = slice(37, 40)
"""Where a vendor range 2 MAD carries its OUI (after the RMPP header and a reserved byte)."""


def mad_vendor_oui(mad: bytes | bytearray) -> int:
    """The OUI a MAD is routed by: bytes 37..39 for vendor range 2 classes, else 0."""
    if not VENDOR_RANGE2_FIRST <= mad[1] <= VENDOR_RANGE2_LAST:
        return 0
    return int.from_bytes(mad[VENDOR_OUI], "big")
