"""Forged SA answers (issue 25 §2): a third port answering a client's request.

TIDs counted from 1 let a forger on the fabric answer a PathRecord query it never
saw (it replaced the answer with DLID 0x0BAD on the mock).  TIDs' low halves now
come from the OS, and an answer must come from the address the request went to:
one with the right TID from another port is dropped and counted
(``stats["forged_answers"]``), and the query takes the SA's answer on its next try.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from sa_world import WAIT, AgentSa, Reply

from ibal.al import AlManager
from ibal.clock import ManualClock
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa import SaPort
from ibal.types import MadAddr
from ibal.wire.mad import header, sa
from ibal.wire.mad.consts import Method, SaAttr

GOOD = sa.PATH_RECORD.encode(slid=1, dlid=2, sl=3, mtu=4, rate=6)
FORGED = sa.PATH_RECORD.encode(slid=1, dlid=0x0BAD, sl=3, mtu=4, rate=6)


class Forging:
    """The SA's script: before answering the first request, a forger answers it too."""

    def __init__(self) -> None:
        self.forger: AgentSa | None = None
        self.client_lid = 0
        self.forge = 1

    def __call__(self, mad: bytes) -> Reply:
        if self.forge and self.forger is not None:
            self.forge -= 1
            svc = self.forger.service
            e = svc.pool_key.get_mad()
            e.mad[:56] = mad[:56]  # the request's TID, as a forger that guessed it
            e.mad[3] = Method.GET_RESP
            e.mad[44:46] = (8).to_bytes(2, "big")
            e.mad[56 : 56 + len(FORGED)] = FORGED
            e.addr = MadAddr(remote_qp=1, dlid=self.client_lid)
            svc.send(e)
        return Reply([GOOD], 0, 8)


@pytest.fixture
def world() -> Iterator[tuple[AlManager, ManualClock, SaPort, Forging, AgentSa]]:
    clock = ManualClock()
    fabric = MockFabric(seed=0)
    fabric.sa.enabled = False
    for _ in range(3):
        fabric.add_ca()
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    script = Forging()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al = mgr.open_al()
        sm_ca, client_ca, forger_ca = al.get_ca_guids()[:3]
        agent = AgentSa(al, sm_ca, script)
        script.forger = AgentSa(al, forger_ca, lambda m: None)
        client = al.query_ca_by_guid(client_ca).ports[0]
        script.client_lid = client.lid
        yield mgr, clock, SaPort.open(al, client.port_guid), script, agent
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def test_an_answer_from_another_port_is_dropped_and_the_sa_answer_taken(
    world: tuple[AlManager, ManualClock, SaPort, Forging, AgentSa],
) -> None:
    mgr, clock, port, script, agent = world
    req = port.request(Method.GET, SaAttr.PATH_RECORD, timeout_ms=100, retry_cnt=2)
    mgr.queues.flush(timeout=WAIT)
    clock.advance(0.1, settle=lambda: mgr.queues.flush(timeout=WAIT))
    a = req.wait(WAIT)
    assert a.ok
    assert sa.PATH_RECORD.decode(a.records[0][: sa.PATH_RECORD.size])["dlid"] == 2
    assert port.stats["forged_answers"] == 1
    assert script.forge == 0 and len(agent.seen) == 2  # the forged try was lost, not taken


def test_tid_low_halves_are_not_counted(
    world: tuple[AlManager, ManualClock, SaPort, Forging, AgentSa],
) -> None:
    _, _, port, script, agent = world
    script.forge = 0
    for _ in range(16):
        assert port.request(Method.GET, SaAttr.PATH_RECORD).wait(WAIT).ok
    lows = [header.header(m).tid & 0xFFFFFFFF for m in agent.seen]
    steps = {(b - a) & 0xFFFFFFFF for a, b in itertools.pairwise(lows)}
    assert len(lows) == 16 and len(set(lows)) == 16
    assert steps != {1}  # 1, 2, 3...: a forger's guess (15 equal steps by chance: 2**-480)
    assert max(lows) > 1 << 20  # not a small counter either
