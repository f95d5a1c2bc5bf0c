"""Destroy semantics: ordering, cascades, destroy callbacks, waiting, callbacks in flight."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from al_fakes import FakeCi

from ibal.al import AccessLayer, AlManager, Ca, Cq, Pd, QpCreate, in_callback
from ibal.compat import ib_sync_destroy
from ibal.status import (
    InvalidAlHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidMrHandle,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
    InvalidState,
    ResourceBusy,
    Timeout,
)
from ibal.types import AccessFlags, AvAttr, QpType, SrqAttr, Wc, WcType

WAIT = 10.0


def _qp(pd: Pd, cq: Cq, **kw: Any) -> Any:
    return pd.create_qp(QpCreate(QpType.RC, cq, cq), **kw)


def test_async_destroy_invalidates_at_once_and_calls_back_once(pd: Pd, cq: Cq) -> None:
    qp = _qp(pd, cq, context="qp-ctx")
    got: list[Any] = []
    done = threading.Event()

    def cb(ctx: Any) -> None:
        got.append((ctx, in_callback()))
        done.set()

    qp.destroy(cb)
    with pytest.raises(InvalidQpHandle):
        qp.query()
    with pytest.raises(InvalidQpHandle):
        qp.destroy()
    assert done.wait(WAIT)
    assert got == [("qp-ctx", True)]  # once, with the context, on the dispatcher


def test_wait_true_returns_after_destroy_callback_ran(ca: Ca, ci: FakeCi) -> None:
    cq = ca.create_cq(8, context="cq")
    seen: list[str] = []
    cq.destroy(lambda ctx: seen.append(ctx), wait=True)
    assert seen == ["cq"]
    assert "destroy_cq" in ci.verbs()


def test_ib_sync_destroy_sentinel_means_wait(ca: Ca) -> None:
    pd = ca.alloc_pd()
    pd.dealloc(ib_sync_destroy)
    with pytest.raises(InvalidPdHandle):
        pd.create_mw()


def test_dealloc_pd_cascades_children_first_through_the_provider(
    pd: Pd, cq: Cq, ci: FakeCi
) -> None:
    srq = pd.create_srq(SrqAttr(max_wr=8))
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, srq=srq))
    mr = pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
    mw = pd.create_mw()
    av = pd.create_av(AvAttr(port_num=1, dlid=3))
    before = len(ci.calls)
    pd.dealloc(wait=True)
    order = [v for v, _ in ci.calls[before:]]
    assert order == ["destroy_mw", "destroy_qp", "destroy_srq", "destroy_av", "deregister_mr",
                     "deallocate_pd"]
    for obj, err in ((qp, InvalidQpHandle), (srq, InvalidSrqHandle), (mr, InvalidMrHandle)):
        with pytest.raises(err):
            obj.query()
    del mw, av
    cq.query()  # the CQ is not the PD's: still valid


def test_close_ca_cascades_everything_and_other_als_keep_theirs(
    mgr: AlManager, ci: FakeCi
) -> None:
    al1, al2 = mgr.open_al(), mgr.open_al()
    ca1, ca2 = al1.open_ca(ci.guid), al2.open_ca(ci.guid)
    pd1, cq1 = ca1.alloc_pd(), ca1.create_cq(8)
    _qp(pd1, cq1)
    pd2 = ca2.alloc_pd()
    ca1.close(wait=True)
    for obj in (pd1, cq1):
        with pytest.raises((InvalidPdHandle, InvalidCqHandle)):
            obj.query() if isinstance(obj, Cq) else obj.create_mw()
    assert ci.live_kinds() == ["pd"]  # only AL 2's PD is left at the provider
    pd2.create_mw().destroy()
    al2.close()
    al1.close()
    assert ci.live_kinds() == []


def test_close_al_destroys_everything_and_blocks(mgr: AlManager, ci: FakeCi) -> None:
    al = mgr.open_al()
    ca = al.open_ca(ci.guid)
    pd = ca.alloc_pd()
    cq = ca.create_cq(8)
    _qp(pd, cq)
    pd.reg_mem(bytearray(16), AccessFlags.LOCAL_WRITE)
    al.close()
    assert al.closed
    assert ci.live_kinds() == []
    with pytest.raises(InvalidAlHandle):
        al.close()
    with pytest.raises(InvalidCaHandle):
        ca.alloc_pd()


def test_destroy_callbacks_children_before_parent(ca: Ca) -> None:
    pd = ca.alloc_pd()
    cq = ca.create_cq(8)
    qp = _qp(pd, cq)
    order: list[str] = []
    qp.destroy(lambda _: order.append("qp"))
    pd.dealloc(lambda _: order.append("pd"))
    ca.close(lambda _: order.append("ca"), wait=True)
    assert order == ["qp", "pd", "ca"]


def test_cq_destroy_busy_while_qp_uses_it(pd: Pd, cq: Cq, ci: FakeCi) -> None:
    qp = _qp(pd, cq)
    with pytest.raises(ResourceBusy):
        cq.destroy()
    assert cq.query() == 64  # still fully usable
    qp.destroy()
    cq.destroy(wait=True)  # the QP is destroying: the CQ waits for it, never busy
    verbs = ci.verbs()
    assert verbs.index("destroy_qp") < verbs.index("destroy_cq")


def test_srq_destroy_busy_while_qps_use_it(pd: Pd, cq: Cq) -> None:
    srq = pd.create_srq(SrqAttr(max_wr=8))
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, srq=srq))
    with pytest.raises(ResourceBusy):
        srq.destroy()
    qp.destroy(wait=True)
    srq.destroy(wait=True)


def test_destroy_callback_waits_for_the_callback_in_flight(ca: Ca, ci: FakeCi) -> None:
    running, release = threading.Event(), threading.Event()
    events: list[str] = []

    def comp_cb(cq: Cq, ctx: Any) -> None:
        events.append("comp-start")
        running.set()
        assert release.wait(WAIT)
        events.append("comp-end")

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert running.wait(WAIT)
    cq.rearm()  # a second notification, queued behind the running one: it must be dropped
    ci.complete(cq._h, Wc(2, WcType.SEND))
    done = threading.Event()

    def destroy_cb(ctx: Any) -> None:
        events.append("destroy")
        done.set()

    cq.destroy(destroy_cb)  # returns at once although a callback is running
    assert "destroy_cq" not in ci.verbs()  # the provider CQ outlives the running callback
    assert not done.is_set()
    release.set()
    assert done.wait(WAIT)
    assert events == ["comp-start", "comp-end", "destroy"]
    assert "destroy_cq" in ci.verbs()


def test_destroy_from_inside_own_callback(ca: Ca, ci: FakeCi) -> None:
    done = threading.Event()
    errors: list[BaseException] = []

    def comp_cb(cq: Cq, ctx: Any) -> None:
        try:
            with pytest.raises(InvalidState):
                cq.destroy(wait=True)  # would wait for itself
            cq.destroy(lambda _: done.set())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert done.wait(WAIT)
    assert not errors
    assert "destroy_cq" in ci.verbs()


def test_close_from_callback_raises_instead_of_deadlocking(
    al: AccessLayer, ca: Ca, ci: FakeCi
) -> None:
    seen: list[type[BaseException]] = []
    finished = threading.Event()

    def comp_cb(cq: Cq, ctx: Any) -> None:
        for call in (al.close, lambda: ca.close(wait=True), al.manager.close):
            try:
                call()
            except InvalidState:
                seen.append(InvalidState)
        finished.set()

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert finished.wait(WAIT)
    assert seen == [InvalidState] * 3
    assert not al.closed
    al.close()


def test_wait_timeout_raises_and_never_force_frees(ca: Ca, ci: FakeCi) -> None:
    running, release = threading.Event(), threading.Event()

    def comp_cb(cq: Cq, ctx: Any) -> None:
        running.set()
        release.wait(WAIT)

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert running.wait(WAIT)
    with pytest.raises(Timeout):
        cq.destroy(wait=True, timeout=0.05)
    assert "destroy_cq" not in ci.verbs()  # still referenced by the running callback
    release.set()
    assert ca._mgr.dispatcher.flush(WAIT)
    assert "destroy_cq" in ci.verbs()


def test_parent_destroyed_while_child_is_being_created(pd: Pd, ci: FakeCi) -> None:
    # The provider's create_av runs while another thread deallocates the PD.
    entered, proceed = threading.Event(), threading.Event()
    real = ci.create_av

    def slow_create_av(h_pd: Any, attr: AvAttr) -> Any:
        entered.set()
        assert proceed.wait(WAIT)
        return real(h_pd, attr)

    ci.create_av = slow_create_av  # type: ignore[method-assign]
    result: list[BaseException | object] = []

    def creator() -> None:
        try:
            result.append(pd.create_av(AvAttr(port_num=1)))
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=creator)
    t.start()
    assert entered.wait(WAIT)
    done = threading.Event()
    pd.dealloc(lambda _: done.set())
    proceed.set()
    t.join(WAIT)
    assert done.wait(WAIT)
    assert isinstance(result[0], InvalidPdHandle)  # the call produced no usable handle
    assert ci.live_kinds() == ["cq"] or ci.live_kinds() == []  # nothing of the PD is left
    assert "destroy_av" in ci.verbs()


def test_failed_create_leaves_nothing_behind(pd: Pd, cq: Cq, ci: FakeCi) -> None:
    ci.fail_next["create_qp"] = ResourceBusy("fake: full")
    with pytest.raises(ResourceBusy):
        _qp(pd, cq)
    cq.destroy(wait=True)  # no phantom QP pins the CQ
    pd.dealloc(wait=True)
    assert "destroy_qp" not in ci.verbs()


def test_sync_destroy_refused_by_provider_keeps_handle(pd: Pd, ci: FakeCi) -> None:
    mr = pd.reg_mem(bytearray(32), AccessFlags.LOCAL_WRITE)
    ci.fail_next["deregister_mr"] = ResourceBusy("fake: busy")
    with pytest.raises(ResourceBusy):
        mr.dereg()
    assert mr.query().lkey == mr.lkey  # still valid
    mr.dereg()
    with pytest.raises(InvalidMrHandle):
        mr.dereg()


def test_ref_origins_report(pd: Pd, cq: Cq) -> None:
    from ibal.al import AlObject

    AlObject.debug_refs = True
    try:
        cq2 = pd.ca.create_cq(4)
        _qp(pd, cq2)
        origins = cq2.ref_origins()
        assert origins == {"creation": 1, "pin": 1}
    finally:
        AlObject.debug_refs = False


def test_stash_keeps_typed_per_client_data(ca: Ca, al: AccessLayer) -> None:
    from ibal.al import StashKey

    mine, theirs = StashKey[int](), StashKey[str]()
    ca.stash[mine] = 5
    assert ca.stash[mine] == 5 and theirs not in ca.stash
    assert ca.stash.get(theirs, None) is None
    assert ca.stash.setdefault(theirs, "x") == "x" and len(ca.stash) == 2
    del ca.stash[mine]
    assert mine not in ca.stash
    assert al.stash is al.stash
