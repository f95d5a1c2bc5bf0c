"""Two CAs with QP1 between them, on each transport the MAD service runs over.

``mock``: the in-process fabric (special QPs, fault injection), ``rxe``: the
userspace RoCE provider, two devices on 127.0.0.x in one process, QP1 over
real UDP.  Both run the AL's timers on a :class:`~ibal.clock.ManualClock`, so
response time-outs move only when a test steps the clock.

``umad``: only inside the lab guest, where ``IBAL_MAD_UMAD=1`` adds it
(tests/mad/test_service_lab_umad.py runs these modules there with ``-k
umad``): both sides are PDs of kernel rxe's ``rxe0`` whose QP1 aliases reach
the kernel's MAD layer through libibumad, so the kernel routes between them
(one port: both sides have the same address), writes a request's TID high
half, retries, times out on its own clock and answers unserved requests.
:attr:`Net.al_owns_qp1` tells tests which of those the AL does instead.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ibal.al import AliasQp, AlManager, Ca, Pd
from ibal.clock import ManualClock
from ibal.mad import MadElement, MadService, MadSvc, reg_mad_svc
from ibal.types import MAD_SIZE, QP1_WELL_KNOWN_QKEY, Grh, MadAddr, PortAttr, QpType

WAIT = 10.0
VENDOR, VENDOR2 = 0x09, 0x0A  # vendor classes nobody else on the fabric serves
GET, SET, SEND, GET_RESP = 0x01, 0x02, 0x03, 0x81


def mad(mgmt_class: int, method: int, tid: int = 0, *, attr: int = 0x10, version: int = 1,
        payload: bytes = b"") -> bytearray:
    m = bytearray(MAD_SIZE)
    m[0], m[1], m[2], m[3] = 1, mgmt_class, version, method
    m[8:16] = tid.to_bytes(8, "big")
    m[16:18] = attr.to_bytes(2, "big")
    m[24 : 24 + len(payload)] = payload
    return m


@dataclass
class Inbox:
    """What a service heard: elements to wait on (no sleeps)."""

    recvs: queue.Queue[MadElement] = field(default_factory=queue.Queue)
    sends: queue.Queue[MadElement] = field(default_factory=queue.Queue)
    order: list[tuple[str, MadElement]] = field(default_factory=list)
    """Both callbacks in the order they ran (one thread runs them)."""

    def on_recv(self, e: MadElement) -> None:
        self.order.append(("recv", e))
        self.recvs.put(e)

    def on_send(self, e: MadElement) -> None:
        self.order.append(("send", e))
        self.sends.put(e)

    def recv(self) -> MadElement:
        return self.recvs.get(timeout=WAIT)

    def sent(self) -> MadElement:
        return self.sends.get(timeout=WAIT)


@dataclass
class Side:
    ca: Ca
    pd: Pd
    port: PortAttr
    alias: AliasQp
    roce: bool
    gid_index: int = 0

    def addr(self) -> MadAddr:
        """Where this side's QP1 is, as a MAD element's address."""
        grh = None
        if self.roce:
            grh = Grh(dgid=self.port.gids[self.gid_index], sgid_index=self.gid_index)
        return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=self.port.lid, grh=grh)


@dataclass
class Net:
    kind: str
    mgr: AlManager
    clock: ManualClock
    a: Side
    b: Side
    fabric: Any = None

    @property
    def al_owns_qp1(self) -> bool:
        """Whether the AL's own QP1 transport carries the MADs (mock, rxe), so its clock
        times requests out and its counters see what it drops and answers; on ``umad``
        the kernel's MAD layer does all of that out of the AL's sight."""
        return self.kind != "umad"

    def same_tid(self, got: int, sent: int) -> bool:
        """Whether ``got`` (a TID from the wire) is the TID of a request sent as ``sent``.
        On umad the kernel writes the high half on the wire only (its agent id): the low
        halves match and the high half is the kernel's, never 0."""
        if self.al_owns_qp1:
            return got == sent
        return got & 0xFFFFFFFF == sent & 0xFFFFFFFF and got >> 32 != 0

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)

    def step(self, seconds: float) -> None:
        self.clock.advance(seconds, settle=self.settle)

    def b_stats(self, **expect: int) -> dict[str, int]:
        """B's transport counters once they reach ``expect`` (rxe delivers over UDP, so a
        copy sent may land a little after the AL's queues drained).  On umad the kernel
        drops and answers before user space: the AL's transport counts nothing there."""
        from ibal.testing.helpers import wait_until

        if not self.al_owns_qp1:
            assert self.b.alias.transport_stats == {}
            return {}
        wait_until(lambda: self.b.alias.transport_stats == expect, f"B's counters {expect}")
        return self.b.alias.transport_stats

    def service(self, side: Side, mgmt_class: int = VENDOR, methods: Any = (), **kw: Any
                ) -> tuple[MadService, Inbox]:
        inbox = Inbox()
        svc = MadSvc(mgmt_class, kw.pop("version", 1), recv_cb=inbox.on_recv,
                     send_cb=inbox.on_send, methods=frozenset(methods),
                     support_unsol=bool(methods), **kw)
        return reg_mad_svc(side.alias, svc), inbox


def _sides(mgr: AlManager, roce: bool) -> list[Side]:
    al = mgr.open_al()
    cas = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
    sides = []
    for ca in cas:
        pd = ca.alloc_pd()
        port = ca.query().ports[0]
        alias = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
        sides.append(Side(ca, pd, port, alias, roce))
    return sides


def _mock() -> Iterator[Net]:
    from ibal.providers.mock import MockFabric, MockProvider

    clock = ManualClock()
    fabric = MockFabric(seed=0)
    fabric.sa.enabled = False  # ibal agents serve the SA class here, not the mock's SA
    fabric.add_ca()
    fabric.add_ca()
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        a, b = _sides(mgr, roce=False)
        yield Net("mock", mgr, clock, a, b, fabric)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def _rxe() -> Iterator[Net]:
    if os.geteuid() != 0:
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail("rxe needs root (raw sockets) and IBAL_LAB_REQUIRED is set")
        pytest.skip("rxe needs root (raw sockets need CAP_NET_RAW)")
    from ibal.providers.rxe.provider import RxeProvider

    clock = ManualClock()
    mgr = AlManager(clock=clock)
    try:
        # Addresses of their own: other rxe tests bind 127.0.0.2/3 (EADDRINUSE if they run too).
        mgr.add_provider(RxeProvider({"devices": "rxe_m0=127.0.9.2,rxe_m1=127.0.9.3"}))
        sides = _sides(mgr, roce=True)
        assert len(sides) == 2, f"rxe registered {len(sides)} CAs (addresses in use?)"
        a, b = sides
        yield Net("rxe", mgr, clock, a, b)
    finally:
        mgr.close(timeout=WAIT)


def _umad() -> Iterator[Net]:
    import subprocess

    from ibal.providers.rdma_core.provider import RdmaCoreProvider

    subprocess.run(["modprobe", "ib_umad"], capture_output=True, check=False)
    clock = ManualClock()  # the AL's timers (RMPP, transact); the kernel times MADs out
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(RdmaCoreProvider({"devices": ["rxe0"], "mad_only": False}))
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        assert ca.capabilities.mad_agents, "rxe0 has no umad port (ib_umad not loaded?)"
        port = ca.query().ports[0]
        # rxe0 sits on lo: the ::1 GID, not the link-local one (lo has no MAC).
        index = next(i for i, g in enumerate(port.gids)
                     if g.ipv4_mapped is None and not g.is_link_local and int(g))
        sides = []
        for _ in range(2):  # two PDs with a QP1 alias each: two clients of one port
            pd = ca.alloc_pd()
            alias = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
            sides.append(Side(ca, pd, port, alias, roce=True, gid_index=index))
        yield Net("umad", mgr, clock, sides[0], sides[1])
    finally:
        mgr.close(timeout=WAIT)


TRANSPORTS = ["mock", "rxe"] + (["umad"] if os.environ.get("IBAL_MAD_UMAD") == "1" else [])
"""``umad`` only where the lab guest's test run asks for it (it needs kernel rxe)."""


@pytest.fixture(params=TRANSPORTS)
def net(request: pytest.FixtureRequest) -> Iterator[Net]:
    make = {"mock": _mock, "rxe": _rxe, "umad": _umad}[request.param]
    yield from make()


@pytest.fixture
def mock_net() -> Iterator[Net]:
    yield from _mock()
