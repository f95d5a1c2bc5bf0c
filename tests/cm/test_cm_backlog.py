"""A listen's backlog and the reclaiming of half-open endpoints (issue 25 §2).

3,000 forged REQs that never complete left 3,000 endpoints (35 MB).  A listen
holds at most ``backlog`` half-open ones; a REQ beyond them is refused with REJ
"no resources" and leaves nothing behind; a REQ nobody answers is rejected
"timeout" once its sender has given up (remote CM response time-out x tries).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cm_world import CmWorld, RawCm, cm_world, req

from ibal.cm import api
from ibal.cm.records import CmListen
from ibal.cm.service import agent_of
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, RejReason

SVC = 0xBAC4


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


def _forged_req(world: CmWorld, i: int) -> bytes:
    a, b = world.a.port, world.b.port
    f = cm.REQ.decode(req(SVC, comm_id=0x1000 + i, local_gid=b.gids[0].packed,
                          remote_gid=a.gids[0].packed))  # fmt: skip
    f["local_qpn"] = 0x100 + i  # a QP of its own each, or they would be stale
    f["primary_local_lid"], f["primary_remote_lid"] = b.lid, a.lid
    return cm.REQ.encode(f)


def _rejs(world: CmWorld, raw: RawCm, n: int) -> list[tuple[object, object, object]]:
    out = []
    for _ in range(n):
        msg, _ = raw.next(world)
        out.append((msg.attr, msg.fields.get("reason"), msg.fields.get("remote_comm_id")))
    world.settle()
    assert raw.got.empty()
    return out


def test_reqs_beyond_the_backlog_are_refused_and_unanswered_ones_reclaimed(
    world: CmWorld,
) -> None:
    raw = RawCm(world.b)
    agent = agent_of(world.mgr)
    world.settle()
    heard: list[object] = []
    h = api.cm_listen(world.a.al, CmListen(svc_id=SVC, req_cb=heard.append, backlog=8),
                      lambda rec: None)  # fmt: skip
    for i in range(12):
        raw.send(CmAttr.REQ, _forged_req(world, i), world.a.port.lid, tid=i)
    refused = [(CmAttr.REJ, RejReason.NO_RESOURCES, 0x1000 + i) for i in range(8, 12)]
    assert _rejs(world, raw, 4) == refused
    assert agent.endpoints == 8 and len(heard) == 8
    assert h.half_open == 8 and h.stats["refused_backlog"] == 4

    # nobody answers: 4.096 us * 2**20 per try, 16 tries (the REQ's fields): ~67 s
    world.step(60.0)
    assert agent.endpoints == 8
    world.step(10.0)
    assert sorted(_rejs(world, raw, 8), key=str) == [  # type: ignore[arg-type]
        (CmAttr.REJ, RejReason.TIMEOUT, 0x1000 + i) for i in range(8)]
    assert h.half_open == 0 and h.stats["reclaimed"] == 8

    raw.send(CmAttr.REQ, _forged_req(world, 99), world.a.port.lid)
    world.settle()
    assert h.half_open == 1 and len(heard) == 9  # room again
