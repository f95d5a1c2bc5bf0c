"""The world of the MAD receive-path fuzz: A runs the CM, the DM agent and an SA client;
B is hand-driven (a MAD service per class) and sends what the test draws."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ibal.al import AccessLayer, AlManager
from ibal.clock import ManualClock
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.providers.mock import MockFabric, MockProvider
from ibal.types import MadAddr, PortAttr, QpType
from ibal.wire.mad.consts import Method, MgmtClass

WAIT = 10.0
ALL_METHODS = frozenset({Method.GET, Method.SET, Method.SEND, Method.REPORT, Method.GET_TABLE,
                         Method.DELETE, Method.TRAP})  # fmt: skip


@dataclass
class MadFuzzWorld:
    mgr: AlManager
    clock: ManualClock
    al_a: AccessLayer
    port_a: PortAttr
    senders: dict[int, MadService]
    got: list[bytes] = field(default_factory=list)
    sa_port: Any = None

    def send(self, mgmt_class: int, mad: bytes, *, wait_answer: bool = False) -> None:
        svc = self.senders[mgmt_class]
        e = svc.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = MadAddr(remote_qp=1, dlid=self.port_a.lid)
        if wait_answer:
            e.resp_expected, e.timeout_ms, e.retry_cnt = True, 1000, 3
        svc.send(e)

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)
        self.clock.advance(0.5, settle=lambda: self.mgr.queues.flush(timeout=WAIT))

    def _recv(self, e: MadElement) -> None:
        self.got.append(bytes(e.mad))
        put_mad([e, e.request] if e.request is not None else e)

    def still_answers(self) -> bool:
        """A's DM agent still answers a well-formed ClassPortInfo Get (within its retries)."""
        from ibal.wire.mad import header

        before = len(self.got)
        self.send(MgmtClass.DEV_MGT, bytes(header.build(MgmtClass.DEV_MGT, Method.GET, 0x0001,
                                                        tid=0x55AA)), wait_answer=True)  # fmt: skip
        for _ in range(4):  # one try a second
            self.settle()
            self.clock.advance(0.6, settle=lambda: self.mgr.queues.flush(timeout=WAIT))
        return any(m[3] == Method.GET_RESP and m[16:18] == b"\x00\x01" for m in self.got[before:])

    def cm_stats(self) -> dict[str, int]:
        from ibal.cm.service import agent_of

        return dict(agent_of(self.mgr).stats)


def mad_fuzz_world() -> Iterator[MadFuzzWorld]:
    from ibal.cm.service import agent_of
    from ibal.dm.agent import DmService
    from ibal.sa import SaPort

    clock = ManualClock()
    fabric = MockFabric(seed=0)
    fabric.add_ca()
    fabric.add_ca()
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al_a, al_b = mgr.open_al(), mgr.open_al()
        ga, gb = al_a.get_ca_guids()[:2]
        ca_b = al_b.open_ca(gb)
        port_b = ca_b.query().ports[0]
        alias = ca_b.alloc_pd().get_spl_qp(port_b.port_guid, QpType.QP1_ALIAS)
        w = MadFuzzWorld(mgr, clock, al_a, al_a.query_ca_by_guid(ga).ports[0], {})
        for cls, version in ((MgmtClass.COMM_MGT, 2), (MgmtClass.DEV_MGT, 1),
                             (MgmtClass.SUBN_ADM, 2)):  # fmt: skip
            # B's classes are ours (registered before the agents, which then serve A only)
            w.senders[cls] = reg_mad_svc(alias, MadSvc(cls, version, w._recv, put_mad,
                                                       methods=ALL_METHODS, support_unsol=True))
        agent_of(mgr)
        DmService.start(mgr)
        w.sa_port = SaPort.open(al_a, w.port_a.port_guid)
        w.sa_port.add_report_listener(lambda notice, sender: None)
        w.settle()
        yield w
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()
