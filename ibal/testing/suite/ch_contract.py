"""Chapter: the channel-interface contract itself, with no access layer in between.

These checks call a provider's :class:`~ibal.ci.ChannelInterface` directly, for
the rules the access layer hides from consumers (single open instance,
``ResourceBusy`` on parents with children, handle validation by the provider).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import (
    Error,
    IbError,
    InsufficientResources,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqSize,
    InvalidFmrHandle,
    InvalidMaxWrs,
    InvalidMrHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidQpHandle,
    InvalidQpState,
    PostError,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.backdoor import CollectingRegistrar
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, CallbackLog, active_port, wait_until
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require, require_qp_type
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AvAttr,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    FmrCreate,
    Gid,
    MrModMask,
    PdType,
    PhysCreate,
    PortAttr,
    PortAttrMod,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    SrqAttr,
    UdDest,
    Wc,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.ci import ChannelInterface, CqCreated, Provider, QpCreated


def address_of(buf: bytearray) -> int:
    """The real address of a bytearray's storage (what the AL passes as ``vaddr``)."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class RawCa:
    """One CI opened directly; remembers what it created and tears it down in reverse."""

    def __init__(self, ci: ChannelInterface) -> None:
        self.ci = ci
        self.completions = CallbackLog()
        self.events = CallbackLog()
        self.h = ci.open_ca(self.completions, self.events, "ca-context")
        self.attr: CaAttr = ci.query_ca(self.h)
        port = active_port(self.attr.ports)
        if port is None:
            pytest.fail(f"CA {ci.name} has no ACTIVE port")
        self.port: PortAttr = port
        self._undo: list[Callable[[], None]] = []
        self._keep: list[Any] = []

    def later(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def pd(self, pd_type: PdType = PdType.NORMAL) -> Any:
        h = self.ci.allocate_pd(self.h, pd_type)
        self.later(lambda: self.ci.deallocate_pd(h))
        return h

    def cq(self, size: int = 32, context: Any = "cq-context") -> CqCreated:
        created = self.ci.create_cq(self.h, size, context)
        self.later(lambda: self.ci.destroy_cq(created.handle))
        return created

    def qp(
        self,
        h_pd: Any,
        qp_type: QpType,
        h_cq: Any,
        caps: QpCaps | None = None,
        context: Any = "qp-context",
    ) -> QpCreated:
        created = self.ci.create_qp(
            h_pd, qp_type, caps or QpCaps(), h_cq, h_cq, None, True, context
        )
        self.later(lambda: self.ci.destroy_qp(created.handle))
        return created

    def mr(self, h_pd: Any, buf: bytearray, access: AccessFlags = AccessFlags.LOCAL_WRITE) -> Any:
        self._keep.append(buf)
        keys = self.ci.register_mr(h_pd, memoryview(buf), address_of(buf), access)
        self.later(lambda: self.ci.deregister_mr(keys.handle))
        return keys

    def ud_ready(self, h_qp: Any) -> None:
        """RESET → INIT → RTR → RTS for a UD QP on the active port."""
        self.ci.modify_qp(
            h_qp, QpMod(QpState.INIT, pkey_index=0, port_num=self.port.port_num, qkey=UD_QKEY)
        )
        self.ci.modify_qp(h_qp, QpMod(QpState.RTR))
        self.ci.modify_qp(h_qp, QpMod(QpState.RTS, sq_psn=0))

    def rc_ready(self, h_qp: Any, dest_qp: int) -> None:
        """RESET → INIT → RTR → RTS for an RC QP towards ``dest_qp`` on the same port."""
        ci, port = self.ci, self.port
        access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
        ci.modify_qp(h_qp, QpMod(QpState.INIT, pkey_index=0, port_num=port.port_num, access=access))
        ci.modify_qp(
            h_qp,
            QpMod(
                QpState.RTR,
                primary_av=self.av_attr(),
                path_mtu=port.active_mtu,
                dest_qp=dest_qp,
                rq_psn=0,
                resp_res=1,
                rnr_nak_timeout=1,
            ),
        )
        ci.modify_qp(
            h_qp,
            QpMod(
                QpState.RTS,
                sq_psn=0,
                local_ack_timeout=14,
                retry_cnt=7,
                rnr_retry_cnt=7,
                init_depth=1,
            ),
        )

    def av_attr(self, port_num: int | None = None) -> AvAttr:
        grh = None
        if self.port.link_layer.name == "ETHERNET" and self.port.gids:
            from ibal.types import Grh

            grh = Grh(dgid=self.port.gids[0])
        return AvAttr(
            port_num=self.port.port_num if port_num is None else port_num,
            dlid=self.port.lid,
            grh=grh,
        )

    def poll(self, h_cq: Any, count: int = 1) -> list[Wc]:
        got: list[Wc] = []

        def more() -> bool:
            got.extend(self.ci.poll_cq(h_cq, count - len(got)))
            return len(got) >= count

        wait_until(more, f"{count} completion(s) on a raw CQ")
        return got

    def close(self) -> None:
        for fn in reversed(self._undo):
            with contextlib.suppress(IbError):  # the check destroyed it already
                fn()
        self._undo.clear()
        with contextlib.suppress(InvalidCaHandle):
            self.ci.close_ca(self.h)


# Errors a CA that has the verb may give the probe's arbitrary (but valid) arguments.
_PROBE_REFUSALS: dict[str, tuple[type[IbError], ...]] = {
    "local_mad": (InvalidParameter,),
    "vendor_call": (InvalidParameter, Error),  # rule 32: a command it lacks fails, IB_ERROR
}

# Capabilities whose verb a check can call with little set-up, and how.
_CAPABILITY_PROBES: dict[str, str] = {
    "peek_cq": "peek_cq",
    "rearm_n_cq": "enable_ncomp_cq_notify",
    "resize_cq": "resize_cq",
    "srq": "create_srq",
    "phys_mr": "register_pmr",
    "shared_mr": "register_smr",
    "modify_mr": "modify_mr",
    "fmr": "alloc_fmr",
    "local_mad": "local_mad",
    "port_counters": "query_port_counters",
    "vendor_call": "vendor_call",
    "mw_types": "create_mw",
    "modify_ca": "modify_ca",
    "special_qps": "create_spl_qp",
    "multicast": "attach_mcast",
    "async_event_injection": "inject_async_event",
    "sqd": "modify_qp to SQD",
}


class ContractChecks(ConformanceBase):
    chapter = "provider contract (direct CI)"

    @pytest.fixture
    def raw(self, raw_cis: list[ChannelInterface]) -> Iterator[RawCa]:
        """The first CA of the provider opened directly."""
        ca = RawCa(raw_cis[0])
        try:
            yield ca
        finally:
            ca.close()

    @rules("ci:3")
    def test_ci_registration_accepts_reentrant_calls(
        self, provider_factory: Callable[[], Provider]
    ) -> None:
        """ci-contract rule 3: verbs called before register_ca returns (open, query, PD) succeed."""
        registrar = CollectingRegistrar(probe=True)
        provider = provider_factory()
        provider.start(registrar)
        try:
            assert not registrar.probe_errors, registrar.probe_errors
            assert sorted(registrar.probed) == sorted(registrar.cis)
        finally:
            provider.stop()

    @rules("ci:15")
    def test_ci_second_open_raises_resource_busy(self, raw: RawCa) -> None:
        """ci-contract rule 15: a second ci_open_ca on an open CA → IB_RESOURCE_BUSY."""
        with pytest.raises(ResourceBusy):
            raw.ci.open_ca(lambda c: None, lambda r: None, "second")

    @rules("ci:11", "ci:16")
    def test_ci_open_again_after_close(self, raw_cis: list[ChannelInterface]) -> None:
        """ci-contract rules 11, 16: ci_open_ca gives a handle, and succeeds again once ci_close_ca
        returned."""
        ci = raw_cis[0]
        h = ci.open_ca(lambda c: None, lambda r: None, 1)
        ci.close_ca(h)
        h2 = ci.open_ca(lambda c: None, lambda r: None, 2)
        assert ci.query_ca(h2).ca_guid == ci.guid
        ci.close_ca(h2)

    @rules("ci:13")
    def test_ci_open_without_callbacks_raises_invalid_parameter(
        self, raw_cis: list[ChannelInterface]
    ) -> None:
        """ci-contract rule 13: ci_open_ca without the completion or async callback →
        IB_INVALID_PARAMETER."""
        ci = raw_cis[0]
        with pytest.raises(InvalidParameter):
            ci.open_ca(None, lambda r: None, None)  # type: ignore[arg-type]
        with pytest.raises(InvalidParameter):
            ci.open_ca(lambda c: None, None, None)  # type: ignore[arg-type]
        h = ci.open_ca(lambda c: None, lambda r: None, None)  # nothing was left open
        ci.close_ca(h)

    @rules("ci:33")
    def test_ci_allocate_pd_on_closed_ca_raises_invalid_ca_handle(
        self, raw_cis: list[ChannelInterface]
    ) -> None:
        """ci-contract rule 33: ci_allocate_pd with a closed CA handle → IB_INVALID_CA_HANDLE."""
        ci = raw_cis[0]
        h = ci.open_ca(lambda c: None, lambda r: None, None)
        ci.close_ca(h)
        with pytest.raises(InvalidCaHandle):
            ci.allocate_pd(h, PdType.NORMAL)

    @rules("ci:17")
    def test_ci_close_twice_raises_invalid_ca_handle(self, raw_cis: list[ChannelInterface]) -> None:
        """ci-contract rule 17: ci_close_ca on a closed handle → IB_INVALID_CA_HANDLE."""
        ci = raw_cis[0]
        h = ci.open_ca(lambda c: None, lambda r: None, None)
        ci.close_ca(h)
        with pytest.raises(InvalidCaHandle):
            ci.close_ca(h)

    @rules("ci:24")
    def test_ci_query_closed_ca_raises_invalid_ca_handle(
        self, raw_cis: list[ChannelInterface]
    ) -> None:
        """ci-contract rule 24: ci_query_ca with a closed handle → IB_INVALID_CA_HANDLE."""
        ci = raw_cis[0]
        h = ci.open_ca(lambda c: None, lambda r: None, None)
        ci.close_ca(h)
        with pytest.raises(InvalidCaHandle):
            ci.query_ca(h)

    @rules("ci:18")
    def test_ci_close_with_pd_raises_resource_busy(self, raw: RawCa) -> None:
        """ci-contract rule 18: ci_close_ca while a PD is allocated → IB_RESOURCE_BUSY, CA stays
        open."""
        raw.pd()
        with pytest.raises(ResourceBusy):
            raw.ci.close_ca(raw.h)
        assert raw.ci.query_ca(raw.h).ca_guid == raw.ci.guid

    @rules("ci:35")
    def test_ci_allocate_pd_accepts_every_type(self, raw: RawCa) -> None:
        """ci-contract rule 35: every ib_pd_type_t value is accepted (the type is a hint)."""
        for pd_type in PdType:
            raw.pd(pd_type)

    @rules("ci:36")
    def test_ci_deallocate_busy_pd_raises_resource_busy(self, raw: RawCa) -> None:
        """ci-contract rule 36: deallocating a PD with an MR → IB_RESOURCE_BUSY; the PD stays
        usable."""
        h_pd = raw.pd()
        raw.mr(h_pd, bytearray(64))
        with pytest.raises(ResourceBusy):
            raw.ci.deallocate_pd(h_pd)
        raw.mr(h_pd, bytearray(64))  # still usable

    @rules("ci:37")
    def test_ci_deallocate_pd_twice_raises_invalid_pd_handle(self, raw: RawCa) -> None:
        """ci-contract rule 37: a freed PD handle → IB_INVALID_PD_HANDLE."""
        h_pd = raw.ci.allocate_pd(raw.h, PdType.NORMAL)
        raw.ci.deallocate_pd(h_pd)
        with pytest.raises(InvalidPdHandle):
            raw.ci.deallocate_pd(h_pd)

    @rules("ci:43")
    def test_ci_destroy_av_twice_raises_invalid_av_handle(self, raw: RawCa) -> None:
        """ci-contract rule 43: after ci_destroy_av, the handle → IB_INVALID_AV_HANDLE."""
        h_pd = raw.pd()
        h_av = raw.ci.create_av(h_pd, raw.av_attr())
        assert raw.ci.query_av(h_av).dlid == raw.port.lid
        raw.ci.destroy_av(h_av)
        with pytest.raises(InvalidAvHandle):
            raw.ci.query_av(h_av)
        with pytest.raises(InvalidAvHandle):
            raw.ci.destroy_av(h_av)

    @rules("ci:39")
    def test_ci_create_av_bad_port_eager_or_deferred(self, raw: RawCa) -> None:
        """ci-contract rule 39: a bad AV port → IB_INVALID_PORT now, or IB_WCS_LOCAL_OP_ERR when
        used."""
        caps = raw.ci.capabilities
        h_pd = raw.pd()
        bad = raw.attr.num_ports + 1
        if QpType.UD not in caps.qp_types:
            # No UD send can ever use the AV, so a deferred refusal would never show.
            with pytest.raises(InvalidPort):
                raw.ci.create_av(h_pd, raw.av_attr(port_num=bad))
            return
        try:
            h_av = raw.ci.create_av(h_pd, raw.av_attr(port_num=bad))
        except InvalidPort:
            return  # eager validation
        raw.later(lambda: raw.ci.destroy_av(h_av))
        cq = raw.cq()
        qp = raw.qp(h_pd, QpType.UD, cq.handle)
        raw.ud_ready(qp.handle)
        buf = bytearray(64)
        keys = raw.mr(h_pd, buf)
        raw.ci.post_send(
            qp.handle,
            [
                SendWr(
                    wr_id=7,
                    sg_list=[Sge(keys.vaddr, 8, keys.lkey)],
                    ud=UdDest(av=h_av, remote_qp=qp.attr.qp_num, remote_qkey=UD_QKEY),
                )
            ],
        )
        (wc,) = raw.poll(cq.handle)
        assert (wc.wr_id, wc.status) == (7, WcStatus.LOCAL_OP_ERR)

    @rules("ci:50")
    def test_ci_create_qp_starts_in_reset(self, raw: RawCa) -> None:
        """ci-contract rule 50: create_qp gives a QP number, granted sizes ≥ asked, state RESET."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        asked = QpCaps(sq_depth=8, rq_depth=8, sq_sge=1, rq_sge=1)
        qp = raw.qp(h_pd, qp_type, cq.handle, asked)
        assert qp.attr.state is QpState.RESET
        assert qp.attr.qp_type is qp_type
        assert 1 < qp.attr.qp_num < 1 << 24
        assert qp.attr.caps.sq_depth >= 8 and qp.attr.caps.rq_depth >= 8
        assert raw.ci.query_qp(qp.handle).state is QpState.RESET

    @rules("ci:46", "ci:49")
    def test_ci_failed_create_qp_leaves_nothing(self, raw: RawCa) -> None:
        """ci-contract rules 46, 49: too deep a QP → IB_INVALID_MAX_WRS and no QP left on the PD."""
        h_pd = raw.ci.allocate_pd(raw.h, PdType.NORMAL)
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        with pytest.raises(InvalidMaxWrs):
            raw.ci.create_qp(
                h_pd,
                qp_type,
                QpCaps(sq_depth=raw.attr.max_wrs + 1),
                cq.handle,
                cq.handle,
                None,
                True,
                None,
            )
        raw.ci.deallocate_pd(h_pd)  # not busy: nothing was created

    @rules("ci:59")
    def test_ci_modify_qp_returns_new_state(self, raw: RawCa) -> None:
        """ci-contract rule 59: after a successful modify_qp, query_qp reports the requested
        state."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        qp = raw.qp(h_pd, qp_type, cq.handle)
        port_num = raw.port.port_num
        if qp_type.is_datagram:
            mod = QpMod(QpState.INIT, pkey_index=0, port_num=port_num, qkey=UD_QKEY)
        else:
            mod = QpMod(
                QpState.INIT, pkey_index=0, port_num=port_num, access=AccessFlags.LOCAL_WRITE
            )
        attr = raw.ci.modify_qp(qp.handle, mod)
        assert attr.state is QpState.INIT
        q = raw.ci.query_qp(qp.handle)
        assert (q.state, q.port_num) == (QpState.INIT, port_num)
        if qp_type.is_datagram:
            assert q.qkey == UD_QKEY
        else:
            assert q.access == AccessFlags.LOCAL_WRITE

    @rules("ci:60", "ci:64")
    def test_ci_destroyed_qp_raises_invalid_qp_handle(self, raw: RawCa) -> None:
        """ci-contract rules 60, 64: a destroyed QP handle → IB_INVALID_QP_HANDLE."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        created = raw.ci.create_qp(h_pd, qp_type, QpCaps(), cq.handle, cq.handle, None, True, None)
        raw.ci.destroy_qp(created.handle)
        with pytest.raises(InvalidQpHandle):
            raw.ci.query_qp(created.handle)
        with pytest.raises(InvalidQpHandle):
            raw.ci.destroy_qp(created.handle)

    @rules("ci:90")
    def test_ci_post_send_in_reset_raises_invalid_qp_state(self, raw: RawCa) -> None:
        """ci-contract rule 90: the provider refuses sends in RESET with pp_failed at the first
        WR."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        qp = raw.qp(h_pd, qp_type, cq.handle)
        buf = bytearray(16)
        keys = raw.mr(h_pd, buf)
        with pytest.raises(InvalidQpState) as info:
            raw.ci.post_send(qp.handle, [SendWr(sg_list=[Sge(keys.vaddr, 4, keys.lkey)])])
        assert isinstance(info.value, PostError) and info.value.failed_index == 0

    @rules("ci:93")
    def test_ci_post_recv_in_reset_raises_invalid_qp_state(self, raw: RawCa) -> None:
        """ci-contract rule 93: the provider refuses receives in RESET with pp_failed at the
        first WR (the access layer's own check must not be the only one)."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        qp = raw.qp(h_pd, qp_type, cq.handle)
        buf = bytearray(256)
        keys = raw.mr(h_pd, buf)
        with pytest.raises(InvalidQpState) as info:
            raw.ci.post_recv(qp.handle, [RecvWr(wr_id=1, sg_list=[Sge(keys.vaddr, 64, keys.lkey)])])
        assert isinstance(info.value, PostError) and info.value.failed_index == 0
        assert raw.ci.poll_cq(cq.handle, 4) == []

    @rules("ci:90")
    def test_ci_post_send_in_init_raises_invalid_qp_state(self, raw: RawCa) -> None:
        """ci-contract rule 90: sends are refused before RTS (INIT), at the provider too."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        qp = raw.qp(h_pd, qp_type, cq.handle)
        mod = QpMod(
            QpState.INIT, pkey_index=0, port_num=raw.port.port_num, access=AccessFlags.NONE
        )
        if qp_type.is_datagram:
            mod = QpMod(QpState.INIT, pkey_index=0, port_num=raw.port.port_num, qkey=UD_QKEY)
        raw.ci.modify_qp(qp.handle, mod)
        buf = bytearray(16)
        keys = raw.mr(h_pd, buf)
        with pytest.raises(InvalidQpState) as info:
            raw.ci.post_send(qp.handle, [SendWr(sg_list=[Sge(keys.vaddr, 4, keys.lkey)])])
        assert isinstance(info.value, PostError) and info.value.failed_index == 0

    @rules("ci:65", "ci:67")
    def test_ci_create_cq_size_at_least_requested(self, raw: RawCa) -> None:
        """ci-contract rules 65, 67: granted CQ size ≥ requested; query_cq reports the same."""
        cq = raw.cq(size=33)
        assert cq.size >= 33
        assert raw.ci.query_cq(cq.handle) == cq.size

    @rules("ci:66")
    def test_ci_create_cq_too_large_raises_invalid_cq_size(self, raw: RawCa) -> None:
        """ci-contract rule 66: a CQ larger than the CA maximum → IB_INVALID_CQ_SIZE."""
        with pytest.raises(InvalidCqSize):
            raw.ci.create_cq(raw.h, raw.attr.max_cqes + 1, None)

    @rules("ci:71")
    def test_ci_destroy_cq_in_use_raises_resource_busy(self, raw: RawCa) -> None:
        """ci-contract rule 71: destroying a CQ a QP uses → IB_RESOURCE_BUSY; the CQ keeps
        working."""
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(raw.ci.capabilities.qp_types)))
        raw.qp(h_pd, qp_type, cq.handle)
        with pytest.raises(ResourceBusy):
            raw.ci.destroy_cq(cq.handle)
        assert raw.ci.query_cq(cq.handle) == cq.size
        assert raw.ci.poll_cq(cq.handle, 4) == []

    @rules("ci:78")
    def test_ci_deregister_mr_twice_raises_invalid_mr_handle(self, raw: RawCa) -> None:
        """ci-contract rule 78: a deregistered MR handle → IB_INVALID_MR_HANDLE."""
        h_pd = raw.pd()
        buf = bytearray(32)
        keys = raw.ci.register_mr(h_pd, memoryview(buf), address_of(buf), AccessFlags.LOCAL_WRITE)
        assert raw.ci.query_mr(keys.handle).lkey == keys.lkey
        raw.ci.deregister_mr(keys.handle)
        with pytest.raises(InvalidMrHandle):
            raw.ci.query_mr(keys.handle)
        with pytest.raises(InvalidMrHandle):
            raw.ci.deregister_mr(keys.handle)

    @rules("ci:10")
    def test_ci_keys_are_32_bit(self, raw: RawCa) -> None:
        """ci-contract rule 10: L_Keys and R_Keys are 32-bit values, distinct per region."""
        h_pd = raw.pd()
        remote = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
        a = raw.mr(h_pd, bytearray(64), remote)
        b = raw.mr(h_pd, bytearray(64), remote)
        for k in (a.lkey, a.rkey, b.lkey, b.rkey):
            assert 0 <= k < 1 << 32
        assert a.lkey != b.lkey and a.rkey != b.rkey
        assert a.length == 64

    @rules("doc:ci-contract §3.2")
    def test_ci_completion_upcall_carries_cq_context(self, raw: RawCa) -> None:
        """ci-contract §3.2: an armed CQ's next completion upcalls completion_cb(cq_context)
        (over UD, or RC on a CA without UD: the upcall is not optional)."""
        caps = raw.ci.capabilities
        ud = QpType.UD in caps.qp_types
        if not ud:
            require_qp_type(caps, QpType.RC)
        h_pd = raw.pd()
        token = ("cq", object())
        cq = raw.cq(context=token)
        buf = bytearray(256)
        keys = raw.mr(h_pd, buf)
        dest = None
        if ud:
            sender = receiver = raw.qp(h_pd, QpType.UD, cq.handle)
            raw.ud_ready(sender.handle)
            h_av = raw.ci.create_av(h_pd, raw.av_attr())
            raw.later(lambda: raw.ci.destroy_av(h_av))
            dest = UdDest(av=h_av, remote_qp=sender.attr.qp_num, remote_qkey=UD_QKEY)
        else:
            sender = raw.qp(h_pd, QpType.RC, cq.handle)
            receiver = raw.qp(h_pd, QpType.RC, cq.handle)
            raw.rc_ready(sender.handle, receiver.attr.qp_num)
            raw.rc_ready(receiver.handle, sender.attr.qp_num)
        grh = GRH_BYTES if ud else 0
        raw.ci.post_recv(
            receiver.handle, [RecvWr(wr_id=2, sg_list=[Sge(keys.vaddr + 64, grh + 16, keys.lkey)])]
        )
        raw.ci.enable_cq_notify(cq.handle, False)
        raw.ci.post_send(
            sender.handle,
            [
                SendWr(
                    wr_id=1,
                    sg_list=[Sge(keys.vaddr, 16, keys.lkey)],
                    send_opt=SendOpt.SIGNALED,
                    ud=dest,
                )
            ],
        )
        raw.completions.wait(1)
        assert raw.completions.snapshot()[0] == (token,)
        wcs = raw.poll(cq.handle, 2)
        assert sorted(w.wr_id for w in wcs) == [1, 2]

    @rules("doc:ci-contract §3.1")
    def test_ci_async_event_carries_context(self, raw: RawCa) -> None:
        """ci-contract §3.1: async events carry qp_context for QP events, ca_context for port
        events."""
        caps = raw.ci.capabilities
        require(caps, "async_event_injection")
        h_pd = raw.pd()
        cq = raw.cq()
        qp_type = next(iter(sorted(caps.qp_types)))
        raw.qp(h_pd, qp_type, cq.handle, context="my-qp")
        raw.ci.inject_async_event(EventRecord(AsyncEvent.QP_FATAL, "my-qp"))
        raw.ci.inject_async_event(
            EventRecord(AsyncEvent.PORT_ACTIVE, "ca-context", port_num=raw.port.port_num)
        )
        raw.events.wait(2)
        recs = [e[0] for e in raw.events.snapshot()]
        assert [(r.code, r.context) for r in recs] == [
            (AsyncEvent.QP_FATAL, "my-qp"),
            (AsyncEvent.PORT_ACTIVE, "ca-context"),
        ]

    @rules("ci:85")
    def test_ci_fmr_verbs(self, raw: RawCa) -> None:
        """ci-contract rule 85: alloc maps nothing; map gives keys (new ones each map) and counts
        towards max_maps (IB_INSUFFICIENT_RESOURCES after); unmap resets; dealloc of a mapped FMR
        → IB_RESOURCE_BUSY; a deallocated FMR → IB_INVALID_FMR_HANDLE."""
        ci = raw.ci
        require(ci.capabilities, "fmr")
        h_pd = raw.pd()
        access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE
        h_fmr = ci.alloc_fmr(h_pd, FmrCreate(2, 2, 4096, access))
        ci.unmap_fmr(h_fmr)  # nothing mapped: nothing to do
        buf = bytearray(3 * 4096)
        page = [memoryview(buf)[i * 4096 : (i + 1) * 4096] for i in range(3)]
        first = ci.map_phys_fmr(h_fmr, page[:2], 0)
        assert first.handle is h_fmr and first.length == 8192 and first.rkey
        second = ci.map_phys_fmr(h_fmr, page[2:], 0)
        assert {second.lkey, second.rkey}.isdisjoint({first.lkey, first.rkey})
        with pytest.raises(InsufficientResources):
            ci.map_phys_fmr(h_fmr, page[:1], 0)
        with pytest.raises(ResourceBusy):
            ci.dealloc_fmr(h_fmr)
        ci.unmap_fmr(h_fmr)
        ci.map_phys_fmr(h_fmr, page[:1], 0)
        with pytest.raises(InvalidParameter):
            ci.map_phys_fmr(h_fmr, page, 0)  # three pages, max_pages 2
        ci.unmap_fmr(h_fmr)
        ci.dealloc_fmr(h_fmr)
        with pytest.raises(InvalidFmrHandle):
            ci.map_phys_fmr(h_fmr, page[:1], 0)

    @rules("ci:8")
    @pytest.mark.parametrize("capability", sorted(_CAPABILITY_PROBES))
    def test_ci_capability_agrees_with_verb(self, raw: RawCa, capability: str) -> None:
        """ci-contract rule 8: a capability declared absent means its verb raises IB_UNSUPPORTED,
        a declared one means it does not."""
        caps = raw.ci.capabilities
        declared = bool(getattr(caps, capability))
        verb = _CAPABILITY_PROBES[capability]
        try:
            self._probe_verb(raw, capability)
        except Unsupported as exc:
            assert not declared, f"{capability} declared but {verb} raised {exc!r}"
            return
        except _PROBE_REFUSALS.get(capability, ()) as exc:
            # The probe's arguments are valid but arbitrary (a zero MAD, command 0): a CA
            # that has the verb may refuse them, never with Unsupported.
            assert declared, f"{capability} not declared but {verb} raised {exc!r}"
            return
        except IbError as exc:
            raise AssertionError(
                f"{capability} {'declared' if declared else 'not declared'}: {verb} with valid "
                f"arguments raised {exc!r} (expected {'success' if declared else 'Unsupported'})"
            ) from exc
        assert declared, f"{capability} not declared but {verb} worked"

    @staticmethod
    def _probe_verb(raw: RawCa, capability: str) -> None:
        ci = raw.ci
        h_pd = raw.pd()
        cq = raw.cq()
        buf = bytearray(4096)
        if capability == "peek_cq":
            assert ci.peek_cq(cq.handle) == 0
        elif capability == "rearm_n_cq":
            ci.enable_ncomp_cq_notify(cq.handle, 1)
        elif capability == "resize_cq":
            assert ci.resize_cq(cq.handle, cq.size * 2) >= cq.size * 2
        elif capability == "srq":
            made = ci.create_srq(h_pd, SrqAttr(max_wr=8, max_sge=1), None)
            ci.destroy_srq(made.handle)
        elif capability == "phys_mr":
            keys = ci.register_pmr(
                h_pd, PhysCreate([memoryview(buf)], 4096, 4096, AccessFlags.LOCAL_WRITE), 0
            )
            ci.deregister_mr(keys.handle)
        elif capability == "shared_mr":
            keys = raw.mr(h_pd, buf)
            shared = ci.register_smr(keys.handle, h_pd, AccessFlags.LOCAL_WRITE, 0)
            ci.deregister_mr(shared.handle)
        elif capability == "modify_mr":
            keys = raw.mr(h_pd, buf)
            ci.modify_mr(
                keys.handle,
                MrModMask.ACCESS,
                None,
                None,
                AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ,
                None,
            )
        elif capability == "fmr":
            h_fmr = ci.alloc_fmr(h_pd, FmrCreate(1, 1, 4096, AccessFlags.LOCAL_WRITE))
            ci.dealloc_fmr(h_fmr)
        elif capability == "local_mad":
            ci.local_mad(raw.h, raw.port.port_num, bytes(256))
        elif capability == "port_counters":
            counters = ci.query_port_counters(raw.h, raw.port.port_num)
            assert all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in counters.items()
            ), f"counters are names and non-negative ints, got {counters!r}"
        elif capability == "vendor_call":
            ci.vendor_call(raw.h, [], CiOp(command=0))
        elif capability == "mw_types":
            mw = ci.create_mw(h_pd)
            ci.destroy_mw(mw.handle)
        elif capability == "modify_ca":
            ci.modify_ca(raw.h, raw.port.port_num, CaMod.NONE, PortAttrMod())
        elif capability == "special_qps":
            spl = ci.create_spl_qp(
                h_pd, raw.port.port_num, QpType.QP1, QpCaps(), cq.handle, cq.handle, None
            )
            ci.destroy_qp(spl.handle)
        elif capability == "multicast":
            if QpType.UD not in ci.capabilities.qp_types:
                # Without UD there is nothing to attach; the verb must still say Unsupported.
                assert not ci.capabilities.multicast, "multicast declared without UD QPs"
                qp = raw.qp(h_pd, next(iter(sorted(ci.capabilities.qp_types))), cq.handle)
                ci.attach_mcast(qp.handle, Gid("ff12:401b::1"), 0xC001)
                return
            qp = raw.qp(h_pd, QpType.UD, cq.handle)
            raw.ud_ready(qp.handle)
            h_mc = ci.attach_mcast(qp.handle, Gid("ff12:401b::1"), 0xC001)
            ci.detach_mcast(h_mc)
        elif capability == "sqd":
            types = ci.capabilities.qp_types
            qp_type = QpType.RC if QpType.RC in types else QpType.UD
            require_qp_type(ci.capabilities, qp_type)
            qp = raw.qp(h_pd, qp_type, cq.handle)
            if qp_type is QpType.RC:
                raw.rc_ready(qp.handle, qp.attr.qp_num)  # connected to itself: never used
            else:
                raw.ud_ready(qp.handle)
            assert ci.modify_qp(qp.handle, QpMod(QpState.SQD)).state is QpState.SQD
        elif capability == "async_event_injection":
            ci.inject_async_event(
                EventRecord(AsyncEvent.PORT_ACTIVE, "ca-context", port_num=raw.port.port_num)
            )
        else:  # pragma: no cover - table and code disagree
            raise AssertionError(capability)
