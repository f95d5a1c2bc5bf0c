"""IBAL's CM calls (ibal.cm.api) on the mock fabric: listen, REQ/REP/RTU with every
record's handles and contexts, SYNC, DREQ/DREP, REJ, LAP/APR and force_apm."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest
from cm_world import API_SVC, WAIT, Calls, CmWorld, Node, cm_world, connect_ibal, path

from ibal.cm import api
from ibal.cm.fsm import CmState
from ibal.cm.records import (
    AlFlags,
    CmApr,
    CmDrep,
    CmDreq,
    CmLap,
    CmListen,
    CmRej,
    CmRep,
    CmReq,
    CmRtu,
)
from ibal.status import InvalidParameter, InvalidQpState, InvalidSetting, Status, Unsupported
from ibal.types import QpState
from ibal.wire.mad.cm import AprStatus, RejReason

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = API_SVC


def path_fields(src: Node, dst: Node) -> dict[str, Any]:
    return dict(path(src, dst).fields)


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


def test_req_rep_rtu_then_dreq_drep(world: CmWorld) -> None:
    calls = Calls()
    ha, hb, qa, qb = connect_ibal(world, calls)
    assert ha.state is CmState.ESTABLISHED and hb.state is CmState.ESTABLISHED
    drep: queue.Queue[Any] = queue.Queue()

    def on_dreq(rec: Any) -> None:  # the passive side answers inside its callback
        assert rec.cm_dreq is ha and rec.pdata[:3] == b"bye"
        api.cm_drep(rec.cm_dreq, CmDrep(pdata=b"ok"))

    api_cbs = ha.info["cbs"]
    api_cbs["dreq"] = on_dreq
    api.cm_dreq(CmDreq(qp=qb, pdata=b"bye", drep_cb=drep.put, flags=AlFlags.SYNC))
    rec = drep.get_nowait()  # SYNC: the callback ran before cm_dreq returned
    assert rec.cm_status is Status.SUCCESS and rec.pdata[:2] == b"ok"
    assert qa.state is QpState.ERROR and qb.state is QpState.ERROR


def test_sync_req_runs_the_rep_callback_before_returning(world: CmWorld) -> None:
    qa, qb = world.a.qp(), world.b.qp()

    def on_req(rec: Any) -> None:
        api.cm_rep(rec.cm_req, CmRep(qp=qa))

    api.cm_listen(world.a.al, CmListen(svc_id=SVC, req_cb=on_req), lambda rec: None)
    seen: list[Any] = []

    def on_rep(rec: Any) -> None:
        seen.append(rec)
        api.cm_rtu(rec.cm_rep, CmRtu())

    api.cm_req(CmReq(svc_id=SVC, qp=qb, primary_path=path_fields(world.b, world.a), rep_cb=on_rep,
                     flags=AlFlags.SYNC))  # fmt: skip
    assert len(seen) == 1 and qb.state is QpState.RTS


def test_rej_from_the_listener_reaches_rej_cb(world: CmWorld) -> None:
    calls = Calls()
    qb = world.b.qp()
    api.cm_listen(world.a.al, CmListen(svc_id=SVC, req_cb=lambda r: api.cm_rej(
        r.cm_req, CmRej(rej_status=RejReason.NO_RESOURCES, ari=b"\x07", pdata=b"full"))),
        lambda rec: None)  # fmt: skip
    api.cm_req(CmReq(svc_id=SVC, qp=qb, primary_path=path_fields(world.b, world.a),
                     rep_cb=calls.cb("rep"), rej_cb=calls.cb("rej")))  # fmt: skip
    rec = calls.get("rej")
    assert rec.rej_status == RejReason.NO_RESOURCES and rec.ari == b"\x07"
    assert rec.pdata[:4] == b"full" and rec.qp is qb and qb.state is QpState.ERROR


def test_bad_requests(world: CmWorld) -> None:
    with pytest.raises(InvalidParameter):
        api.cm_listen(world.a.al, CmListen(svc_id=SVC, req_cb=print), None)  # type: ignore[arg-type]
    with pytest.raises(InvalidSetting, match="92"):
        api.cm_req(CmReq(svc_id=SVC, qp=world.b.qp(), primary_path=path_fields(world.b, world.a),
                         rep_cb=print, pdata=bytes(93)))  # fmt: skip
    with pytest.raises(InvalidParameter):
        api.cm_req(CmReq(svc_id=SVC, qp=world.b.qp(), primary_path=path_fields(world.b, world.a)))


def test_lap_answered_unsupported(world: CmWorld) -> None:
    """The passive side answers a LAP "unsupported" (inside its LAP callback): the active
    side's apr_cb gets it, no path is loaded, force_apm finds nothing armed; only the
    active side sends LAP.  (Accepted LAPs and force_apm: test_cm_apm.py.)"""
    calls = Calls()
    ha, _hb, qa, qb = connect_ibal(world, calls)

    def on_lap(rec: Any) -> None:  # cm_apr inside the LAP callback, as IBAL asks
        assert rec.cm_lap is ha and rec.alt_path is not None
        api.cm_apr(rec.cm_lap, CmApr(qp=qa, apr_status=AprStatus.UNSUPPORTED, info=b"no APM"))

    ha.info["cbs"]["lap"] = on_lap
    apr: queue.Queue[Any] = queue.Queue()
    api.cm_lap(CmLap(qp=qb, alt_path=path_fields(world.b, world.a), apr_cb=apr.put))
    rec = apr.get(timeout=WAIT)
    assert (rec.cm_status, rec.apr_status, rec.info) == (
        Status.SUCCESS, AprStatus.UNSUPPORTED, b"no APM")
    assert qb.query().alternate_av is None and qa.query().alternate_av is None
    with pytest.raises(InvalidQpState):
        api.force_apm(qb)
    with pytest.raises(Unsupported):  # only the active side sends LAP
        api.cm_lap(CmLap(qp=qa, alt_path=path_fields(world.a, world.b), apr_cb=print))


def test_a_lid_change_calls_the_listen_error_callback(world: CmWorld) -> None:
    errs: queue.Queue[Any] = queue.Queue()
    port = world.a.port
    h = api.cm_listen(world.a.al, CmListen(svc_id=SVC, req_cb=print, port_guid=port.port_guid,
                                           lid=port.lid), errs.put, context="mine")  # fmt: skip
    api.cm_listen(world.a.al, CmListen(svc_id=SVC + 1, req_cb=print), errs.put)  # undirected
    world.fabric.set_lid(world.fabric.port(world.fabric.cas[0]), 0x77)
    world.settle()
    world.settle()
    rec = errs.get(timeout=WAIT)
    assert (rec.listen_context, rec.reason, rec.listen) == ("mine", Status.INVALID_LID, h)
    assert errs.empty() and h.alive  # only the directed one; it stays registered


def test_peer_to_peer_requests_meet(world: CmWorld) -> None:
    """Both sides send REQ to the same service ID with req_cb set (the first two are lost,
    so the retransmissions find both sides waiting); the side with the larger (CA GUID,
    QPN) stays active, the other gets the REQ callback and answers REP."""
    world.fabric.faults.drop(predicate=lambda p: p.dst_qpn == 1 and p.payload[1] == 7,
                             count=2)  # the two REQs
    calls = Calls()
    qa, qb = world.a.qp(), world.b.qp()
    qps = {"a": qa, "b": qb}

    def side(me: str) -> dict[str, Any]:
        def on_req(rec: Any) -> None:
            calls.q.put(("req " + me, rec))
            api.cm_rep(rec.cm_req, CmRep(qp=qps[me], rtu_cb=calls.cb("rtu " + me)))

        def on_rep(rec: Any) -> None:
            calls.q.put(("rep " + me, rec))
            api.cm_rtu(rec.cm_rep, CmRtu())

        return {"req_cb": on_req, "rep_cb": on_rep}

    # SA answers step the clock
    pa, pb = path_fields(world.a, world.b), path_fields(world.b, world.a)
    api.cm_req(CmReq(svc_id=SVC, qp=qa, primary_path=pa, **side("a")))
    api.cm_req(CmReq(svc_id=SVC, qp=qb, primary_path=pb, **side("b")))
    world.step(7.0)  # both REQs resent (2 * 1024 + 4096 ms): now they meet
    got = [calls.q.get(timeout=WAIT)[0] for _ in range(3)]
    keys = {"a": (world.a.ca.guid, qa.num), "b": (world.b.ca.guid, qb.num)}
    active = max(keys, key=lambda k: keys[k])
    passive = "b" if active == "a" else "a"
    assert got == [f"req {passive}", f"rep {active}", f"rtu {passive}"]
    assert qa.state is QpState.RTS and qb.state is QpState.RTS
