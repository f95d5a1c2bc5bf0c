"""What SaPort does per request to stay cheap, and that it stays correct.

One AL timer per port (the earliest deadline of its requests), the request
encoded once per question, the SA's address read once and read again on a
PnP event of the port or for a retry.  Mock fabric, the SA answered by
another ibal agent (tests/sa/sa_world.py), the clock stepped by the test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sa_world import WAIT, Reply, SaWorld, sa_world

from ibal.al import PnpClass, PnpEvent, PnpRec
from ibal.sa import SaAnswer, SaPort
from ibal.status import Status
from ibal.wire.mad import header, sa
from ibal.wire.mad.consts import Method, SaAttr

NR_MASK = sa.component_mask(sa.NODE_RECORD, ["lid"])


class Script:
    def __init__(self) -> None:
        self.drop = 0

    def __call__(self, mad: bytes) -> Reply | None:
        if self.drop:
            self.drop -= 1
            return None
        lid = sa.NODE_RECORD.decode(mad[56 : 56 + sa.NODE_RECORD.size])["lid"]
        rec = sa.NODE_RECORD.encode(lid=lid, node_guid=0x1000 + lid, node_type=1, num_ports=1)
        return Reply([rec], 0, 14)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def world(script: Script) -> Iterator[SaWorld]:
    yield from sa_world(script)


def ask(port: SaPort, lid: int, **kw: int) -> object:
    return port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=lid),
                        NR_MASK, **kw)  # fmt: skip


def test_requests_share_one_timer_and_each_times_out_at_its_own_deadline(
    world: SaWorld, script: Script
) -> None:
    script.drop = 1000
    port = SaPort.open(world.al, world.client_guid)
    before = len(world.al.timers)
    slow = [port.request(Method.GET, SaAttr.NODE_RECORD, timeout_ms=300, retry_cnt=0)
            for _ in range(10)]  # fmt: skip
    fast = [port.request(Method.GET, SaAttr.NODE_RECORD, timeout_ms=100, retry_cnt=1)
            for _ in range(10)]  # fmt: skip
    world.settle()
    assert len(world.al.timers) - before == 1  # one for the port, not one per request
    world.step(0.15)  # the fast ones' first tries ran out: their retries are out
    assert not any(r.done for r in slow + fast) and len(world.sa.seen) == 30
    world.step(0.1)  # 0.25: the fast ones' retries ran out
    assert all(r.wait(0).status is Status.TIMEOUT for r in fast)
    assert not any(r.done for r in slow)
    world.step(0.1)  # 0.35: the slow ones' only try ran out
    assert all(r.wait(0).status is Status.TIMEOUT for r in slow)
    assert port.pending == 0 and len(world.al.timers) == before  # nothing left armed


def test_an_answered_request_leaves_no_timer_behind(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    before = len(world.al.timers)
    answers = [ask(port, i).wait(WAIT) for i in range(1, 6)]  # type: ignore[attr-defined]
    assert [a.status for a in answers] == [Status.SUCCESS] * 5
    world.step(2.0)  # the port's timer fires once for the answered requests' deadlines
    assert len(world.al.timers) == before and port.pending == 0


def test_one_question_is_encoded_once_and_each_try_differs_by_its_tid(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    for _ in range(3):
        assert ask(port, 7).wait(WAIT).ok  # type: ignore[attr-defined]
    seen = world.sa.seen
    assert len(seen) == 3
    tids = {header.header(m).tid & 0xFFFFFFFF for m in seen}
    assert len(tids) == 3
    assert len({m[:8] + m[16:] for m in seen}) == 1  # the same bytes but the TID
    assert sa.NODE_RECORD.decode(seen[0][56 : 56 + sa.NODE_RECORD.size])["lid"] == 7


def test_a_new_sm_lid_is_used_at_once_after_its_pnp_event(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    assert ask(port, 1).wait(WAIT).ok  # type: ignore[attr-defined]  # the address is read
    changed = threading.Event()

    def on_pnp(rec: PnpRec) -> None:
        if rec.event is PnpEvent.SM_CHANGE and rec.guid == world.client_guid:
            changed.set()

    reg = world.al.reg_pnp(PnpClass.PORT, on_pnp)
    sm_port = next(p for p in world.fabric.ports() if p.lid == world.fabric.sm_lid)
    world.fabric.set_lid(sm_port, 0x40)  # the SM's port moves: SM_CHANGE everywhere
    assert changed.wait(WAIT)
    world.settle()  # the PnP queue ran the SA port's callback for that event too
    got: list[SaAnswer] = []
    req = port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=2), NR_MASK,
                       callback=got.append)  # fmt: skip
    # The clock stands still: only a first try sent to the new LID can be answered.
    assert req.wait(WAIT).ok and len(world.sa.seen) == 2
    world.settle()
    assert len(got) == 1 and got[0].ok
    reg.dereg()


def test_a_retry_reads_the_sm_lid_afresh(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    real = world.fabric.sm_lid
    world.fabric.sm_lid = 0x99  # nobody there, and no event says so
    req = ask(port, 3, timeout_ms=100)
    world.settle()
    assert not req.done and world.sa.seen == []  # type: ignore[attr-defined]
    world.fabric.sm_lid = real  # back, again without an event
    world.step(0.1)  # the first try ran out: the retry reads the port and finds the SA
    a = req.wait(WAIT)  # type: ignore[attr-defined]
    assert a.ok and len(world.sa.seen) == 1
