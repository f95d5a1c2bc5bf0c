"""Hot remove and add of a CA during traffic (issue 12), on the mock fabric.

Three CAs on one fabric and one manager: ``sm`` (the SM port, its SA agent
answers), ``peer`` and ``victim``.  The victim's AL runs RC traffic to the
peer (SENDs and RDMA WRITEs reposted from completion callbacks, and RDMA
WRITEs posted by a thread), a MAD service with sends waiting for answers and
received MADs held, an SA subscription, a multicast join and a service
registration.  Then the victim CA is withdrawn (the provider's
``deregister_ca``) while all of that runs: every object of it must be gone
(handles raise their ``Invalid*Handle``, nothing of it left in the AL's object
tree), no timer of it left, no callback for it after the withdrawal returned,
the MAD elements back in their pool, the SA port and subscription state of its
port gone.  Then it is added again: PnP clients hear it in subsystem order and
new objects work on it.  Time is a ManualClock: nothing moves unless stepped.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ibal.al import (
    AccessLayer,
    AlManager,
    Ca,
    Cq,
    PnpClass,
    PnpEvent,
    PnpOrder,
    PnpRec,
    QpCreate,
)
from ibal.al.obj import AlObject
from ibal.clock import ManualClock
from ibal.dm import DmService, create_ioc
from ibal.dm.discovery import Discovery
from ibal.mad import MadElement, MadPool, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa import JoinState, join_mcast, path_records
from ibal.sa.inform import subscribe
from ibal.sa.port import SaPort
from ibal.sa.service import register_service
from ibal.status import IbError, InvalidHandle, Status
from ibal.testing.helpers import Side, connect, mr_access
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    DgrmInfo,
    Gid,
    Grh,
    IocProfile,
    MadAddr,
    PortAttr,
    PortCap,
    QpType,
    SendWr,
    SvcEntry,
    WcStatus,
    WrType,
)

WAIT = 20.0
VENDOR, GET = 0x09, 0x01
MGID = Gid("ff12:401b:ffff::12:7")
QKEY = 0x1212
SERVICE_ID = 0x1000_0000_0012_0001
CM_SERVICE_ID = 0x1000_0000_0012_0002
PAYLOAD = 512


def _mad(tid: int) -> bytearray:
    m = bytearray(MAD_SIZE)
    m[0], m[1], m[2], m[3] = 1, VENDOR, 1, GET
    m[8:16] = tid.to_bytes(8, "big")
    m[16:18] = (0x10).to_bytes(2, "big")
    return m


@dataclass
class CallbackWatch:
    """Records every callback that runs for the victim's objects, with a phase tag."""

    gone: threading.Event = field(default_factory=threading.Event)
    after: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hit(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1
            if self.gone.is_set():
                self.after.append(what)

    def destroyed(self, what: str) -> None:
        """A destroy callback: the teardown queue may run it after the withdrawal returned."""
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1


class RcLoop:
    """Victim → peer RC traffic that keeps itself going from completion callbacks."""

    def __init__(self, v: Side, p: Side, watch: CallbackWatch, limit: int = 200_000) -> None:
        self.v, self.p, self.watch, self.limit = v, p, watch, limit
        self.posted = 0
        self.sends_landed = 0
        self.statuses: dict[WcStatus, int] = {}
        self.errors: list[BaseException] = []  # the victim's callback: raced the teardown
        self.peer_errors: list[BaseException] = []
        self.started = threading.Event()

    def start(self) -> None:
        for i in range(8):
            self.p.recv(1000 + i, PAYLOAD * (i % 4), PAYLOAD)
        self.v.cq.rearm()
        self.p.cq.rearm()
        for _ in range(4):
            self._post()

    def _post(self) -> None:
        n = self.posted
        if n >= self.limit:
            return
        self.posted += 1
        off = (n % 4) * PAYLOAD
        self.v.put(off, n.to_bytes(8, "big") * (PAYLOAD // 8))
        if n % 2:
            wr = SendWr(wr_id=n, opcode=WrType.RDMA_WRITE, sg_list=[self.v.sge(off, PAYLOAD)],
                        remote_addr=self.p.remote(4 * PAYLOAD + off), rkey=self.p.mr.rkey)
        else:
            wr = SendWr(wr_id=n, opcode=WrType.SEND, sg_list=[self.v.sge(off, PAYLOAD)])
        self.v.qp.post_send(wr)

    def victim_done(self, cq: Cq, _ctx: Any) -> None:
        self.watch.hit("victim cq")
        try:
            cq.rearm()
            for wc in cq.poll(16):
                self.statuses[wc.status] = self.statuses.get(wc.status, 0) + 1
                if wc.status is WcStatus.SUCCESS:
                    self.started.set()
                    self._post()
        except IbError as exc:
            self.errors.append(exc)

    def peer_done(self, cq: Cq, _ctx: Any) -> None:
        try:
            cq.rearm()
            for wc in cq.poll(16):
                if wc.status is WcStatus.SUCCESS:
                    self.sends_landed += 1
                    self.p.recv(wc.wr_id, 0, PAYLOAD)
        except IbError as exc:
            self.peer_errors.append(exc)


def _side(ca: Ca, port: PortAttr, comp_cb: Any) -> Side:
    pd = ca.alloc_pd()
    cq = ca.create_cq(256, comp_cb=comp_cb)
    buf = bytearray(16 * PAYLOAD)
    mr = pd.reg_mem(buf, mr_access(ca.capabilities))
    qp = pd.create_qp(QpCreate(QpType.RC, send_cq=cq, recv_cq=cq, sq_depth=64, rq_depth=64))
    return Side(ca=ca, port=port, pd=pd, cq=cq, buf=buf, mr=mr, qp=qp)


class WriterThread(threading.Thread):
    """RDMA WRITEs posted from an application thread, one at a time, until the QP goes."""

    def __init__(self, v: Side, p: Side) -> None:
        super().__init__(name="hot-remove-writer", daemon=True)
        self.v, self.p = v, p
        self.done = 0
        self.raised: BaseException | None = None
        self.ran = threading.Event()

    def run(self) -> None:
        n = 0
        try:
            while True:
                self.v.qp.post_send(SendWr(
                    wr_id=n, opcode=WrType.RDMA_WRITE, sg_list=[self.v.sge(0, 64)],
                    remote_addr=self.p.remote(8 * PAYLOAD), rkey=self.p.mr.rkey))  # fmt: skip
                n += 1
                for wc in self.v.cq.wait(WAIT):
                    self.done += wc.status is WcStatus.SUCCESS
                if self.done >= 4:
                    self.ran.set()
        except IbError as exc:  # the QP or CQ went: the thread's end
            self.raised = exc


@dataclass
class MadSide:
    service: MadService
    pool: MadPool
    held: list[MadElement] = field(default_factory=list)
    ended: list[WcStatus] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class World:
    """The manager, the peer's objects (they stay) and how the victim CA comes and goes."""

    sa = False  # an SA to subscribe, join and register with (InfiniBand)
    roce = False

    def __init__(self, clock: ManualClock, mgr: AlManager, peer_guid: int) -> None:
        self.clock = clock
        self.mgr = mgr
        self.peer_al = self.mgr.open_al()
        self.peer_ca = self.peer_al.open_ca(peer_guid)
        self.peer_port = self.peer_ca.query().ports[0]
        self.peer_mad_in: list[bytes] = []
        self.listener: Any = None  # the peer's CM listen, made with the first connection
        pd = self.peer_ca.alloc_pd()
        alias = pd.get_spl_qp(self.peer_port.port_guid, QpType.QP1_ALIAS)
        # The peer hears the victim's requests and never answers: they stay outstanding.
        self.peer_svc = reg_mad_svc(alias, MadSvc(
            VENDOR, 1, self._peer_recv, put_mad, methods=frozenset({GET}),
            support_unsol=True))  # fmt: skip

    def _peer_recv(self, e: MadElement) -> None:
        self.peer_mad_in.append(bytes(e.mad))
        put_mad(e)

    def mad_addr(self, port: PortAttr) -> MadAddr:
        """QP1 of ``port`` as a MAD's destination."""
        grh = Grh(dgid=port.gids[0], sgid_index=0) if self.roce else None
        return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=port.lid, grh=grh)

    def settle(self) -> None:
        assert self.mgr.queues.flush(WAIT)

    def path(self, al: AccessLayer, port: PortAttr) -> Any:
        """A PathRecord from ``port`` to the peer's (the SA's; on RoCE ibal.sa.roce's)."""
        from ibal.sa import path_records

        if not self.roce:
            [path] = path_records(al, port.lid, self.peer_port.lid, port_guid=port.port_guid)
            return path
        # Resolved from the GIDs and the IP stack, on the AL's timers: step the clock.
        got: list[Any] = []
        path_records(al, port.gids[0], self.peer_port.gids[0], port_guid=port.port_guid,
                     callback=got.append)
        for _ in range(1000):
            if got:
                break
            self.clock.advance(0.001, settle=self.settle)
        [path] = got[0].unwrap()
        return path

    @property
    def victim_guid(self) -> int:
        raise NotImplementedError

    def withdraw(self, guid: int) -> None:
        raise NotImplementedError

    def add_again(self, cycle: int) -> int:
        """Hot add: the victim's GUID (the same one or a new CA's)."""
        raise NotImplementedError

    def close(self) -> None:
        if not self.mgr.closed:
            self.mgr.close(timeout=WAIT)


class MockWorld(World):
    """Three CAs on the mock fabric: ``sm`` (its SA agent answers), ``peer``, ``victim``.
    ``provider``: the provider withdraws the victim and registers it again (same GUID);
    ``callback``: the same, the withdrawal called from a callback (misc queue);
    ``fabric``: the mock's hotplug takes it off the fabric and plugs a new CA in."""

    sa = True

    def __init__(self, how: str) -> None:
        self.how = how
        clock = ManualClock()
        self.fabric = MockFabric(seed=12)
        for name in ("sm", "peer", "victim"):
            self.fabric.add_ca(name)
        self.fabric.use_clock(clock)
        mgr = AlManager(clock=clock)
        mgr.add_provider(MockProvider({"fabric": self.fabric}))
        self.victim_mock = self.fabric.ca("victim")
        super().__init__(clock, mgr, self.fabric.ca("peer").guid)

    @property
    def victim_guid(self) -> int:
        return self.victim_mock.guid

    def withdraw(self, guid: int) -> None:
        if self.how == "provider":
            self.mgr.deregister_ca(guid)  # returns once close_ca was called
        elif self.how == "callback":
            # From one of the manager's callbacks it returns at once; the teardown follows
            # once the callbacks holding it up returned: the queues drained, it is over.
            returned = threading.Event()

            def withdraw() -> None:
                self.mgr.deregister_ca(guid)
                returned.set()

            self.mgr.queues.misc.post(withdraw)
            assert returned.wait(WAIT)
            self.settle()
            assert guid not in self.mgr.ca_guids
        else:
            self.fabric.hotplug_remove(next(c for c in self.fabric.cas if c.guid == guid))

    def add_again(self, cycle: int) -> int:
        if self.how in ("provider", "callback"):
            self.mgr.register_ca(self.victim_mock)
            return self.victim_mock.guid
        self.victim_mock = self.fabric.hotplug_add(f"victim{cycle + 2}")
        return self.victim_mock.guid

    def close(self) -> None:
        if not self.mgr.closed:
            super().close()
            self.fabric.close()


class RxeWorld(World):
    """Two devices of the userspace rxe provider on loopback addresses: the peer's from
    the start, the victim's created and deleted at run time (``rdma link add``/``delete``)."""

    roce = True
    PEER, VICTIM = "rxe_hp", "rxe_hv"
    VICTIM_ADDR = "127.0.12.3"

    def __init__(self) -> None:
        from ibal.providers.rxe.provider import RxeProvider

        clock = ManualClock()
        mgr = AlManager(clock=clock)
        try:
            # Addresses of their own: other rxe tests bind 127.0.0.x / 127.0.9.x.
            self.provider = RxeProvider({"devices": f"{self.PEER}=127.0.12.2"})
            mgr.add_provider(self.provider)
            assert len(mgr.ca_guids) == 1, "rxe registered no CA (address in use?)"
            peer = mgr.ca_guids[0]
            self._add()
            self._victim = next(g for g in mgr.ca_guids if g != peer)
            super().__init__(clock, mgr, peer)
        except BaseException:
            mgr.close(timeout=WAIT)
            raise

    def _add(self) -> None:
        import ipaddress

        from ibal.providers.rxe.device import DeviceSpec

        assert self.provider.registry is not None
        self.provider.registry.create(
            DeviceSpec(self.VICTIM, address=ipaddress.ip_address(self.VICTIM_ADDR)))

    @property
    def victim_guid(self) -> int:
        return self._victim

    def withdraw(self, guid: int) -> None:
        assert guid == self._victim and self.provider.registry is not None
        self.provider.registry.remove(self.VICTIM)

    def add_again(self, cycle: int) -> int:
        before = set(self.mgr.ca_guids)
        self._add()
        (self._victim,) = set(self.mgr.ca_guids) - before
        return self._victim


def _rxe_world() -> RxeWorld:
    if os.geteuid() != 0:
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail("rxe needs root (raw sockets) and IBAL_LAB_REQUIRED is set")
        pytest.skip("rxe needs root (raw sockets need CAP_NET_RAW)")
    return RxeWorld()


@pytest.fixture(params=["mock-provider", "mock-fabric", "mock-callback", "rxe"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    w: World = _rxe_world() if request.param == "rxe" else MockWorld(request.param[5:])
    yield w
    w.close()


def _objects_on(root: AlObject, cica_guid: int) -> list[AlObject]:
    """Every object under ``root`` (the AL's object tree) that lives on CA ``cica_guid``."""
    out: list[AlObject] = []
    todo = list(root._children)
    while todo:
        o = todo.pop()
        cica = getattr(o, "_cica", None)
        if cica is not None and cica.guid == cica_guid:
            out.append(o)
        todo.extend(o._children)
    return out


def _victim_objects(al: AccessLayer, guid: int) -> list[AlObject]:
    """The AL's objects on the victim: on its CA, or an SA object of its port."""
    port_guids = {guid | n for n in range(1, 3)}
    out = _objects_on(al, guid)
    for o in al._children:
        if getattr(o, "port_guid", None) in port_guids:
            out.append(o)
    return out


class VictimLoad:
    """Everything the victim's AL runs when it is withdrawn."""

    def __init__(self, w: World, al: AccessLayer, watch: CallbackWatch, guid: int) -> None:
        self.al = al
        self.watch = watch
        self.teardown = w.mgr.queues.teardown
        self.ca = al.open_ca(guid)
        self.port = self.ca.query().ports[0]
        guid = self.port.port_guid
        # RC traffic driven by callbacks, and by a thread on a second pair.
        self.loop: RcLoop
        v = _side(self.ca, self.port, lambda cq, c: self.loop.victim_done(cq, c))
        p = _side(w.peer_ca, w.peer_port, lambda cq, c: self.loop.peer_done(cq, c))
        connect(v, p, self.ca.capabilities)
        self.loop = RcLoop(v, p, watch)
        tv, tp = _side(self.ca, self.port, None), _side(w.peer_ca, w.peer_port, None)
        connect(tv, tp, self.ca.capabilities)
        self.writer = WriterThread(tv, tp)
        # A MAD service: requests to the peer that wait for answers, MADs received and held.
        pd = self.ca.alloc_pd()
        alias = pd.get_spl_qp(guid, QpType.QP1_ALIAS)
        pool = MadPool(al, 0, 0, 16)
        key = pool.register(pd)
        self.mad: MadSide
        svc = reg_mad_svc(alias, MadSvc(VENDOR, 1, self._mad_recv, self._mad_sent,
                                        methods=frozenset({GET}), support_unsol=True), key)
        self.mad = MadSide(svc, pool)
        for tid in range(1, 5):
            e = key.get_mad()
            e.mad[:] = _mad(tid)
            e.addr = w.mad_addr(w.peer_port)
            e.resp_expected, e.timeout_ms, e.retry_cnt = True, 60_000, 3
            svc.send(e)
        # The peer's GETs reach the victim's service, which holds them (not put back).
        for tid in range(10, 13):
            e = w.peer_svc.pool_key.get_mad()
            e.mad[:] = _mad(tid)
            e.addr = w.mad_addr(self.port)
            w.peer_svc.send(e)
        self.sa = w.sa
        if w.sa:
            self._sa_load(guid)
            [path] = path_records(al, self.port.lid, w.peer_port.lid, port_guid=guid)
            assert path.fields["dlid"] == w.peer_port.lid
        # DM: an I/O controller exported by the victim's I/O unit (the DM agent answers
        # for it and the port advertises IsDeviceManagementSupported).
        self.ioc = create_ioc(self.ca, IocProfile(ioc_guid=self.ca.guid | 0x77,
                                                  id_string="hot remove"))
        self.ioc.add_svc_entry(SvcEntry("hot-remove", SERVICE_ID))
        assert self.ioc.register() == 1
        assert self.ca.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED

    def _sa_load(self, guid: int) -> None:
        """SA: a subscription, a multicast join of a UD QP, a service registration."""
        watch = self.watch
        self.subscription = subscribe(self.al, trap=64, port_guid=guid,
                                      report_cb=lambda rec: watch.hit("report"),
                                      destroy_cb=lambda c: watch.destroyed("sub destroy_cb"))
        ud_pd = self.ca.alloc_pd()
        ud_cq = self.ca.create_cq(16)
        self.ud_qp = ud_pd.create_qp(QpCreate(QpType.UD, ud_cq, ud_cq))
        self.ud_qp.init_dgrm_svc(DgrmInfo(port_guid=guid, qkey=QKEY))
        self.membership = join_mcast(self.ud_qp, MGID, create=True, q_key=QKEY,
                                     join_state=JoinState.FULL,
                                     destroy_cb=lambda c: watch.destroyed("mcast destroy_cb"))
        self.service = register_service(self.al, name="hot-remove", service_id=SERVICE_ID,
                                        port_guid=guid,
                                        destroy_cb=lambda c: watch.destroyed("svc destroy_cb"))

    def _cm_connect(self, w: World) -> None:
        """A CM connection victim → peer, established (REQ, REP, RTU)."""
        import ibal.cm

        if w.listener is None:
            w.listener = ibal.cm.listen(w.peer_al, CM_SERVICE_ID)
        cq = self.ca.create_cq(16)
        self.cm_qp = self.ca.alloc_pd().create_qp(QpCreate(QpType.RC, cq, cq))
        pcq = w.peer_ca.create_cq(16)
        self.cm_peer_qp = w.peer_ca.alloc_pd().create_qp(QpCreate(QpType.RC, pcq, pcq))
        path = w.path(self.al, self.port)
        self.conn = ibal.cm.connect(self.al, self.cm_qp, path, CM_SERVICE_ID, b"hot",
                                    callback=lambda c: self.watch.hit("cm established"))
        self.peer_conn = w.listener.get(timeout=WAIT).accept(self.cm_peer_qp)
        self.conn.wait(WAIT)

    def peer_cleanup(self) -> None:
        """The peer application tears down its side of the dead connections (its objects
        hold this load's callbacks)."""
        for side in (self.loop.p, self.writer.p):
            side.qp.destroy(wait=True)
            side.mr.dereg()
            side.cq.destroy(wait=True)
            side.pd.dealloc(wait=True)
        self.peer_conn.close()
        self.cm_peer_qp.pd.dealloc(wait=True)
        self.cm_peer_qp.send_cq.destroy(wait=True)

    def _mad_recv(self, e: MadElement) -> None:
        self.watch.hit("mad recv")
        with self.mad.lock:
            self.mad.held.append(e)

    def _mad_sent(self, e: MadElement) -> None:
        if e.status is WcStatus.CANCELED and self.teardown.is_current():
            # The service's end reports the sends left CANCELED on the teardown queue,
            # with the destroy callbacks: that may come after the withdrawal returned.
            self.watch.destroyed("mad send_cb canceled")
        else:
            self.watch.hit("mad send_cb")
        with self.mad.lock:
            self.mad.ended.append(e.status)
        put_mad(e)

    def running(self, w: World) -> None:
        """Wait until every part is under way."""
        if self.sa:
            assert self.subscription.wait(WAIT).status is Status.SUCCESS
            # Its port's Reports come to it, though IOC discovery's SA port of the same
            # port opened first.
            sa_port = SaPort.open(self.al, self.port.port_guid)  # the subscription's, shared
            sa_port.close()  # a look only: the subscription keeps its hold
            assert sa_port.alive and "reports_elsewhere" not in sa_port.stats
            assert self.membership.wait(WAIT).status is Status.SUCCESS
            assert self.service.wait(WAIT).ok
        self._cm_connect(w)
        self.loop.start()
        self.writer.start()
        assert self.loop.started.wait(WAIT) and self.writer.ran.wait(WAIT)
        w.settle()
        assert len(self.mad.held) == 3 and self.mad.service.outstanding == 4
        assert self.mad.pool.outstanding == 7  # 4 sends waiting + 3 received, held


def _weak_refs(load: VictimLoad) -> list[weakref.ref[Any]]:
    """Weak references to the victim's objects, the SA ports of its port included."""
    objs: list[Any] = [load.ca, load.loop.v.qp, load.loop.v.cq, load.mad.service,
                       load.mad.service.alias, load.conn.handle, load.cm_qp]
    if load.sa:
        objs += [load.subscription, load.service, load.membership,
                 load.subscription._sa]  # the SaPort
    return [weakref.ref(o) for o in objs]


def _sweep(w: World, disc: Discovery) -> None:
    """One discovery sweep to its end (DM Gets to a withdrawn CA time out: step)."""
    handle = disc.sweep_now()
    for _ in range(400):
        if handle.done:
            break
        w.clock.advance(0.25, settle=w.settle)
    handle.wait(0)
    w.settle()


def _withdraw(w: World, al: AccessLayer, load: VictimLoad) -> None:
    """Withdraw the victim CA while ``load`` runs; check that nothing of it is left."""
    watch = load.watch
    guid = load.ca.guid
    assert _victim_objects(al, guid)
    w.withdraw(guid)  # returns once close_ca was called
    watch.gone.set()
    load.writer.join(WAIT)
    assert not load.writer.is_alive()
    w.settle()

    assert guid not in al.get_ca_guids()
    assert isinstance(load.writer.raised, InvalidHandle), load.writer.raised
    assert load.loop.posted > 4 and load.loop.sends_landed > 0
    # A completion callback running when the teardown began finds its QP gone.
    assert all(isinstance(e, InvalidHandle) for e in load.loop.errors), load.loop.errors
    assert not load.loop.peer_errors, load.loop.peer_errors
    assert not watch.after, f"callbacks after the withdrawal: {watch.after}"
    # Every handle of the CA is gone, and so is what hung on its port.
    handles: list[Any] = [load.ca, load.loop.v.qp, load.loop.v.cq, load.loop.v.pd,
                          load.loop.v.mr, load.mad.service, load.ioc]
    if load.sa:
        handles += [load.ud_qp, load.membership, load.subscription, load.service]
    for h in handles:
        assert not h.alive, h
    with pytest.raises(InvalidHandle):
        load.loop.v.qp.post_send(SendWr(wr_id=1, sg_list=[]))
    with pytest.raises(InvalidHandle):
        load.ca.query()
    assert _victim_objects(al, guid) == []
    # The DM agent of its port went with it, and its I/O unit exports nothing.
    dm = DmService.of(w.mgr)
    assert dm is not None and dm.agent(load.port.port_guid) is None
    assert _objects_on(dm.al, guid) == []
    assert not load.ioc.unit.exporting
    if load.sa:
        with pytest.raises(InvalidHandle):
            load.subscription.unsubscribe()
        names = ("sub destroy_cb", "mcast destroy_cb", "svc destroy_cb")
        assert {k: watch.counts.get(k) for k in names} == dict.fromkeys(names, 1)
    # The MAD service ended its sends CANCELED (send_cb put them back); the held receives
    # go back by the user's put_mad: the pool is whole again.
    assert not load.mad.service.alive
    assert load.mad.ended == [WcStatus.CANCELED] * 4
    assert watch.counts.get("mad send_cb canceled") == 4
    put_mad(load.mad.held)
    assert load.mad.pool.outstanding == 0
    # The CM: the victim's connection and the agent's port are gone, and so is the
    # victim's endpoint.  The peer's side heard the DREQ of the connection's destroy if
    # it left before the port went (then it is in TIMEWAIT), else nothing.
    from ibal.cm.service import agent_of

    agent = agent_of(w.mgr)
    assert not load.conn.handle.alive
    assert _objects_on(agent.al, guid) == []
    assert agent.endpoints == 1, agent
    assert load.peer_conn.state.name in ("ESTABLISHED", "TIMEWAIT")
    # Stepping time runs nothing for it.
    for _ in range(3):
        w.clock.advance(30.0, settle=w.settle)
    assert not watch.after, f"callbacks after the withdrawal: {watch.after}"


def test_hot_remove_during_traffic_leaves_nothing_then_hot_add_works(world: World) -> None:
    w = world
    threads_before = set(threading.enumerate())
    # IOC discovery (where there is an SA): the victim's IOC is found through the peer's
    # port too, and a sweep after the withdrawal reports it gone.
    iocs: list[tuple[PnpEvent, int]] = []
    disc = Discovery.start(w.mgr, interval=None) if w.sa else None
    if disc is not None:
        ioc_al = w.mgr.open_al()
        ioc_al.reg_pnp(PnpClass.IOC | PnpClass.FLAG_REG_SYNC,
                       lambda rec: iocs.append((rec.event, rec.guid)))
        _sweep(w, disc)
        w.clock.advance(30.0, settle=w.settle)  # its timers that were left armed expire
    timers_before = len(w.mgr.timers)
    al = w.mgr.open_al()
    order: list[tuple[str, PnpEvent, int]] = []

    def client(name: str) -> Any:
        def cb(rec: PnpRec) -> None:
            if rec.event is not PnpEvent.REG_COMPLETE:
                order.append((name, rec.event, rec.ca_guid))
        return cb

    user_ca = al.reg_pnp(PnpClass.CA, client("user"))
    al.reg_pnp(PnpClass.CA, client("subsystem"), order=PnpOrder.SA)  # registered later
    guid = w.victim_guid
    for cycle in range(2):
        iocs.clear()
        load = VictimLoad(w, al, CallbackWatch(), guid)
        load.running(w)
        ioc_guid = load.ioc.profile.ioc_guid
        if disc is not None:
            _sweep(w, disc)  # (a sweep a port change started may have found it already)
            assert (PnpEvent.IOC_ADD, ioc_guid) in iocs, iocs
            iocs.clear()
        order.clear()
        _withdraw(w, al, load)
        if disc is not None:  # its paths through the victim's port went with the CA ...
            assert _objects_on(disc.al, guid) == []
            _sweep(w, disc)  # ... and a sweep finds the IOC no more
            assert (PnpEvent.IOC_REMOVE, ioc_guid) in iocs, iocs
            w.clock.advance(30.0, settle=w.settle)  # the sweep's own timers expire
        assert order == [("user", PnpEvent.CA_REMOVE, guid),
                         ("subsystem", PnpEvent.CA_REMOVE, guid)]
        # No timer of the victim's objects is left.
        assert len(w.mgr.timers) == timers_before, w.mgr.timers._owned
        # Nothing holds the victim's objects once the application lets go of them.
        load.peer_cleanup()  # the peer's close: its DREQ to nobody times out
        for _ in range(5):
            w.clock.advance(30.0, settle=w.settle)
        from ibal.cm.service import agent_of

        assert agent_of(w.mgr).endpoints == 0 and agent_of(w.mgr).armed_timers() == 0
        refs = _weak_refs(load)
        del load
        gc.collect()
        assert [r() for r in refs if r() is not None] == []
        # A user client deregistered now gets nothing more (the fence) ...
        user_ca.dereg()
        user_ca = al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, client("user"))
        order.clear()
        # ... and a new one hears the CA come back after the subsystem.
        guid = w.add_again(cycle)
        w.settle()
        assert order == [("subsystem", PnpEvent.CA_ADD, guid), ("user", PnpEvent.CA_ADD, guid)]
        # The DM subsystem serves the new port at once; nothing is exported yet.
        port = al.query_ca_by_guid(guid).ports[0]
        dm = DmService.of(w.mgr)
        assert dm is not None and dm.agent(port.port_guid) is not None
        assert not port.cap & PortCap.IS_DEV_MGMT_SUPPORTED

    again = VictimLoad(w, al, CallbackWatch(), guid)
    again.running(w)
    assert again.loop.sends_landed > 0

    al.close(timeout=WAIT)
    again.writer.join(WAIT)
    assert isinstance(again.writer.raised, InvalidHandle), again.writer.raised
    w.close()
    assert len(w.mgr.timers) == 0
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert not leaked, leaked
