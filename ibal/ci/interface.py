"""The channel interface: what a provider implements for each CA (`ci_interface_t`).

One :class:`ChannelInterface` object stands for one CA, as one
``ci_interface_t`` table does in ``ib_ci.h``.  Its methods are the ``ci_*``
verbs with out-parameters turned into return values and ``ib_api_status_t``
returns turned into the exceptions of :mod:`ibal.status`.

Contract, for every verb (the rules the conformance suite checks):

* Handles are opaque objects the provider creates; the access layer never looks
  inside and only passes back handles this provider returned and that are not
  yet destroyed.  A provider should still refuse a foreign or destroyed handle
  with the matching ``INVALID_*_HANDLE`` exception rather than misbehave.
* A verb that fails changes nothing (no half-created object is left behind).
* Optional verbs keep the default implementation here, which raises
  ``Unsupported``; the provider's :class:`Capabilities` must agree.
* Upcalls (completion, async event) may come from any thread, including from
  inside a verb such as ``post_send``.  The access layer queues them: they
  never run consumer code on the provider's stack.  After ``destroy_cq`` /
  ``destroy_qp`` / ``destroy_srq`` / ``close_ca`` returns, the provider makes no
  upcall for that object.
* R_KEYs and L_KEYs are 32-bit integers whose big-endian bytes are what goes on
  the wire; nobody swaps them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, fields
from typing import Any, NamedTuple

from ibal.records import record
from ibal.status import Unsupported
from ibal.types import (
    BASE_WR_TYPES,
    INVALIDATE_WR_TYPES,
    VERBS_VERSION,
    AccessFlags,
    AvAttr,
    BindWr,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    FmrCreate,
    Gid,
    MadAgentSpec,
    MadSend,
    MrAttr,
    MrKeys,
    MrModMask,
    PdType,
    PhysCreate,
    PortAttrMod,
    QpAttr,
    QpCaps,
    QpMod,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    Wc,
    WrType,
)

Handle = Any
"""A provider's opaque handle (CA, PD, AV, QP, CQ, SRQ, MR, MW, multicast)."""

CompletionCallback = Callable[[Any], None]
"""``ci_completion_cb_t``: called with the ``cq_context`` given at ``create_cq``."""

AsyncEventCallback = Callable[[EventRecord], None]
"""``ci_async_event_cb_t``."""


class QpCreated(NamedTuple):
    handle: Handle
    attr: QpAttr


class SrqCreated(NamedTuple):
    handle: Handle
    attr: SrqAttr


class CqCreated(NamedTuple):
    handle: Handle
    size: int


class MwCreated(NamedTuple):
    handle: Handle
    rkey: int


@record(frozen=True)
class Capabilities:
    """What a CA can do, so "not supported" can be told from "broken".

    ``reasons`` says, per capability left out, why (shown in conformance skips,
    in ``Unsupported`` errors of the access layer and in ``ibal info``).  Its
    keys are the field names; for the set-valued fields (``qp_types``,
    ``special_qps``, ``mw_types``, ``opcodes``) the one reason covers every
    member the set leaves out.
    """

    qp_types: frozenset[QpType] = frozenset({QpType.RC, QpType.UC, QpType.UD})
    opcodes: Mapping[QpType, frozenset[WrType]] = field(
        default_factory=lambda: {
            QpType.RC: BASE_WR_TYPES,
            QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE}),
            QpType.UD: frozenset({WrType.SEND}),
        }
    )
    """Per QP type, the opcodes ``post_send`` takes; the default is contract version 1's.
    A CA opts in to ``INVALIDATE_WR_TYPES`` (send with invalidate, local
    invalidate, type 2 bind) by listing them; the AL refuses them otherwise."""
    special_qps: frozenset[QpType] = frozenset()
    atomics: bool = True
    mw_types: frozenset[int] = frozenset({1})
    srq: bool = True
    peek_cq: bool = True
    rearm_n_cq: bool = True
    resize_cq: bool = True
    multicast: bool = True
    phys_mr: bool = False
    shared_mr: bool = False
    """``register_smr``.  ``phys_mr`` covers ``register_pmr`` and ``modify_pmr``."""
    modify_mr: bool = True
    fmr: bool = False
    """The fast-memory-region verbs (``alloc_fmr`` ... ``dealloc_fmr``, the Mellanox
    extension).  Without them the access layer emulates FMRs over register/deregister."""
    local_mad: bool = False
    mad_agents: bool = False
    """The CA sends and receives MADs itself (``register_mad_agent``/``send_mad``):
    its QP0/QP1 belong to someone else (the kernel, via libibumad).  ``False``:
    the access layer owns QP1 (and QP0) through ``create_spl_qp``."""
    vendor_call: bool = False
    violation_counters: bool = False
    port_counters: bool = False
    """``query_port_counters`` answers: named per-port counters (kernel
    ``hw_counters`` names where the meaning is the same, ``drop_<reason>`` for
    packets the CA dropped)."""
    modify_ca: bool = True
    inline_data: bool = True
    immediate: bool = True
    solicited_events: bool = True
    sqd: bool = True
    apm: bool = False
    async_event_injection: bool = False
    resize_qp: bool = False
    """``modify_qp`` takes ``sq_depth``/``rq_depth`` (to RTR and to RTS) and
    resizes the work queues (IBAL's SQ_DEPTH/RQ_DEPTH, verbs'
    ``IBV_DEVICE_RESIZE_MAX_WR``).  Off by default: few CAs can; the access
    layer then refuses those fields with ``Unsupported``."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    deviations: Mapping[str, str] = field(default_factory=dict)
    """Rules this CA is known to break (keys of :data:`KNOWN_DEVIATIONS`), each with
    why.  Not a capability: a CA that declares one is not conformant.  The
    conformance suite still runs the strict check and reports its failure as an
    expected failure (xfail) naming the deviation and this reason."""

    def supports_opcode(self, qp_type: QpType, opcode: WrType) -> bool:
        if opcode.is_atomic and not self.atomics:
            return False
        return opcode in self.opcodes.get(qp_type, frozenset())

    def reason(self, name: str) -> str:
        """Why capability ``name`` (a field name) is missing, for messages."""
        return self.reasons.get(name, f"provider does not declare {name!r}")

    def missing(self) -> dict[str, str]:
        """Every capability that is off, as ``"name"`` or ``"name (no X, Y)"`` -> reason.

        A flag is off when false; a set when it leaves out part of what a
        full-featured CA has (RC/UC/UD, QP0/QP1, window types 1 and 2, the
        default opcodes).
        """
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                if not value:
                    out[f.name] = self.reason(f.name)
                continue
            full = _FULL_SETS.get(f.name)
            if full is None:
                continue
            if f.name == "opcodes":
                left = [
                    f"{t.name}/{op.name}"
                    for t, ops in full.items()
                    for op in sorted(ops)
                    if t in self.qp_types
                    and op not in value.get(t, frozenset())
                    and (self.atomics or not op.is_atomic)  # listed as "atomics" already
                ]
            else:
                left = [m.name if isinstance(m, QpType) else str(m) for m in sorted(full - value)]
            if left:
                out[f"{f.name} (no {', '.join(left)})"] = self.reason(f.name)
        return out

    def deviation(self, rule: str) -> str | None:
        """Why this CA breaks ``rule`` (a key of :data:`KNOWN_DEVIATIONS`), or ``None``."""
        return self.deviations.get(rule)


_FULL_SETS: dict[str, Any] = {
    "qp_types": frozenset({QpType.RC, QpType.UC, QpType.UD}),
    "special_qps": frozenset({QpType.QP0, QpType.QP1}),
    "mw_types": frozenset({1, 2}),
    "opcodes": {
        QpType.RC: BASE_WR_TYPES | INVALIDATE_WR_TYPES,
        QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE, WrType.LOCAL_INV, WrType.BIND_MW}),
        QpType.UD: frozenset({WrType.SEND}),
    },
}


KNOWN_DEVIATIONS: Mapping[str, str] = {
    "precise_local_errors": (
        "local protection and length errors (unknown L_Key, L_Key of another PD, a "
        "deregistered region, a too-small receive) complete with their own IBA status "
        "(LOCAL_PROTECTION_ERR, LOCAL_LEN_ERR), not LOCAL_OP_ERR"
    ),
    "mw_bounds_check": (
        "a remote access through a bound memory window is checked against the window's "
        "own range, not only the region's"
    ),
    "responder_events": (
        "a responder that refuses a request raises WQ_ACCESS_ERROR / WQ_REQ_ERROR on its "
        "QP (IBA 11.6.3.1)"
    ),
    "comm_est": "the first message a QP in RTR receives raises QP_COMM (IBA 11.6.2)",
    "last_wqe_reached": (
        "a QP attached to an SRQ that goes to ERROR raises SRQ_QP_LAST_WQE_REACHED "
        "(IBA 11.6.3.2)"
    ),
    "sqe": (
        "a send error on a UC/UD QP moves it to SQE, where receives go on and "
        "modify SQE -> RTS recovers it (IBA 10.8.3, 11.2.5)"
    ),
    "mw_bind_rkey_index": (
        "a type 2 BIND_MW whose new R_Key changes the window's index (not only its key "
        "byte) completes MEM_WINDOW_BIND_ERR (IBA 10.6.7.2)"
    ),
    "invalidate_nak": (
        "a SEND with invalidate the responder refuses (a key it cannot invalidate) fails at "
        "the sender too, not only the receive (IBA 9.7.5.2.3: NAK invalid request)"
    ),
}
"""The rules a provider may declare in :attr:`Capabilities.deviations`, and what
each says.  Declaring one turns the check's failure into a reported xfail."""


class ChannelInterface(abc.ABC):
    """One CA of a provider: ``ci_interface_t`` as an object.

    Identity attributes (``guid``, ``vendor_id``, ``device_id``,
    ``revision``, ``version``) are read by ``register_ca``; ``name`` is the
    device name users see (``mock0``, ``rxe0``).
    """

    guid: int
    name: str
    vendor_id: int = 0
    device_id: int = 0
    revision: int = 0
    version: int = VERBS_VERSION
    provider_name: str = ""

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this CA supports; constant while it is registered."""

    # ------------------------------------------------------------------ CA access
    @abc.abstractmethod
    def open_ca(
        self,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        ca_context: Any,
    ) -> Handle:
        """`ci_open_ca`: the single open instance; a second open raises ``ResourceBusy``."""

    @abc.abstractmethod
    def query_ca(self, h_ca: Handle) -> CaAttr:
        """`ci_query_ca`."""

    def modify_ca(
        self, h_ca: Handle, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod
    ) -> None:
        """`ci_modify_ca`: ``InvalidPort``, ``InvalidParameter`` for unknown bits,
        ``Unsupported`` for counters the CA lacks."""
        raise Unsupported("modify_ca")

    @abc.abstractmethod
    def close_ca(self, h_ca: Handle) -> None:
        """`ci_close_ca`: ``ResourceBusy`` while any resource remains; no upcall after."""

    def vendor_call(self, h_ca: Handle, handles: Sequence[Handle], op: CiOp) -> CiOp:
        """`ci_vendor_call`: the vendor escape hatch."""
        raise Unsupported("vendor_call")

    # -------------------------------------------------------------------- PD / AV
    @abc.abstractmethod
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        """`ci_allocate_pd`."""

    @abc.abstractmethod
    def deallocate_pd(self, h_pd: Handle) -> None:
        """`ci_deallocate_pd`: ``ResourceBusy`` while QPs, MRs, MWs, AVs or SRQs use it."""

    @abc.abstractmethod
    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        """`ci_create_av`."""

    @abc.abstractmethod
    def query_av(self, h_av: Handle) -> AvAttr:
        """`ci_query_av` (the AL knows the PD)."""

    @abc.abstractmethod
    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        """`ci_modify_av`."""

    @abc.abstractmethod
    def destroy_av(self, h_av: Handle) -> None:
        """`ci_destroy_av`."""

    # ------------------------------------------------------------------------ QP
    @abc.abstractmethod
    def create_qp(
        self,
        h_pd: Handle,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        srq: Handle | None,
        sq_signaled: bool,
        qp_context: Any,
    ) -> QpCreated:
        """`ci_create_qp`: the QP starts in RESET; ``attr.caps`` are the granted sizes."""

    def create_spl_qp(
        self,
        h_pd: Handle,
        port_num: int,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        qp_context: Any,
    ) -> QpCreated:
        """`ci_create_spl_qp`: QP0/QP1/raw on a port; ``ResourceBusy`` if it exists."""
        raise Unsupported("special QPs")

    @abc.abstractmethod
    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        """`ci_modify_qp`: the AL has checked ``mod`` against :mod:`ibal.qp_fsm`."""

    @abc.abstractmethod
    def query_qp(self, h_qp: Handle) -> QpAttr:
        """`ci_query_qp`."""

    @abc.abstractmethod
    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        """`ci_destroy_qp`: outstanding WRs never complete after it returns."""

    # ----------------------------------------------------------------------- SRQ
    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        """`ci_create_srq` (later ``ib_ci.h``)."""
        raise Unsupported("SRQ")

    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        """`ci_modify_srq`."""
        raise Unsupported("SRQ")

    def query_srq(self, h_srq: Handle) -> SrqAttr:
        """`ci_query_srq`."""
        raise Unsupported("SRQ")

    def destroy_srq(self, h_srq: Handle) -> None:
        """`ci_destroy_srq`: ``ResourceBusy`` while QPs use it."""
        raise Unsupported("SRQ")

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        """`ci_post_srq_recv`: raises a :class:`ibal.status.PostError` on failure."""
        raise Unsupported("SRQ")

    # ------------------------------------------------------------------------ CQ
    @abc.abstractmethod
    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        """`ci_create_cq`: the granted size is at least ``size``."""

    def resize_cq(self, h_cq: Handle, size: int) -> int:
        """`ci_resize_cq`: ``Overflow`` if more entries are queued than ``size``."""
        raise Unsupported("resize_cq")

    @abc.abstractmethod
    def query_cq(self, h_cq: Handle) -> int:
        """`ci_query_cq`: the size."""

    @abc.abstractmethod
    def destroy_cq(self, h_cq: Handle) -> None:
        """`ci_destroy_cq`: ``ResourceBusy`` while QPs use it; pending notifications dropped."""

    # ------------------------------------------------------------------------ MR
    @abc.abstractmethod
    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        """`ci_register_mr`: ``buffer`` is the consumer's memory at ``vaddr``."""

    def register_pmr(self, h_pd: Handle, create: PhysCreate, vaddr: int) -> MrKeys:
        """`ci_register_pmr`: ``vaddr`` is a request; the result says what was assigned."""
        raise Unsupported("physical memory registration")

    @abc.abstractmethod
    def query_mr(self, h_mr: Handle) -> MrAttr:
        """`ci_query_mr`."""

    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        """`ci_modify_mr`: re-registration; new keys.  ``ResourceBusy`` with windows bound."""
        raise Unsupported("re-registration")

    def register_smr(
        self, h_mr: Handle, h_pd: Handle, access: AccessFlags, vaddr: int
    ) -> MrKeys:
        """`ci_register_smr`: a second region over ``h_mr``'s pages."""
        raise Unsupported("shared memory regions")

    def modify_pmr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        create: PhysCreate | None,
        vaddr: int,
        h_pd: Handle | None,
    ) -> MrKeys:
        """`ci_modify_pmr` (with ``phys_mr``): re-register ``h_mr`` (virtual or physical)
        as a physical region; new keys.

        ``mask`` ADDR takes ``create``'s pages, page size, length and offset at the
        requested ``vaddr`` (the result says what was assigned); ACCESS takes
        ``create.access``; PD moves it to ``h_pd``.  ``create`` is ``None`` only for
        PD alone.  Any thread, never blocks.  ``ResourceBusy`` with windows bound or
        shared regions, ``InvalidParameter`` for a bad mask, page size or length,
        ``InvalidPermission`` for remote write without local write; on any error
        the region is unchanged.
        """
        raise Unsupported("physical re-registration")

    @abc.abstractmethod
    def deregister_mr(self, h_mr: Handle) -> None:
        """`ci_deregister_mr`: ``ResourceBusy`` with windows bound or shared regions."""

    # ----------------------------------------------------------------------- FMR
    def alloc_fmr(self, h_pd: Handle, create: FmrCreate) -> Handle:
        """`ci_alloc_mlnx_fmr` (optional, with ``fmr``): an FMR on ``h_pd``; maps nothing.

        Any thread, never blocks.  ``InvalidParameter`` for limits the CA cannot
        meet (:func:`ibal.ci.fmr.check_fmr_create`), ``InvalidPermission`` for remote
        write without local write, ``InsufficientResources`` when out of regions.
        """
        raise Unsupported("fast memory regions")

    def map_phys_fmr(self, h_fmr: Handle, pages: Sequence[memoryview], vaddr: int) -> MrKeys:
        """`ci_map_phys_mlnx_fmr`: make ``pages`` (each a buffer of at least the FMR's
        page size, standing for a physical page) one region at ``vaddr`` (0: the CA
        chooses; the result says what was assigned).

        A map while mapped replaces the mapping.  Every map gives new keys: the
        previous mapping's L_Key and R_Key stop working at once.  After
        ``max_maps`` maps without an unmap: ``InsufficientResources``; other
        argument errors as :func:`ibal.ci.fmr.check_fmr_map`.  On error the
        current mapping is unchanged.  ``MrKeys.handle`` is ``h_fmr``.
        """
        raise Unsupported("fast memory regions")

    def unmap_fmr(self, h_fmr: Handle) -> None:
        """`ci_unmap_mlnx_fmr`: drop the mapping (its keys stop working) and reset the
        map count; an FMR that is not mapped is left as it is."""
        raise Unsupported("fast memory regions")

    def dealloc_fmr(self, h_fmr: Handle) -> None:
        """`ci_dealloc_mlnx_fmr`: ``ResourceBusy`` while mapped (unmap first)."""
        raise Unsupported("fast memory regions")

    # ------------------------------------------------------------------------ MW
    def create_mw(self, h_pd: Handle, mw_type: int = 1) -> MwCreated:
        """`ci_create_mw`: the window starts unbound (its R_Key invalid).

        ``mw_type`` 2 (verbs' ``IBV_MW_TYPE_2``) only when ``capabilities.mw_types``
        lists it: such a window is bound by a ``BIND_MW`` work request and
        invalidated by ``LOCAL_INV`` or a peer's ``SEND_WITH_INV``.  The AL
        passes ``mw_type`` only for type 2, so a CA written before it keeps working.
        """
        raise Unsupported("memory windows")

    def query_mw(self, h_mw: Handle) -> int:
        """`ci_query_mw`: the current R_KEY."""
        raise Unsupported("memory windows")

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        """`ci_bind_mw`: posts the bind on ``h_qp``; returns the new R_KEY."""
        raise Unsupported("memory windows")

    def destroy_mw(self, h_mw: Handle) -> None:
        """`ci_destroy_mw`."""
        raise Unsupported("memory windows")

    # ------------------------------------------------------------ post and poll
    @abc.abstractmethod
    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        """`ci_post_send`: raises :func:`ibal.status.post_error` at the first bad WR."""

    @abc.abstractmethod
    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        """`ci_post_recv`."""

    @abc.abstractmethod
    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        """`ci_poll_cq`: up to ``max_entries`` completions in order; ``[]`` when empty."""

    def peek_cq(self, h_cq: Handle) -> int:
        """`ci_peek_cq` (optional)."""
        raise Unsupported("peek_cq")

    @abc.abstractmethod
    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        """`ci_enable_cq_notify`: one callback for the next (solicited) completion."""

    def enable_ncomp_cq_notify(self, h_cq: Handle, n_cqes: int) -> None:
        """`ci_enable_ncomp_cq_notify` (optional)."""
        raise Unsupported("enable_ncomp_cq_notify")

    # ---------------------------------------------------------------- multicast
    def attach_mcast(self, h_qp: Handle, gid: Gid, lid: int) -> Handle:
        """`ci_attach_mcast`."""
        raise Unsupported("multicast")

    def detach_mcast(self, h_mcast: Handle) -> None:
        """`ci_detach_mcast`."""
        raise Unsupported("multicast")

    # --------------------------------------------------------------- local MAD
    def local_mad(self, h_ca: Handle, port_num: int, mad: bytes) -> bytes:
        """`ci_local_mad` (optional): the response to a 256-byte MAD for this port."""
        raise Unsupported("local_mad")

    # ------------------------------------------------------------ counters
    def query_port_counters(self, h_ca: Handle, port_num: int) -> Mapping[str, int]:
        """Named counters of ``port_num`` (optional, with ``port_counters``).

        Any thread; must not block on the data path (a snapshot, not a reset).
        Names follow Linux ``hw_counters`` where the meaning is the same;
        ``InvalidPort`` for a port the CA lacks.
        """
        raise Unsupported("port counters")

    # --------------------------------------------------------- MAD agents (v2)
    def register_mad_agent(self, h_ca: Handle, spec: MadAgentSpec) -> Handle:
        """Register a MAD client on ``spec.port_num``'s QP0/QP1 (only with ``mad_agents``).

        Called on any AL thread; may block briefly.  From then on the provider
        calls ``spec.recv_cb(MadRecv)`` for requests of the class, version and
        methods registered and for responses to this agent's requests, and
        ``spec.send_cb(MadSendDone)`` once per ``send_mad`` (before the response of
        an answered request), from its own thread
        (the AL only queues them).  Raises ``InvalidPort``, ``InvalidParameter``
        (QP number not 0/1, class or version out of range) and ``ResourceBusy``
        (another agent holds one of the class's methods).

        ``spec.rmpp_version`` 1 (an RMPP class: SA, DM, 0x10, 0x12, 0x30..0x4F)
        asks the provider to run RMPP for the agent: a send whose RMPP header
        is active may then be longer than 256 bytes (the provider segments it,
        ACKs and windows), and a received transfer comes to ``recv_cb`` as one
        long MAD (first segment's headers, then every segment's data); raise
        ``Unsupported`` if the provider cannot.
        """
        raise Unsupported("MAD agents")

    def send_mad(self, h_agent: Handle, send: MadSend) -> None:
        """Queue one MAD (the AL checked its size and addressing); never blocks for the wire.

        Longer than 256 bytes only for an agent registered with ``rmpp_version``
        and an active RMPP header (see :meth:`register_mad_agent`).

        For a request the provider stamps the TID's high 32 bits so the
        response is routed back to this agent; with ``send.timeout_ms > 0`` the
        request waits for it (``retries`` re-sends), else ``send_cb`` reports
        ``SUCCESS`` once it left.  ``InvalidHandle`` for an
        unregistered agent, ``InsufficientResources`` when the send queue is full.
        """
        raise Unsupported("MAD agents")

    def send_mad_many(self, h_agent: Handle, sends: Sequence[MadSend]) -> int:
        """Queue several MADs of one agent in order, each as :meth:`send_mad` would
        (optional: the AL loops over ``send_mad`` where this raises ``Unsupported``).

        Called as ``send_mad`` is; never blocks for the wire.  Returns how many
        were queued, from the first: fewer than ``len(sends)`` when one could not
        be (the rest are not sent; the AL reports that one's error by sending it
        alone).  Raises ``send_mad``'s errors only when the first could not be queued.
        One call for a window of MADs spares a provider's per-MAD round trips
        (a foreign call, the GIL).
        """
        raise Unsupported("send_mad_many")

    def unregister_mad_agent(self, h_agent: Handle) -> None:
        """End the agent: sends still waiting complete ``CANCELED`` (``send_cb``, before
        it returns); after it returns no upcall for the agent is made."""
        raise Unsupported("MAD agents")

    # ------------------------------------------------------ testing backdoors
    def inject_async_event(self, record: EventRecord) -> None:
        """Raise an async event on demand (fault injection; optional)."""
        raise Unsupported("async event injection")


MANDATORY_VERBS: tuple[str, ...] = tuple(
    sorted(
        name
        for name, member in vars(ChannelInterface).items()
        if getattr(member, "__isabstractmethod__", False) and name != "capabilities"
    )
)
"""The verbs every provider implements; the rest may raise ``Unsupported``."""
