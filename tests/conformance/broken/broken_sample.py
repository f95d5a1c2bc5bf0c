"""Deliberately broken variants of the sample provider: one broken rule each.

Each mutant is a few lines of monkeypatching over ``ibal_sample_provider``,
applied for the duration of one conformance check (see ``suite_broken.py``)
and undone afterwards, so the mutants share one process without leaking into
each other.  ``test_mutants.py`` runs the suite against every mutant and
requires it to fail; ``python tests/conformance/broken/report.py`` prints
which checks catch which mutant (the table of ``docs/conformance.md``).

A mutant names the rule it breaks; a mutant the suite cannot catch is a hole
in the suite, not in the mutant.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from ibal_sample_provider import ca as ca_mod
from ibal_sample_provider import loopback, memory
from ibal_sample_provider.ca import SampleCa
from ibal_sample_provider.memory import KeyTable
from ibal_sample_provider.queues import Cq, Qp

from ibal.status import InvalidMaxSge, InvalidMaxWrs, InvalidState
from ibal.types import QpAttr, QpState, QpType, RecvOpt, Wc, WcStatus, WcType

Apply = Callable[[pytest.MonkeyPatch], None]


@dataclass(frozen=True)
class Mutant:
    """One broken rule: its name, the rule it breaks, and the patch that breaks it."""

    name: str
    chapter: str
    rule: str
    apply: Apply


MUTANTS: dict[str, Mutant] = {}

VARIANTS: dict[str, Apply] = {}
"""Conformant variants (fewer optional features): the suite must pass on each.
They exercise the branches of checks that only a CA without the feature takes."""


def mutant(chapter: str, rule: str) -> Callable[[Apply], Apply]:
    def register(fn: Apply) -> Apply:
        name = fn.__name__
        MUTANTS[name] = Mutant(name, chapter, rule, fn)
        return fn

    return register


def _wrap(mp: pytest.MonkeyPatch, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make(original)``."""
    mp.setattr(owner, name, make(getattr(owner, name)))


def _filter_completions(mp: pytest.MonkeyPatch, edit: Callable[[SampleCa, Cq, Any], Any]) -> None:
    """Pass every completion the CA makes through ``edit`` (``None`` drops it)."""

    def make(orig: Any) -> Any:
        def complete(self: SampleCa, cq: Cq, wc: Any, solicited: bool = False) -> None:
            wc = edit(self, cq, wc)
            if wc is not None:
                orig(self, cq, wc, solicited)

        return complete

    _wrap(mp, SampleCa, "complete", make)


# ------------------------------------------------------------ the five of issue 7


@mutant("error completions", "unsignaled WRs complete when they fail or are flushed")
def unsignaled_errors_silent(mp: pytest.MonkeyPatch) -> None:
    silent: set[int] = set()

    def make(orig: Any) -> Any:
        def send_wc(qp: Qp, wqe: Any, status: WcStatus, length: int = 0) -> Any:
            wc = orig(qp, wqe, status, length)
            if status is not WcStatus.SUCCESS and not qp.signaled(wqe):
                silent.add(id(wc))
            return wc

        return send_wc

    _wrap(mp, loopback, "_send_wc", make)

    def edit(ca: SampleCa, cq: Cq, wc: Any) -> Any:
        if id(wc) in silent:
            silent.discard(id(wc))
            return None
        return wc

    _filter_completions(mp, edit)


@mutant("CQ & notification", "entries present at arm time do not fire the callback")
def rearm_fires_at_once(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def enable_cq_notify(self: SampleCa, h_cq: Any, solicited: bool) -> None:
            orig(self, h_cq, solicited)
            if h_cq.entries and self._completion_cb is not None:
                h_cq._armed = False
                self._completion_cb(h_cq.context)

        return enable_cq_notify

    _wrap(mp, SampleCa, "enable_cq_notify", make)


@mutant("async events", "a responder refusing a request raises WQ_ACCESS/WQ_REQ_ERROR")
def responder_raises_no_events(mp: pytest.MonkeyPatch) -> None:
    def responder_error(ca: SampleCa, peer: Qp, event: Any) -> None:
        peer.state = QpState.ERROR

    mp.setattr(loopback, "_responder_error", responder_error)


@mutant("error completions", "rnr_retry 7 retries for ever")
def rnr_retry_7_gives_up(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(loopback, "RNR_RETRY_FOREVER", 8)


@mutant("memory regions", "a region for local access only has R_KEY 0")
def local_region_gets_rkey(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def add(self: KeyTable, mr: Any) -> None:
            orig(self, mr)
            mr.rkey = mr.lkey

        return add

    _wrap(mp, KeyTable, "add", make)


# ------------------------------------------------------------------ memory


@mutant("error completions", "an L_Key of another PD is a local protection error")
def lkey_pd_unchecked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def translate(self: KeyTable, key: int, pd: Any, *rest: Any) -> Any:
            mr = self._regions.get(key)
            return orig(self, key, mr.pd if mr is not None else pd, *rest)

        return translate

    _wrap(mp, KeyTable, "translate", make)


@mutant("memory regions", "RDMA needs the region's remote access right")
def remote_rights_unchecked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def translate(
            self: KeyTable, key: int, pd: Any, addr: int, length: int, access: Any, fault: Any
        ) -> Any:
            return orig(self, key, pd, addr, length, access & ~memory.REMOTE_ACCESS, fault)

        return translate

    _wrap(mp, KeyTable, "translate", make)


@mutant("error completions", "RDMA through an unknown R_KEY completes REM_ACCESS_ERR")
def bad_rkey_wrong_status(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def remote_memory(*args: Any) -> Any:
            try:
                return orig(*args)
            except memory.Fault:
                raise memory.Fault(WcStatus.REM_OP_ERR) from None

        return remote_memory

    _wrap(mp, loopback, "_remote_memory", make)


@mutant("memory regions", "a deregistered region's keys are refused")
def dereg_keeps_keys(mp: pytest.MonkeyPatch) -> None:
    def deregister_mr(self: SampleCa, h_mr: Any) -> None:
        with self._lock:
            mr = self._mr(h_mr)
            mr.alive = False
            mr.pd.users -= 1

    mp.setattr(SampleCa, "deregister_mr", deregister_mr)


@mutant("data path", "the responder QP's access flags gate RDMA")
def qp_access_unchecked(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(loopback, "_check_peer_access", lambda ca, peer, access: None)


# ---------------------------------------------------------------- resources


@mutant("contract", "close_ca with resources left raises ResourceBusy")
def close_ca_ignores_busy(mp: pytest.MonkeyPatch) -> None:
    def close_ca(self: SampleCa, h_ca: Any) -> None:
        handle = self._ca(h_ca)
        handle.alive = False
        self._open = None
        self._completion_cb = self._async_event_cb = None

    mp.setattr(SampleCa, "close_ca", close_ca)


@mutant("PD", "deallocate_pd of a PD in use raises ResourceBusy")
def dealloc_busy_pd(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def deallocate_pd(self: SampleCa, h_pd: Any) -> None:
            pd = self._pd(h_pd)
            users, pd.users = pd.users, 0
            try:
                orig(self, h_pd)
            finally:
                pd.users = users

        return deallocate_pd

    _wrap(mp, SampleCa, "deallocate_pd", make)


@mutant("CQ & notification", "destroy_cq of a CQ in use raises ResourceBusy")
def destroy_busy_cq(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def destroy_cq(self: SampleCa, h_cq: Any) -> None:
            cq = self._cq(h_cq)
            users, cq.users = cq.users, 0
            try:
                orig(self, h_cq)
            finally:
                cq.users = users

        return destroy_cq

    _wrap(mp, SampleCa, "destroy_cq", make)


@mutant("destroy & cleanup", "a verb that fails leaves nothing behind")
def failed_create_qp_leaks(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def create_qp(self: SampleCa, h_pd: Any, qp_type: Any, caps: Any, *rest: Any) -> Any:
            try:
                return orig(self, h_pd, qp_type, caps, *rest)
            except (InvalidMaxWrs, InvalidMaxSge):
                # The half-made QP stays in the CA's table.
                send_cq, recv_cq = rest[0], rest[1]
                num = self._next_qp_num
                self._next_qp_num += 1
                attr = QpAttr(qp_type=qp_type, qp_num=num, caps=caps)
                self.qps[num] = Qp(self, h_pd, attr, send_cq, recv_cq, None)
                raise

        return create_qp

    _wrap(mp, SampleCa, "create_qp", make)


@mutant("handles", "a destroyed handle raises Invalid*Handle")
def stale_handles_accepted(mp: pytest.MonkeyPatch) -> None:
    def check(handle: Any, kind: type, owner: object, error: type) -> Any:
        if isinstance(handle, kind) and handle.owner is owner:
            return handle
        raise error(f"not a {kind.__name__} of this CA")

    mp.setattr(ca_mod, "check", check)


# ----------------------------------------------------------------------- CQs


@mutant("CQ & notification", "a CQ holds at least the entries asked for")
def cq_smaller_than_asked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def create_cq(self: SampleCa, h_ca: Any, size: int, cq_context: Any) -> Any:
            made = orig(self, h_ca, size, cq_context)
            if size > 1:
                made.handle.size = size - 1
            return made._replace(size=made.handle.size)

        return create_cq

    _wrap(mp, SampleCa, "create_cq", make)


@mutant("CQ & notification", "resize below the queued entries raises Overflow")
def resize_below_queued(mp: pytest.MonkeyPatch) -> None:
    def resize_cq(self: SampleCa, h_cq: Any, size: int) -> int:
        with self._lock:
            cq = self._cq(h_cq)
            self._check_cq_size(size)
            while len(cq.entries) > size:
                cq.entries.pop()
            cq.size = size
            return size

    mp.setattr(SampleCa, "resize_cq", resize_cq)


@mutant("CQ & notification", "poll returns completions oldest first")
def poll_newest_first(mp: pytest.MonkeyPatch) -> None:
    def poll(self: Cq, max_entries: int) -> list[Any]:
        count = min(max_entries, len(self.entries))
        return [self.entries.pop() for _ in range(count)]

    mp.setattr(Cq, "poll", poll)


@mutant("CQ & notification", "poll returns at most max_entries")
def poll_ignores_max(mp: pytest.MonkeyPatch) -> None:
    def poll(self: Cq, max_entries: int) -> list[Any]:
        out = list(self.entries)
        self.entries.clear()
        return out

    mp.setattr(Cq, "poll", poll)


@mutant("CQ & notification", "peek counts without consuming")
def peek_consumes(mp: pytest.MonkeyPatch) -> None:
    def peek_cq(self: SampleCa, h_cq: Any) -> int:
        with self._lock:
            cq = self._cq(h_cq)
            n = len(cq.entries)
            cq.entries.clear()
            return n

    mp.setattr(SampleCa, "peek_cq", peek_cq)


@mutant("CQ & notification", "a solicited arm ignores unsolicited completions")
def solicited_arm_fires_on_any(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def arm(self: Cq, solicited: bool) -> None:
            orig(self, False)

        return arm

    _wrap(mp, Cq, "arm", make)


@mutant("async events", "a CQ overrun raises CQ_ERROR")
def cq_overrun_silent(mp: pytest.MonkeyPatch) -> None:
    _filter_completions(mp, lambda ca, cq, wc: None if cq.full else wc)


# ------------------------------------------------------------------------ QPs


@mutant("QP", "modify_qp returns the new attributes")
def modify_qp_returns_old(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def modify_qp(self: SampleCa, h_qp: Any, mod: Any) -> Any:
            before = self._qp(h_qp).attr
            orig(self, h_qp, mod)
            return before

        return modify_qp

    _wrap(mp, SampleCa, "modify_qp", make)


@mutant("QP", "query_qp reports the connected attributes")
def query_qp_forgets_dest(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def query_qp(self: SampleCa, h_qp: Any) -> Any:
            return dataclasses.replace(orig(self, h_qp), dest_qp=0)

        return query_qp

    _wrap(mp, SampleCa, "query_qp", make)


@mutant("QP", "a QP moved to RESET forgets its posted receives")
def reset_keeps_receives(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def modify_qp(self: SampleCa, h_qp: Any, mod: Any) -> Any:
            qp = self._qp(h_qp)
            kept = deque(qp.rq)
            attr = orig(self, h_qp, mod)
            if mod.state is QpState.RESET:
                qp.rq.extend(kept)
            return attr

        return modify_qp

    _wrap(mp, SampleCa, "modify_qp", make)


@mutant("post", "receives are refused in RESET")
def post_recv_in_reset(mp: pytest.MonkeyPatch) -> None:
    orig_fsm = ca_mod.qp_fsm

    class Fsm:
        def __getattr__(self, name: str) -> Any:
            return getattr(orig_fsm, name)

        @staticmethod
        def can_post_recv(state: QpState) -> bool:
            return True

    mp.setattr(ca_mod, "qp_fsm", Fsm())


@mutant("post", "a post beyond the queue depth fails at that WR")
def sq_depth_unchecked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def send_wqe(self: SampleCa, qp: Qp, wr: Any, index: int) -> Any:
            sq, qp.sq = qp.sq, deque()
            try:
                return orig(self, qp, wr, index)
            finally:
                qp.sq = sq

        return send_wqe

    _wrap(mp, SampleCa, "_send_wqe", make)


@mutant("error completions", "a QP in ERROR flushes its receive queue")
def error_keeps_receives(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def flush(ca: SampleCa, qp: Qp) -> None:
            rq, qp.rq = qp.rq, deque()
            try:
                orig(ca, qp)
            finally:
                qp.rq = rq

        return flush

    _wrap(mp, loopback, "_flush", make)


@mutant("data path", "sq_signaled QPs complete every send")
def sq_signaled_ignored(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(Qp, "signaled", lambda self, wqe: bool(wqe.options & 1))


@mutant("data path", "unsignaled sends that succeed make no completion")
def unsignaled_success_completes(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(Qp, "signaled", lambda self, wqe: True)


# ------------------------------------------------------------------ data path


@mutant("data path", "immediate data reaches the receive completion")
def immediate_lost(mp: pytest.MonkeyPatch) -> None:
    def edit(ca: SampleCa, cq: Cq, wc: Any) -> Any:
        if wc.recv_opt & RecvOpt.IMMEDIATE:
            return dataclasses.replace(wc, imm=None, recv_opt=wc.recv_opt & ~RecvOpt.IMMEDIATE)
        return wc

    _filter_completions(mp, edit)


@mutant("data path", "a UD receive's length counts the 40 GRH bytes")
def ud_length_without_grh(mp: pytest.MonkeyPatch) -> None:
    def edit(ca: SampleCa, cq: Cq, wc: Any) -> Any:
        qp = ca.qps.get(wc.qp_num)
        if wc.wc_type is WcType.RECV and qp is not None and qp.qp_type.is_datagram and wc.length:
            return dataclasses.replace(wc, length=wc.length - loopback.GRH_LENGTH)
        return wc

    _filter_completions(mp, edit)


@mutant("data path", "a UD datagram with the wrong Q_Key is dropped")
def qkey_ignored(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def send_datagram(ca: SampleCa, qp: Qp, wqe: Any) -> Any:
            peer = ca.qps.get(wqe.remote_qp)
            if peer is not None:
                wqe = dataclasses.replace(wqe, remote_qkey=peer.attr.qkey)
            return orig(ca, qp, wqe)

        return send_datagram

    _wrap(mp, loopback, "_send_datagram", make)


@mutant("data path", "a completion names its QP")
def completion_without_qp_num(mp: pytest.MonkeyPatch) -> None:
    _filter_completions(mp, lambda ca, cq, wc: dataclasses.replace(wc, qp_num=0))


@mutant("data path", "receive completions go to the QP's receive CQ")
def receives_on_send_cq(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def init(self: Qp, owner: Any, pd: Any, attr: Any, scq: Cq, rcq: Cq, ctx: Any) -> None:
            orig(self, owner, pd, attr, scq, scq, ctx)

        return init

    _wrap(mp, Qp, "__init__", make)


@mutant("data path", "wr_id is 64 bits")
def wr_id_truncated(mp: pytest.MonkeyPatch) -> None:
    _filter_completions(
        mp, lambda ca, cq, wc: dataclasses.replace(wc, wr_id=wc.wr_id & 0xFFFF_FFFF)
    )


# ------------------------------------------------------------------ QP state


@mutant("QP state", "a UD send error takes the QP to SQE, not ERROR")
def ud_send_error_enters_error(mp: pytest.MonkeyPatch) -> None:
    prop: Any = Qp.state

    def set_state(self: Qp, state: QpState) -> None:
        if state is QpState.SQERR:
            state = QpState.ERROR
        prop.fset(self, state)

    mp.setattr(Qp, "state", property(prop.fget, set_state))


@mutant("QP state", "SQE stops the send queue only: posted receives stay and complete")
def sqe_flushes_receives(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def flush(ca: SampleCa, qp: Qp) -> None:
            orig(ca, qp)
            if qp.state is QpState.SQERR:
                while qp.rq:
                    recv = qp.rq.popleft()
                    wc = Wc(recv.wr_id, WcType.RECV, WcStatus.WR_FLUSHED_ERR, qp_num=qp.qp_num)
                    ca.complete(qp.recv_cq, wc)

        return flush

    _wrap(mp, loopback, "_flush", make)


@mutant("QP state", "a QP in ERROR completes the sends posted to it (WR_FLUSHED_ERR)")
def error_drops_posted_sends(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def flush(ca: SampleCa, qp: Qp) -> None:
            if qp.state is QpState.ERROR:
                qp.sq.clear()  # gone without a completion
            orig(ca, qp)

        return flush

    _wrap(mp, loopback, "_flush", make)


@mutant("QP state", "flushed WRs complete in the order they were posted")
def flush_newest_first(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def flush(ca: SampleCa, qp: Qp) -> None:
            qp.sq.reverse()
            orig(ca, qp)

        return flush

    _wrap(mp, loopback, "_flush", make)


@mutant("QP state", "query_qp reports the ERROR an error completion caused")
def query_hides_error(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def query_qp(self: SampleCa, h_qp: Any) -> Any:
            attr = orig(self, h_qp)
            if attr.state in (QpState.ERROR, QpState.SQERR):
                return dataclasses.replace(attr, state=QpState.RTS)
            return attr

        return query_qp

    _wrap(mp, SampleCa, "query_qp", make)


@mutant("QP state", "SQE recovers to RTS: modify(RTS, current_state=SQERR)")
def sqe_recovery_refused(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def modify_qp(self: SampleCa, h_qp: Any, mod: Any) -> Any:
            if mod.state is QpState.RTS and self._qp(h_qp).state is QpState.SQERR:
                raise InvalidState("no way back from SQE")
            return orig(self, h_qp, mod)

        return modify_qp

    _wrap(mp, SampleCa, "modify_qp", make)


# ------------------------------------------------------------- CA, AV, PnP


@mutant("AV", "an AV on a port the CA lacks is refused (now or when used)")
def av_port_unchecked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def check_av_attr(self: SampleCa, attr: Any) -> None:
            orig(self, dataclasses.replace(attr, port_num=ca_mod.PORT))

        return check_av_attr

    _wrap(mp, SampleCa, "_check_av_attr", make)


@mutant("AV", "modify_av changes what query_av reports")
def modify_av_ignored(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def modify_av(self: SampleCa, h_av: Any, attr: Any) -> None:
            orig(self, h_av, h_av.attr)

        return modify_av

    _wrap(mp, SampleCa, "modify_av", make)


@mutant("open/close & CA query", "query_ca reports the CA's own GUID")
def query_ca_wrong_guid(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def query_ca(self: SampleCa, h_ca: Any) -> Any:
            return dataclasses.replace(orig(self, h_ca), ca_guid=self.guid ^ 1)

        return query_ca

    _wrap(mp, SampleCa, "query_ca", make)


@mutant("registration, hot-plug & PnP", "a CA is ready for every verb when it is registered")
def registered_before_ready(mp: pytest.MonkeyPatch) -> None:
    from ibal_sample_provider.provider import SampleProvider

    def plug(self: SampleProvider) -> None:
        if self._registrar is not None and self._ca is None:
            ca = SampleCa(self.guid)
            ready = ca._attr
            ca._attr = dataclasses.replace(ready, ports=())  # not set up yet
            self._registrar.register_ca(ca)
            ca._attr = ready
            self._ca = ca

    mp.setattr(SampleProvider, "plug", plug)


# ------------------------------------------------------------------ contract


@mutant("contract", "a capability declared absent means its verb raises Unsupported")
def capability_understated(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(ca_mod, "CAPABILITIES", dataclasses.replace(ca_mod.CAPABILITIES, resize_cq=False))


@mutant("async events", "an event carries the context of the object it is about")
def event_with_ca_context(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def async_event(self: SampleCa, code: Any, context: Any, port_num: int = 0) -> None:
            orig(self, code, self._ca_context, port_num)

        return async_event

    _wrap(mp, SampleCa, "async_event", make)


# ------------------------------------------------- conformant variants


def _variant(fn: Apply) -> Apply:
    VARIANTS[fn.__name__] = fn
    return fn


@_variant
def rc_only(mp: pytest.MonkeyPatch) -> None:
    """No UD QPs (so no datagram checks run): mandatory verbs must still be checked."""
    caps = ca_mod.CAPABILITIES
    reasons = {**caps.reasons, "qp_types": "variant: RC only"}
    opcodes = {QpType.RC: caps.opcodes[QpType.RC]}
    rc_only = dataclasses.replace(
        caps, qp_types=frozenset({QpType.RC}), opcodes=opcodes, reasons=reasons
    )
    mp.setattr(ca_mod, "CAPABILITIES", rc_only)


DEVIATING: dict[str, Apply] = {}
"""Broken variants that declare what they break (``Capabilities.deviations``): the
suite must report each broken rule as an expected failure, never pass or skip it."""


@lambda fn: DEVIATING.setdefault(fn.__name__, fn)
def local_op_err_declared(mp: pytest.MonkeyPatch) -> None:
    """Local protection and length errors complete LOCAL_OP_ERR, as kernel rxe does."""
    def make(orig: Any) -> Any:
        def translate(self: KeyTable, key: int, pd: Any, *rest: Any) -> Any:
            try:
                return orig(self, key, pd, *rest)
            except memory.Fault as fault:
                if fault.status is WcStatus.LOCAL_PROTECTION_ERR:
                    raise memory.Fault(WcStatus.LOCAL_OP_ERR) from None
                raise

        return translate

    _wrap(mp, KeyTable, "translate", make)
    deviations = {"precise_local_errors": "variant: every local error is LOCAL_OP_ERR"}
    mp.setattr(
        ca_mod, "CAPABILITIES", dataclasses.replace(ca_mod.CAPABILITIES, deviations=deviations)
    )
