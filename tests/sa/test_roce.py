"""RoCE path resolution on canned routes and neighbour tables (no network, stepped clock)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from ibal.al.timer import TimerService
from ibal.clock import ManualClock
from ibal.sa import roce
from ibal.sa.roce import (
    NeedNeighbour,
    PathError,
    PathQuery,
    RoceAnswer,
    RocePath,
    RoceResolver,
    iboe_mtu,
    port_rate,
    rate_code,
)
from ibal.sa.roce_net import (
    RTN_LOCAL,
    IpAddress,
    LazyIpStack,
    Link,
    Neighbour,
    Route,
    RouteError,
)
from ibal.status import InvalidState, Status
from ibal.types import Gid, GidEntry, GidType, LinkLayer, LinkState, Mtu, PortAttr
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr
from ibal.wire.mad.header import SA_HEADER, SA_HEADER_OFFSET, header

ip = ipaddress.ip_address
MAC_A = bytes.fromhex("02aa00000001")
MAC_B = bytes.fromhex("02bb00000002")
MAC_GW = bytes.fromhex("02cc00000003")
NUD_REACHABLE, NUD_STALE, NUD_INCOMPLETE, NUD_FAILED = 0x02, 0x04, 0x01, 0x20


def v4gid(addr: str) -> Gid:
    return Gid("::ffff:" + addr)


def port(
    *gids: tuple[Gid, str], mtu: Mtu = Mtu.MTU_4096, speed: str = "10.0 Gbps", width: str = "4X"
) -> PortAttr:
    table = tuple(GidEntry(i, g, GidType.ROCE_V2, dev) for i, (g, dev) in enumerate(gids))
    return PortAttr(
        port_num=1, port_guid=0x1234, link_state=LinkState.ACTIVE, active_mtu=mtu,
        link_layer=LinkLayer.ETHERNET, active_speed=speed, active_width=width, gid_table=table,
    )  # fmt: skip


@dataclass
class FakeNet:
    """An IpStack from tables; ``answer_after`` probes, the neighbour becomes REACHABLE."""

    links: dict[int, Link]
    routes: dict[tuple[IpAddress, IpAddress | None], Route | RouteError]
    neighbours: dict[tuple[IpAddress, int], Neighbour] = field(default_factory=dict)
    hop_limit: int = 64
    probes: list[tuple[IpAddress, IpAddress | None, int]] = field(default_factory=list)
    on_probe: Callable[[FakeNet], None] | None = None
    oifs: list[int] = field(default_factory=list)

    def route(self, dst: IpAddress, src: IpAddress | None, oif: int = 0) -> Route:
        self.oifs.append(oif)
        r = self.routes.get((dst, src)) or self.routes.get((dst, None))
        if r is None:
            raise RouteError(101, "Network is unreachable")
        if isinstance(r, RouteError):
            raise r
        return r

    def link(self, key: int | str) -> Link:
        for x in self.links.values():
            if key in (x.index, x.name):
                return x
        raise KeyError(key)

    def neighbour(self, addr: IpAddress, ifindex: int) -> Neighbour | None:
        return self.neighbours.get((addr, ifindex))

    def probe(self, addr: IpAddress, src: IpAddress | None, ifindex: int) -> None:
        self.probes.append((addr, src, ifindex))
        if self.on_probe is not None:
            self.on_probe(self)

    def default_hop_limit(self, version: int, ifname: str) -> int:
        return self.hop_limit


ETH0 = Link(2, "eth0", MAC_A, 1500, 0x1043)
ETH1 = Link(3, "eth1", MAC_B, 9000, 0x1043)
LO = Link(1, "lo", bytes(6), 65536, 0x49)
SRC, DST, FAR, GW = ip("10.0.0.1"), ip("10.0.0.2"), ip("192.168.7.9"), ip("10.0.0.254")


def net(**kw: object) -> FakeNet:
    routes: dict[tuple[IpAddress, IpAddress | None], Route | RouteError] = {
        (DST, SRC): Route(DST, 2, src=SRC),
        (DST, None): Route(DST, 2, src=SRC),
        (FAR, SRC): Route(FAR, 2, src=SRC, gateway=GW),
        (SRC, SRC): Route(SRC, 1, kind=RTN_LOCAL, src=SRC),
    }
    return FakeNet({1: LO, 2: ETH0, 3: ETH1}, routes, **kw)  # type: ignore[arg-type]


def query(dgid: Gid, sgid: Gid | None = None, **given: int) -> bytes:
    return sa.PATH_RECORD.encode(dgid=dgid.packed, sgid=(sgid or Gid(0)).packed, **given)


def mask(*names: str) -> int:
    return sa.component_mask(sa.PATH_RECORD, names)


class Driver:
    """A RoceResolver on a manual clock; callbacks run inline when the clock is stepped."""

    def __init__(self, p: PortAttr, n: FakeNet) -> None:
        self.clock = ManualClock()
        self.timers = TimerService(lambda fn, *a: fn(*a), self.clock)
        self.net = n
        self.answers: list[RoceAnswer] = []
        self.resolver = RoceResolver(lambda: p, n, self.timers.call_later)

    def ask(
        self, data: bytes, comp_mask: int, method: int = Method.GET, **kw: int
    ) -> roce.RoceRequest:
        return self.resolver.request(method, data, comp_mask, callback=self.answers.append, **kw)

    def run(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)


P = port((v4gid("10.0.0.1"), "eth0"), (Gid("fe80::aa:ff:fe00:1"), "eth0"))
BOTH = mask("dgid", "sgid")
TO_DST = query(v4gid("10.0.0.2"), v4gid("10.0.0.1"))


def _no_timer(delay: float, fn: Callable[[], None]) -> roce.Cancellable:
    raise AssertionError("attempt() never schedules")


def look(n: FakeNet, data: bytes = TO_DST, comp: int = BOTH, p: PortAttr = P) -> object:
    """One attempt of a resolver on ``n``: a RocePath, a NeedNeighbour or PathError."""
    return RoceResolver(lambda: p, n, _no_timer).attempt(data, comp)


# ----------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("netdev", "code"),
    [(1500, 3), (1500 - 96 + 1, 3), (1024 + 96, 3), (1024 + 95, 2), (4096 + 96, 5),
     (9000, 5), (2048 + 96, 4), (256 + 96, 1), (256 + 95, 0), (65536, 5)],
)  # fmt: skip
def test_iboe_mtu_takes_the_roce_headers_off(netdev: int, code: int) -> None:
    assert iboe_mtu(netdev) == code


def test_rates() -> None:
    assert rate_code(2.5) == 2
    assert rate_code(40) == 7
    assert rate_code(45) == 7  # not faster than the link
    assert rate_code(1) == 2
    assert port_rate(port(speed="2.5 Gbps", width="1X")) == 2  # the rxe provider's port
    assert port_rate(port(speed="25.0 Gbps", width="4X")) == 16  # 100 Gb/s
    assert port_rate(port(speed="fast", width="4X")) == 2


def test_same_subnet_path_has_the_neighbours_mac_and_kernel_defaults() -> None:
    n = net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_REACHABLE, MAC_B)})
    path = look(n)
    assert isinstance(path, RocePath)
    assert path.dmac == MAC_B
    assert (path.netdev, path.sgid_index) == ("eth0", 0)
    rec = sa.PATH_RECORD.decode(path.encode())
    assert rec["dgid"] == v4gid("10.0.0.2").packed
    assert rec["sgid"] == v4gid("10.0.0.1").packed
    assert (rec["dlid"], rec["slid"], rec["p_key"], rec["reversible"]) == (0, 0, 0xFFFF, 1)
    assert (rec["mtu_selector"], rec["mtu"]) == (2, 3)  # 1500 - 96 -> 1024
    assert (rec["rate_selector"], rec["rate"]) == (2, 7)  # 10 Gb/s x 4
    assert (rec["packet_life_time_selector"], rec["packet_life_time"]) == (2, 16)
    assert (rec["hop_limit"], rec["tclass"], rec["sl"], rec["flow_label"]) == (64, 0, 0, 0)


def test_gateway_mac_route_mtu_and_hop_limit_metric() -> None:
    n = net(neighbours={(GW, 2): Neighbour(GW, 2, NUD_STALE, MAC_GW)})
    n.routes[(FAR, SRC)] = Route(FAR, 2, src=SRC, gateway=GW, mtu=1100, hop_limit=9)
    path = look(n, query(v4gid("192.168.7.9"), v4gid("10.0.0.1")))
    assert isinstance(path, RocePath)
    assert path.dmac == MAC_GW  # STALE is valid: the kernel uses it and re-confirms
    rec = sa.PATH_RECORD.decode(path.encode())
    assert (rec["mtu"], rec["hop_limit"]) == (2, 9)  # 1100 - 96 -> 512


def test_port_active_mtu_caps_the_path() -> None:
    p = port((v4gid("10.0.0.1"), "eth1"), mtu=Mtu.MTU_2048)
    n = net(neighbours={(DST, 3): Neighbour(DST, 3, NUD_REACHABLE, MAC_A)})
    n.routes[(DST, SRC)] = Route(DST, 3, src=SRC)
    path = look(n, p=p)
    assert isinstance(path, RocePath)
    assert path.record["mtu"] == 4  # 9000 fits 4096, the port is at 2048


def test_local_destination_uses_the_source_mac_without_neighbour() -> None:
    n = net()
    path = look(n, query(v4gid("10.0.0.1"), v4gid("10.0.0.1")))
    assert isinstance(path, RocePath)
    assert path.dmac == MAC_A and path.netdev == "eth0"
    assert n.probes == []


def test_unknown_neighbour_asks_for_a_probe() -> None:
    n = net()
    out = look(n)
    assert out == NeedNeighbour(DST, 2, SRC)


def test_route_through_another_netdev_is_no_path() -> None:
    n = net()
    n.routes[(DST, SRC)] = Route(DST, 3, src=SRC)
    with pytest.raises(PathError) as e:
        look(n)
    assert e.value.mad_status == MadStatus.SA_NO_RECORDS
    assert "eth1" in e.value.reason and "eth0" in e.value.reason


@pytest.mark.parametrize(
    ("data", "comp", "status", "words"),
    [
        (query(v4gid("10.0.0.2")), mask("sgid"), MadStatus.SA_INSUFFICIENT_COMPONENTS, "DGID"),
        (query(v4gid("10.0.0.2"), v4gid("10.9.9.9")), BOTH, MadStatus.SA_INVALID_GID, "10.9.9.9"),
        (query(v4gid("10.0.0.2"), Gid("fe80::aa:ff:fe00:1")), BOTH, MadStatus.SA_NO_RECORDS,
         "families"),
        (query(v4gid("10.0.0.2"), v4gid("10.0.0.1"), dlid=5), mask("dgid", "sgid", "dlid"),
         MadStatus.SA_NO_RECORDS, "LIDs"),
        (query(v4gid("10.0.0.2"), v4gid("10.0.0.1"), p_key=0x8001),
         mask("dgid", "sgid", "p_key"), MadStatus.SA_NO_RECORDS, "P_Key"),
        (query(Gid("ff0e::1"), Gid("fe80::aa:ff:fe00:1")), BOTH, MadStatus.SA_NO_RECORDS,
         "multicast"),
        (query(v4gid("172.16.0.1"), v4gid("10.0.0.1")), BOTH, MadStatus.SA_NO_RECORDS,
         "no route"),
        (b"short", BOTH, MadStatus.SA_REQ_INVALID, "PathRecord"),
    ],
    ids=["no-dgid", "foreign-sgid", "mixed-families", "dlid", "pkey", "multicast", "no-route",
         "short"],
)  # fmt: skip
def test_unusable_queries_say_why(data: bytes, comp: int, status: int, words: str) -> None:
    n = net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_REACHABLE, MAC_B)})
    with pytest.raises(PathError) as e:
        look(n, data, comp)
    assert e.value.mad_status == status
    assert words in e.value.reason


def test_no_sgid_takes_the_routes_preferred_source() -> None:
    n = net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_REACHABLE, MAC_B)})
    path = look(n, query(v4gid("10.0.0.2")), mask("dgid"))
    assert isinstance(path, RocePath)
    assert path.record["sgid"] == v4gid("10.0.0.1").packed


@pytest.mark.parametrize(
    ("given", "expect"),
    [
        ({"mtu_selector": 2, "mtu": 3}, ("mtu", 3)),
        ({"mtu_selector": 2, "mtu": 2}, ("mtu", 2)),  # exactly 512: a 1024 path carries it
        ({"mtu_selector": 2, "mtu": 4}, None),
        ({"mtu_selector": 0, "mtu": 2}, ("mtu", 3)),
        ({"mtu_selector": 0, "mtu": 3}, None),
        ({"mtu_selector": 1, "mtu": 3}, ("mtu", 2)),
        ({"mtu_selector": 1, "mtu": 1}, None),
        ({"mtu_selector": 3, "mtu": 1}, ("mtu", 3)),
        ({"rate_selector": 2, "rate": 3}, ("rate", 3)),  # 10 Gb/s on a 40 Gb/s port
        ({"rate_selector": 2, "rate": 16}, None),  # 100 Gb/s
        ({"rate_selector": 1, "rate": 7}, ("rate", 4)),  # below 40: 30 Gb/s
        ({"rate_selector": 0, "rate": 7}, None),
        ({"packet_life_time_selector": 2, "packet_life_time": 18}, ("packet_life_time", 18)),
        ({"packet_life_time_selector": 2, "packet_life_time": 12}, None),
        ({"packet_life_time_selector": 0, "packet_life_time": 17}, ("packet_life_time", 18)),
        ({"packet_life_time_selector": 1, "packet_life_time": 16}, None),
        ({"packet_life_time_selector": 1, "packet_life_time": 17}, ("packet_life_time", 16)),
        ({"sl": 5, "tclass": 0x60, "flow_label": 0x12345, "hop_limit": 3},
         ("sl", 5)),
        ({"sl": 9}, None),
    ],
)  # fmt: skip
def test_selectors_are_honoured_or_no_records(
    given: dict[str, int], expect: tuple[str, int] | None
) -> None:
    n = net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_REACHABLE, MAC_B)})
    data = query(v4gid("10.0.0.2"), v4gid("10.0.0.1"), **given)
    comp = mask("dgid", "sgid", *given)
    if expect is None:
        with pytest.raises(PathError) as e:
            look(n, data, comp)
        assert e.value.mad_status == MadStatus.SA_NO_RECORDS
        return
    path = look(n, data, comp)
    assert isinstance(path, RocePath)
    assert path.record[expect[0]] == expect[1]
    for k in ("tclass", "flow_label", "hop_limit"):
        if k in given:
            assert path.record[k] == given[k]


def test_query_decode_keeps_only_masked_components() -> None:
    q = PathQuery.decode(
        query(v4gid("10.0.0.2"), v4gid("10.0.0.1"), sl=3, mtu=4), mask("dgid", "sl")
    )
    assert q.sgid is None and q.given == {"sl": 3}


# ----------------------------------------------------------------- the driver


def _records(a: RoceAnswer) -> list[dict[str, int | bytes]]:
    return [sa.PATH_RECORD.decode(r) for r in a.records]


def test_get_answers_like_an_sa() -> None:
    d = Driver(P, net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_REACHABLE, MAC_B)}))
    req = d.ask(TO_DST, BOTH)
    assert d.answers == []  # nothing happens on the caller's thread
    d.run()
    (a,) = d.answers
    assert req.done and req.wait(0) is a
    assert (a.status, a.mad_status, a.method, a.attr_id) == (
        Status.SUCCESS, 0, Method.GET_RESP, SaAttr.PATH_RECORD)  # fmt: skip
    assert _records(a)[0]["dgid"] == v4gid("10.0.0.2").packed
    h = header(a.mad)
    assert (h.mgmt_class, h.attr_id, h.status) == (3, SaAttr.PATH_RECORD, 0)
    assert h.method == Method.GET_RESP
    sa_hdr = SA_HEADER.decode(a.mad, SA_HEADER_OFFSET)
    assert (sa_hdr["attr_offset"], sa_hdr["comp_mask"]) == (8, BOTH)
    assert a.mad[56 : 56 + 64] == a.records[0]
    assert a.path is not None and a.path.dmac == MAC_B


def test_get_table_with_no_path_is_an_empty_table_and_get_an_sa_error() -> None:
    d = Driver(P, net())
    d.ask(query(v4gid("172.16.0.1"), v4gid("10.0.0.1")), BOTH, Method.GET_TABLE)
    d.ask(query(v4gid("172.16.0.1"), v4gid("10.0.0.1")), BOTH, Method.GET)
    d.run()
    table, get = d.answers
    assert (table.status, table.records) == (Status.SUCCESS, ())
    assert table.method == Method.GET_TABLE_RESP
    assert SA_HEADER.decode(table.mad, SA_HEADER_OFFSET)["attr_offset"] == 0
    assert (get.status, get.mad_status, get.method) == (
        Status.REMOTE_ERROR, MadStatus.SA_NO_RECORDS, Method.GET_RESP)  # fmt: skip
    assert header(get.mad).status == MadStatus.SA_NO_RECORDS
    assert "no route" in get.detail


def test_missing_neighbour_is_probed_and_polled_until_it_answers() -> None:
    n = net()
    d = Driver(P, n)
    d.ask(TO_DST, BOTH, timeout_ms=100, retry_cnt=0)
    d.run()
    assert n.probes == [(DST, SRC, 2)] and d.answers == []
    n.neighbours[(DST, 2)] = Neighbour(DST, 2, NUD_INCOMPLETE)
    d.run(0.01)
    assert d.answers == []
    n.neighbours[(DST, 2)] = Neighbour(DST, 2, NUD_REACHABLE, MAC_B)
    d.run(0.064)  # the poll interval is at most 64 ms
    (a,) = d.answers
    assert a.status is Status.SUCCESS and a.path is not None and a.path.dmac == MAC_B
    assert len(n.probes) == 1


def test_unanswered_neighbour_times_out_after_every_try() -> None:
    n = net()
    d = Driver(P, n)
    d.ask(TO_DST, BOTH, timeout_ms=200, retry_cnt=2)
    d.run()
    d.run(0.599)
    assert d.answers == []
    assert len(n.probes) == 3  # one per try
    d.run(0.002)
    (a,) = d.answers
    assert a.status is Status.TIMEOUT and "10.0.0.2" in a.detail
    assert (a.records, a.mad) == ((), b"")


def test_failed_neighbour_is_probed_again() -> None:
    n = net(neighbours={(DST, 2): Neighbour(DST, 2, NUD_FAILED)})
    d = Driver(P, n)
    d.ask(TO_DST, BOTH, timeout_ms=50, retry_cnt=0)
    d.run()
    d.run(0.003)
    assert len(n.probes) >= 3  # each look at a FAILED entry asks again


def test_cancel_calls_back_once_with_canceled() -> None:
    d = Driver(P, net())
    req = d.ask(TO_DST, BOTH)
    d.run()
    req.cancel()
    req.cancel()
    d.run(5)
    (a,) = d.answers
    assert a.status is Status.CANCELED and req.done


def test_route_change_between_polls_is_seen() -> None:
    """Each poll re-reads the route: a neighbour learnt on a new next hop completes."""
    n = net()
    d = Driver(P, n)
    d.ask(query(v4gid("192.168.7.9"), v4gid("10.0.0.1")), BOTH, timeout_ms=100, retry_cnt=0)
    d.run()
    assert n.probes == [(GW, SRC, 2)]
    n.neighbours[(GW, 2)] = Neighbour(GW, 2, NUD_REACHABLE, MAC_GW)
    d.run(0.1)
    (a,) = d.answers
    assert a.path is not None and a.path.dmac == MAC_GW and a.path.route.gateway == GW


def test_docs_example_runs() -> None:
    """The example of docs/sa.md's "RoCE paths" runs as written (lo, no privileges)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sa.md").read_text()
    section = doc[doc.index("### Example: a path over loopback") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    exec(compile(block.group(1), "docs/sa.md: RoCE paths", "exec"), {})


class _FakeCa:
    def __init__(self, p: PortAttr) -> None:
        self.p = p

    def query_port(self, port_num: int) -> PortAttr:
        assert port_num == self.p.port_num
        return self.p


class _FakeSaPort:
    """The part of an ibal.sa.port.SaPort that roce.start uses."""

    def __init__(self, p: PortAttr, timers: TimerService) -> None:
        self.ca = _FakeCa(p)
        self.port_num = p.port_num
        self.timers = timers

    def call_later(
        self, delay: float, fn: Callable[..., object], *args: object
    ) -> roce.Cancellable:
        return self.timers.call_later(delay, fn, *args)


LO_PORT = port((v4gid("127.0.0.1"), "lo"))


def test_start_answers_for_a_port_and_keeps_one_resolver_per_port() -> None:
    """The SaPort hook, on this host's real lo (no privileges): a local path."""
    import gc

    clock = ManualClock()
    timers = TimerService(lambda fn, *a: fn(*a), clock)
    sa_port = _FakeSaPort(LO_PORT, timers)
    answers: list[RoceAnswer] = []
    data = query(v4gid("127.0.0.1"), v4gid("127.0.0.1"))
    req = roce.start(sa_port, Method.GET_TABLE, data, BOTH, timeout_ms=100, retry_cnt=0,
                     callback=answers.append)  # fmt: skip
    assert roce.resolver_for(sa_port) is roce.resolver_for(sa_port)
    clock.advance(0)
    (a,) = answers
    assert req.done and a.status is Status.SUCCESS and a.method == Method.GET_TABLE_RESP
    assert a.path is not None and a.path.netdev == "lo" and a.path.route.local
    net = roce.resolver_for(sa_port).net
    assert isinstance(net, LazyIpStack)
    del sa_port, req
    gc.collect()
    with pytest.raises(OSError):  # the port went: its IP stack's sockets are closed
        net.route(ip("127.0.0.1"), None)


def test_a_refused_timer_ends_the_request_canceled() -> None:
    """A step that cannot arm its next poll (the AL's timers closed meanwhile) answers
    CANCELED instead of leaving the request unanswered."""

    class Armed:
        def cancel(self) -> bool:
            return True

    def later(delay: float, fn: Callable[[], None]) -> roce.Cancellable:
        if delay == 0:
            fn()  # the first step at once
            return Armed()
        raise InvalidState("the timer scope is closed")

    answers: list[RoceAnswer] = []
    n = net()
    RoceResolver(lambda: P, n, later).request(Method.GET, TO_DST, BOTH, callback=answers.append)
    (a,) = answers
    assert a.status is Status.CANCELED and "closed" in a.detail
    assert n.probes == [(DST, SRC, 2)]


def test_probe_schedule() -> None:
    s = roce.ProbeSchedule(timeout_ms=10, retry_cnt=1)
    steps = []
    while True:
        probe, delay = s.next()
        steps.append((probe, delay))
        if delay is None:
            break
    first = [(True, 0.001), (False, 0.002), (False, 0.004), (False, pytest.approx(0.003))]
    assert steps == [*first, *first, (False, None)]  # two tries, each probing once
    assert sum(d for _, d in steps if d is not None) == pytest.approx(0.020)
    late = roce.ProbeSchedule(timeout_ms=1000, retry_cnt=0)
    delays = [late.next()[1] for _ in range(10)]
    assert delays[6:] == [0.064] * 4  # doubling stops at 64 ms


def test_link_local_destination_is_looked_up_on_the_gids_netdev() -> None:
    peer, mine = ip("fe80::bb"), ip("fe80::aa:ff:fe00:1")
    n = net(neighbours={(peer, 2): Neighbour(peer, 2, NUD_REACHABLE, MAC_B)})
    n.routes[(peer, mine)] = Route(peer, 2, src=mine)
    path = look(n, query(Gid("fe80::bb"), Gid("fe80::aa:ff:fe00:1")))
    assert isinstance(path, RocePath) and path.dmac == MAC_B
    assert n.oifs == [2]  # eth0, the netdev of GID 1
    n2 = net()
    look(n2)
    assert n2.oifs == [0]  # a routable destination: whatever interface the route says
