"""An SA answered by another ibal agent, in one process, on the mock fabric.

:class:`AgentSa` is a MAD service of class SUBN_ADM on the SM port's QP1 (the
mock's first CA holds the SM LID), with RMPP sessions: it answers each
request through ``answer(request_mad) -> Reply | None`` (``None``: dropped,
as an SA that is not there), GetTable responses in RMPP segments.  The
clients are :class:`~ibal.sa.SaPort` s of the other CA.  Time is a
:class:`~ibal.clock.ManualClock`: tests step it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ibal.al import AccessLayer, AlManager
from ibal.clock import ManualClock
from ibal.mad import MadElement, MadService, MadSvc, enable_rmpp, put_mad, reg_mad_svc
from ibal.providers.mock import MockFabric, MockProvider
from ibal.types import PortAttr, QpType
from ibal.wire.mad.consts import Method, MgmtClass

WAIT = 10.0
SA_METHODS = frozenset({Method.GET, Method.SET, Method.GET_TABLE, Method.DELETE})


@dataclass
class Reply:
    """What the agent answers: status, records (each padded to ``attr_offset * 8``)."""

    records: list[bytes] = field(default_factory=list)
    status: int = 0
    attr_offset: int = 0


class AgentSa:
    """The SA's stand-in: an ibal MAD service answering class 0x03 version 2."""

    def __init__(self, al: AccessLayer, ca_guid: int,
                 answer: Callable[[bytes], Reply | None]) -> None:  # fmt: skip
        self.answer = answer
        self.ca = al.open_ca(ca_guid)
        self.port: PortAttr = self.ca.query().ports[0]
        alias = self.ca.alloc_pd().get_spl_qp(self.port.port_guid, QpType.QP1_ALIAS)
        self.requests: queue.Queue[bytes] = queue.Queue()
        self.report_resps: queue.Queue[bytes] = queue.Queue()
        self.seen: list[bytes] = []
        self._lock = threading.Lock()
        self.service: MadService = reg_mad_svc(alias, MadSvc(
            MgmtClass.SUBN_ADM, 2, self._recv, self._sent, methods=SA_METHODS,
            support_unsol=True))  # fmt: skip
        enable_rmpp(self.service, al.timers, class_header_size=20)

    def _sent(self, e: MadElement) -> None:
        put_mad(e)

    def _recv(self, e: MadElement) -> None:
        mad = bytes(e.mad)
        if e.request is not None:  # the ReportResp to a Report we sent
            self.report_resps.put(mad)
            put_mad([e, e.request])
            return
        with self._lock:
            self.seen.append(mad)
        self.requests.put(mad)
        reply = self.answer(mad)
        if reply is None:
            put_mad(e)
            return
        table = mad[3] == Method.GET_TABLE
        step = reply.attr_offset * 8
        data = b"".join(r.ljust(step, b"\0") for r in reply.records)
        resp = self.service.pool_key.get_mad(max(256, 56 + len(data)))
        resp.mad[:56] = mad[:56]
        resp.mad[3] = Method.GET_TABLE_RESP if table else Method.GET_RESP
        resp.mad[4:6] = reply.status.to_bytes(2, "big")
        resp.mad[44:46] = reply.attr_offset.to_bytes(2, "big")
        resp.mad[56 : 56 + len(data)] = data
        if table:
            del resp.mad[56 + len(data):]  # the exact message: RMPP's PayloadLength says so
            resp.rmpp_version = 1
        resp.addr = e.addr
        put_mad(e)
        self.service.send(resp)

    def report(self, to_lid: int, notice: bytes, tid: int = 0x77) -> None:
        """Send an SA Report (a request: its ReportResp comes to :attr:`report_resps`)."""
        from ibal.types import MadAddr
        from ibal.wire.mad import header

        e = self.service.pool_key.get_mad()
        e.mad[:] = header.build(MgmtClass.SUBN_ADM, Method.REPORT, 0x0002, tid=tid, data=notice)
        e.addr = MadAddr(remote_qp=1, dlid=to_lid)
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, 1000, 0
        self.service.send(e)


@dataclass
class SaWorld:
    fabric: MockFabric
    mgr: AlManager
    clock: ManualClock
    al: AccessLayer
    sa: AgentSa
    client_guid: int
    """The client CA's port GUID."""
    client_lid: int

    def step(self, seconds: float) -> None:
        self.clock.advance(seconds, settle=lambda: self.mgr.queues.flush(timeout=WAIT))

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)


def sa_world(answer: Callable[[bytes], Reply | None]) -> Iterator[SaWorld]:
    clock = ManualClock()
    fabric = MockFabric(seed=0)
    fabric.sa.enabled = False  # the stand-in answers the SA class, not the mock's own SA
    fabric.add_ca()
    fabric.add_ca()
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al = mgr.open_al()
        sm_ca, client_ca = al.get_ca_guids()[:2]
        agent = AgentSa(al, sm_ca, answer)
        assert agent.port.lid == agent.port.sm_lid  # the first CA holds the SM LID
        client = al.query_ca_by_guid(client_ca).ports[0]
        yield SaWorld(fabric, mgr, clock, al, agent, client.port_guid, client.lid)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()
