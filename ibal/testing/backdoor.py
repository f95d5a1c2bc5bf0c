"""Backdoors: see what the access layer asks of a provider without using the API under test.

* :class:`TracingCi` wraps a provider's :class:`~ibal.ci.ChannelInterface`,
  forwards every verb unchanged and records the call (so a check can see that a
  cascade destroyed children before parents, or find the context the access
  layer gave the provider for a QP and raise an event with it).
* :class:`FabricRegistrar` sits between a provider and an ``AlManager``: it
  remembers every CA the provider announced, optionally wraps it in a
  :class:`TracingCi`, and lets a check withdraw and re-announce a CA (hot-plug).
* :class:`CollectingRegistrar` takes the CAs without any access layer, for the
  checks that talk to a provider's channel interface directly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ibal.ci import (
    AsyncEventCallback,
    Capabilities,
    CaRegistrar,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
    Handle,
    MwCreated,
    QpCreated,
    SrqCreated,
)
from ibal.status import NotFound
from ibal.types import (
    AccessFlags,
    AvAttr,
    BindWr,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    FmrCreate,
    Gid,
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
)

__all__ = ["Call", "CollectingRegistrar", "FabricRegistrar", "TracingCi"]


@dataclass(frozen=True)
class Call:
    """One verb the access layer made: its name, arguments, result and thread."""

    name: str
    args: tuple[Any, ...]
    result: Any
    error: BaseException | None
    thread: int


class TracingCi(ChannelInterface):
    """A channel interface forwarding to ``inner`` that records every verb call.

    ``version`` may be overridden to present a contract version the access
    layer must refuse.
    """

    def __init__(self, inner: ChannelInterface, *, version: int | None = None) -> None:
        self.inner = inner
        self.guid = inner.guid
        self.name = inner.name
        self.vendor_id = inner.vendor_id
        self.device_id = inner.device_id
        self.revision = inner.revision
        self.version = inner.version if version is None else version
        self.provider_name = inner.provider_name
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self.ca_context: Any = None
        self.completion_cb: CompletionCallback | None = None
        self.async_event_cb: AsyncEventCallback | None = None
        self.qp_contexts: dict[int, Any] = {}
        self.cq_contexts: list[Any] = []
        self.srq_contexts: list[Any] = []

    # ------------------------------------------------------------- recording
    def _fwd(self, name: str, *args: Any) -> Any:
        try:
            result = getattr(self.inner, name)(*args)
        except BaseException as exc:
            self._record(Call(name, args, None, exc, threading.get_ident()))
            raise
        self._record(Call(name, args, result, None, threading.get_ident()))
        return result

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def succeeded(self, *names: str) -> list[Call]:
        """The successful calls of the verbs ``names`` (all verbs if none), in order."""
        with self._lock:
            return [c for c in self.calls if c.error is None and (not names or c.name in names)]

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    # ---------------------------------------------------------------- CA
    def open_ca(
        self,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        ca_context: Any,
    ) -> Handle:
        self.ca_context = ca_context
        self.completion_cb = completion_cb
        self.async_event_cb = async_event_cb
        return self._fwd("open_ca", completion_cb, async_event_cb, ca_context)

    def query_ca(self, h_ca: Handle) -> CaAttr:
        result: CaAttr = self._fwd("query_ca", h_ca)
        return result

    def modify_ca(
        self, h_ca: Handle, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod
    ) -> None:
        self._fwd("modify_ca", h_ca, port_num, ca_mod, port_attr_mod)

    def close_ca(self, h_ca: Handle) -> None:
        self._fwd("close_ca", h_ca)

    def vendor_call(self, h_ca: Handle, handles: Sequence[Handle], op: CiOp) -> CiOp:
        result: CiOp = self._fwd("vendor_call", h_ca, handles, op)
        return result

    # ---------------------------------------------------------- PD / AV
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        return self._fwd("allocate_pd", h_ca, pd_type)

    def deallocate_pd(self, h_pd: Handle) -> None:
        self._fwd("deallocate_pd", h_pd)

    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        return self._fwd("create_av", h_pd, attr)

    def query_av(self, h_av: Handle) -> AvAttr:
        result: AvAttr = self._fwd("query_av", h_av)
        return result

    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        self._fwd("modify_av", h_av, attr)

    def destroy_av(self, h_av: Handle) -> None:
        self._fwd("destroy_av", h_av)

    # ---------------------------------------------------------------- QP
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
        result: QpCreated = self._fwd(
            "create_qp", h_pd, qp_type, caps, send_cq, recv_cq, srq, sq_signaled, qp_context
        )
        with self._lock:
            self.qp_contexts[result.attr.qp_num] = qp_context
        return result

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
        result: QpCreated = self._fwd(
            "create_spl_qp", h_pd, port_num, qp_type, caps, send_cq, recv_cq, qp_context
        )
        with self._lock:
            self.qp_contexts[result.attr.qp_num] = qp_context
        return result

    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        result: QpAttr = self._fwd("modify_qp", h_qp, mod)
        return result

    def query_qp(self, h_qp: Handle) -> QpAttr:
        result: QpAttr = self._fwd("query_qp", h_qp)
        return result

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        self._fwd("destroy_qp", h_qp, timewait_us)

    # --------------------------------------------------------------- SRQ
    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        result: SrqCreated = self._fwd("create_srq", h_pd, attr, srq_context)
        with self._lock:
            self.srq_contexts.append(srq_context)
        return result

    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        self._fwd("modify_srq", h_srq, attr, mask)

    def query_srq(self, h_srq: Handle) -> SrqAttr:
        result: SrqAttr = self._fwd("query_srq", h_srq)
        return result

    def destroy_srq(self, h_srq: Handle) -> None:
        self._fwd("destroy_srq", h_srq)

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        self._fwd("post_srq_recv", h_srq, wrs)

    # ---------------------------------------------------------------- CQ
    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        result: CqCreated = self._fwd("create_cq", h_ca, size, cq_context)
        with self._lock:
            self.cq_contexts.append(cq_context)
        return result

    def resize_cq(self, h_cq: Handle, size: int) -> int:
        result: int = self._fwd("resize_cq", h_cq, size)
        return result

    def query_cq(self, h_cq: Handle) -> int:
        result: int = self._fwd("query_cq", h_cq)
        return result

    def destroy_cq(self, h_cq: Handle) -> None:
        self._fwd("destroy_cq", h_cq)

    # ---------------------------------------------------------------- MR
    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        result: MrKeys = self._fwd("register_mr", h_pd, buffer, vaddr, access)
        return result

    def register_pmr(self, h_pd: Handle, create: PhysCreate, vaddr: int) -> MrKeys:
        result: MrKeys = self._fwd("register_pmr", h_pd, create, vaddr)
        return result

    def query_mr(self, h_mr: Handle) -> MrAttr:
        result: MrAttr = self._fwd("query_mr", h_mr)
        return result

    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        result: MrKeys = self._fwd("modify_mr", h_mr, mask, buffer, vaddr, access, h_pd)
        return result

    def register_smr(self, h_mr: Handle, h_pd: Handle, access: AccessFlags, vaddr: int) -> MrKeys:
        result: MrKeys = self._fwd("register_smr", h_mr, h_pd, access, vaddr)
        return result

    def modify_pmr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        create: PhysCreate | None,
        vaddr: int,
        h_pd: Handle | None,
    ) -> MrKeys:
        result: MrKeys = self._fwd("modify_pmr", h_mr, mask, create, vaddr, h_pd)
        return result

    def deregister_mr(self, h_mr: Handle) -> None:
        self._fwd("deregister_mr", h_mr)

    # ---------------------------------------------------------------- FMR
    def alloc_fmr(self, h_pd: Handle, create: FmrCreate) -> Handle:
        return self._fwd("alloc_fmr", h_pd, create)

    def map_phys_fmr(self, h_fmr: Handle, pages: Sequence[memoryview], vaddr: int) -> MrKeys:
        result: MrKeys = self._fwd("map_phys_fmr", h_fmr, pages, vaddr)
        return result

    def unmap_fmr(self, h_fmr: Handle) -> None:
        self._fwd("unmap_fmr", h_fmr)

    def dealloc_fmr(self, h_fmr: Handle) -> None:
        self._fwd("dealloc_fmr", h_fmr)

    # ---------------------------------------------------------------- MW
    def create_mw(self, h_pd: Handle, mw_type: int = 1) -> MwCreated:
        args = (h_pd,) if mw_type == 1 else (h_pd, mw_type)  # old CAs take no type
        result: MwCreated = self._fwd("create_mw", *args)
        return result

    def query_mw(self, h_mw: Handle) -> int:
        result: int = self._fwd("query_mw", h_mw)
        return result

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        result: int = self._fwd("bind_mw", h_mw, h_qp, bind)
        return result

    def destroy_mw(self, h_mw: Handle) -> None:
        self._fwd("destroy_mw", h_mw)

    # -------------------------------------------------------- post / poll
    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        self._fwd("post_send", h_qp, wrs)

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        self._fwd("post_recv", h_qp, wrs)

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        # Not recorded: polling is the hot path and says nothing about ordering.
        return self.inner.poll_cq(h_cq, max_entries)

    def peek_cq(self, h_cq: Handle) -> int:
        return self.inner.peek_cq(h_cq)

    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        self._fwd("enable_cq_notify", h_cq, solicited)

    def enable_ncomp_cq_notify(self, h_cq: Handle, n_cqes: int) -> None:
        self._fwd("enable_ncomp_cq_notify", h_cq, n_cqes)

    # ------------------------------------------------------ multicast, MAD
    def attach_mcast(self, h_qp: Handle, gid: Gid, lid: int) -> Handle:
        return self._fwd("attach_mcast", h_qp, gid, lid)

    def detach_mcast(self, h_mcast: Handle) -> None:
        self._fwd("detach_mcast", h_mcast)

    def local_mad(self, h_ca: Handle, port_num: int, mad: bytes) -> bytes:
        result: bytes = self._fwd("local_mad", h_ca, port_num, mad)
        return result

    def inject_async_event(self, record: EventRecord) -> None:
        self.inner.inject_async_event(record)


class FabricRegistrar:
    """The registrar a provider is started with in the suite: forwards to ``target``.

    With ``trace=True`` every CA reaches the access layer wrapped in a
    :class:`TracingCi` (``traced[guid]``).  ``raw[guid]`` is the provider's
    own object, kept so a check can withdraw a CA and announce it again.
    """

    def __init__(self, target: CaRegistrar, *, trace: bool = False) -> None:
        self.target = target
        self.trace = trace
        self.raw: dict[int, ChannelInterface] = {}
        self.traced: dict[int, TracingCi] = {}
        self.present: set[int] = set()
        self._lock = threading.Lock()

    def register_ca(self, ci: ChannelInterface) -> None:
        announced: ChannelInterface = ci
        if self.trace and isinstance(ci, ChannelInterface):
            announced = TracingCi(ci)
        self.target.register_ca(announced)
        with self._lock:
            self.raw[ci.guid] = ci
            if isinstance(announced, TracingCi):
                self.traced[ci.guid] = announced
            self.present.add(ci.guid)

    def deregister_ca(self, guid: int) -> None:
        with self._lock:
            if guid not in self.present:
                # withdrawn by a check already; the provider is catching up
                if guid in self.raw:
                    return
                raise NotFound(f"CA {guid:#x} was never registered")
            self.present.discard(guid)
        self.target.deregister_ca(guid)

    def reannounce(self, guid: int) -> None:
        """Register the provider's CA ``guid`` again after a check withdrew it."""
        self.register_ca(self.raw[guid])


class CollectingRegistrar:
    """Takes a provider's CAs with no access layer behind it (direct CI checks).

    With ``probe=True`` it calls ``open_ca``/``query_ca``/``allocate_pd`` on
    each CA before ``register_ca`` returns and releases them again (ci-contract
    rule 3); ``probe_errors`` keeps what failed.
    """

    def __init__(self, *, probe: bool = False) -> None:
        self.cis: dict[int, ChannelInterface] = {}
        self.probe = probe
        self.probe_errors: list[BaseException] = []
        self.probed: list[int] = []

    def register_ca(self, ci: ChannelInterface) -> None:
        if self.probe:
            try:
                h_ca = ci.open_ca(lambda ctx: None, lambda rec: None, "probe")
                attr = ci.query_ca(h_ca)
                h_pd = ci.allocate_pd(h_ca, PdType.NORMAL)
                ci.deallocate_pd(h_pd)
                ci.close_ca(h_ca)
                self.probed.append(attr.ca_guid)
            except Exception as exc:
                self.probe_errors.append(exc)
        self.cis[ci.guid] = ci

    def deregister_ca(self, guid: int) -> None:
        if self.cis.pop(guid, None) is None:
            raise NotFound(f"CA {guid:#x} was never registered")
