"""RoCE path resolution against the real IP stack: rxe devices over loopback and over a
veth pair between two network namespaces (root and iproute2; the namespaces are
this test's own and are deleted afterwards).

The resolver runs as in an access layer: on the AL's timers, its port
attributes from the rxe CA's ``query``, its IP stack made inside the device's
namespace.  What it resolves is compared with what the kernel's own tables say
(``ip neigh``, ``ip link``) for the same destination.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import ibal.sa
from ibal.al import AccessLayer, AlManager, Ca
from ibal.providers.rxe.provider import RxeProvider
from ibal.sa import GidPair, QueryRec, QueryReq, QueryType, SaPort
from ibal.sa.roce import RoceAnswer, RoceResolver
from ibal.sa.roce_net import NetlinkIpStack
from ibal.status import Status, Unsupported
from ibal.testing.helpers import active_port
from ibal.types import Gid, Mtu, PortAttr
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr

_CLONE_NEWNET = 0x40000000
WAIT = 20.0


def _need() -> None:
    missing = None
    if shutil.which("ip") is None:
        missing = "needs the `ip` command (Debian package iproute2)"
    elif os.geteuid() != 0:
        missing = "needs root (network namespaces, rxe's raw sockets)"
    if missing is None:
        return
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{missing} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(missing)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Ns:
    """A throw-away network namespace."""

    def __init__(self, tag: str) -> None:
        self.name = f"ibal-roce-{tag}-{os.getpid()}-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=30)
        self.ip("link", "set", "lo", "up")

    def ip(self, *args: str) -> str:
        done = subprocess.run(
            ["ip", "-n", self.name, *args], check=True, timeout=30, capture_output=True, text=True
        )
        return done.stdout

    def json(self, *args: str) -> list[dict[str, object]]:
        out = json.loads(self.ip("-j", *args) or "[]")
        assert isinstance(out, list)
        return out

    def sysctl(self, setting: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.name, "sysctl", "-qw", setting], check=True, timeout=30
        )

    def sysctl_get(self, setting: str) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.name, "sysctl", "-n", setting],
                              check=True, timeout=30, capture_output=True, text=True)  # fmt: skip
        return done.stdout.strip()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        with (
            open("/proc/thread-self/ns/net", "rb") as orig,
            open(f"/run/netns/{self.name}", "rb") as target,
        ):
            _setns(target.fileno())
            try:
                yield
            finally:
                _setns(orig.fileno())

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], check=False, timeout=30)


@dataclass
class Side:
    """An rxe device in namespace A (on ``va`` and on lo) with a resolver, and B's MAC."""

    a: Ns
    b: Ns
    al: AccessLayer
    ca: Ca
    lo_ca: Ca
    resolver: RoceResolver
    lo_resolver: RoceResolver
    peer_mac: bytes
    port: PortAttr

    def ask(
        self, dgid: str, sgid: str, *, lo: bool = False, method: int = Method.GET, **kw: int
    ) -> RoceAnswer:
        data = sa.PATH_RECORD.encode(dgid=Gid(dgid).packed, sgid=Gid(sgid).packed)
        mask = sa.component_mask(sa.PATH_RECORD, ["dgid", "sgid"])
        r = self.lo_resolver if lo else self.resolver
        req = r.request(method, data, mask, callback=lambda a: None, **kw)
        return req.wait(WAIT)


@pytest.fixture(scope="module")
def side() -> Iterator[Side]:
    _need()
    a, b = Ns("a"), Ns("b")
    mgr = None
    try:
        a.ip("link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b.name)
        for ns, dev, v4, v6 in ((a, "va", "10.77.0.1/24", "fd77::1/64"),
                                (b, "vb", "10.77.0.2/24", "fd77::2/64")):  # fmt: skip
            ns.sysctl(f"net.ipv6.conf.{dev}.accept_dad=0")
            ns.ip("link", "set", dev, "mtu", "2200")
            ns.ip("addr", "add", v4, "dev", dev)
            ns.ip("addr", "add", v6, "dev", dev, "nodad")
            ns.ip("link", "set", dev, "up")
        # a gatewayed net with route metrics, and a net on another interface
        a.ip("route", "add", "10.78.0.0/24", "via", "10.77.0.2", "hoplimit", "7", "mtu", "1100")
        a.ip("link", "add", "other", "type", "veth", "peer", "name", "otherp")
        a.ip("addr", "add", "10.80.0.1/24", "dev", "other")
        a.ip("link", "set", "otherp", "up")
        a.ip("link", "set", "other", "up")
        peer_mac = bytes.fromhex(str(b.json("link", "show", "vb")[0]["address"]).replace(":", ""))
        with a.entered():
            mgr = AlManager()
            mgr.add_provider(RxeProvider({"devices": "rxe_ra=va,rxe_rlo=127.0.0.2"}))
            al = mgr.open_al()
            net = NetlinkIpStack()
        cas = {c.name: c for c in (al.open_ca(g) for g in al.get_ca_guids())}
        ca, lo_ca = cas["rxe_ra"], cas["rxe_rlo"]

        def port_of(c: Ca) -> PortAttr:
            p = active_port(c.query().ports)
            assert p is not None
            return p

        def later(delay: float, fn: object) -> object:
            return al.timers.call_later(delay, fn)  # type: ignore[arg-type]

        res = RoceResolver(lambda: port_of(ca), net, later)  # type: ignore[arg-type]
        lo_res = RoceResolver(lambda: port_of(lo_ca), net, later)  # type: ignore[arg-type]
        yield Side(a, b, al, ca, lo_ca, res, lo_res, peer_mac, port_of(ca))
        net.close()
    finally:
        if mgr is not None:
            mgr.close()
        a.delete()
        b.delete()


def _neigh_mac(ns: Ns, addr: str, dev: str) -> bytes | None:
    for n in ns.json("neigh", "show", addr, "dev", dev):
        if "lladdr" in n:
            return bytes.fromhex(str(n["lladdr"]).replace(":", ""))
    return None


def test_veth_peer_mac_is_resolved_by_arp(side: Side) -> None:
    assert _neigh_mac(side.a, "10.77.0.2", "va") is None  # nothing known before
    a = side.ask("::ffff:10.77.0.2", "::ffff:10.77.0.1")
    assert a.status is Status.SUCCESS, a.detail
    assert a.path is not None and a.path.dmac == side.peer_mac
    assert _neigh_mac(side.a, "10.77.0.2", "va") == side.peer_mac  # what the kernel learnt
    (rec,) = [sa.PATH_RECORD.decode(r) for r in a.records]
    # veth MTU 2200: 2200 - 96 carries 2048, and so does the rxe port (2200 - 80)
    assert side.port.active_mtu is Mtu.MTU_2048
    assert (rec["mtu"], rec["hop_limit"], rec["rate"]) == (4, 64, 2)
    assert rec["sgid"] == Gid("::ffff:10.77.0.1").packed
    assert a.path.netdev == "va" and a.path.sgid_index == side.port.gid_table[1].index


def test_ipv6_peer_mac_is_resolved_by_neighbour_discovery(side: Side) -> None:
    a = side.ask("fd77::2", "fd77::1")
    assert a.status is Status.SUCCESS, a.detail
    assert a.path is not None and a.path.dmac == side.peer_mac
    assert _neigh_mac(side.a, "fd77::2", "va") == side.peer_mac


def test_link_local_gids_route_out_of_the_gids_netdev(side: Side) -> None:
    """fe80:: destinations exist only per link: the lookup is scoped to the GID's netdev
    (index 0, the default GID from va's MAC), and neighbour discovery runs there."""
    peer = "fe80::" + _eui64_tail(side.peer_mac)
    a = side.ask(peer, str(side.port.gid_table[0].gid))
    assert a.status is Status.SUCCESS, a.detail
    assert a.path is not None and a.path.dmac == side.peer_mac and a.path.netdev == "va"
    assert _neigh_mac(side.a, peer, "va") == side.peer_mac


def _eui64_tail(mac: bytes) -> str:
    m = bytes((mac[0] ^ 2, *mac[1:3], 0xFF, 0xFE, *mac[3:]))
    return ":".join(m[i : i + 2].hex() for i in range(0, 8, 2))


def test_gateway_route_metrics(side: Side) -> None:
    a = side.ask("::ffff:10.78.0.9", "::ffff:10.77.0.1")
    assert a.status is Status.SUCCESS, a.detail
    assert a.path is not None and a.path.dmac == side.peer_mac  # the gateway's MAC
    assert str(a.path.route.gateway) == "10.77.0.2"
    (rec,) = [sa.PATH_RECORD.decode(r) for r in a.records]
    assert (rec["mtu"], rec["hop_limit"]) == (2, 7)  # route mtu 1100 -> 512, hoplimit 7


def test_silent_neighbour_times_out(side: Side) -> None:
    a = side.ask("::ffff:10.77.0.99", "::ffff:10.77.0.1", timeout_ms=150, retry_cnt=1)
    assert a.status is Status.TIMEOUT and "10.77.0.99" in a.detail


def test_route_through_another_interface_is_no_record(side: Side) -> None:
    a = side.ask("::ffff:10.80.0.5", "::ffff:10.77.0.1")
    assert (a.status, a.mad_status) == (Status.REMOTE_ERROR, MadStatus.SA_NO_RECORDS)
    assert "other" in a.detail
    t = side.ask("::ffff:10.80.0.5", "::ffff:10.77.0.1", method=Method.GET_TABLE)
    assert (t.status, t.records) == (Status.SUCCESS, ())


def test_loopback_device_path(side: Side) -> None:
    """An rxe device on lo (127.0.0.2) to a local address: the kernel's loopback rule
    (the source's own MAC, no ARP) and lo's MTU."""
    a = side.ask("::ffff:127.0.0.3", "::ffff:127.0.0.2", lo=True)
    assert a.status is Status.SUCCESS, a.detail
    assert a.path is not None and a.path.dmac == bytes(6) and a.path.netdev == "lo"
    assert a.path.route.local
    (rec,) = [sa.PATH_RECORD.decode(r) for r in a.records]
    assert rec["mtu"] == 5


def test_sa_port_answers_path_records_on_the_rxe_port(side: Side) -> None:
    """The one path API: SaPort.request of PathRecords on the Ethernet port is answered
    by ibal.sa.roce, with the SaAnswer an SA sends; requests made on this thread (not in
    the namespace) are resolved in the AL's namespace."""
    sa_port = SaPort.open(side.al, side.port.port_guid)
    try:
        data = sa.PATH_RECORD.encode(dgid=Gid("::ffff:10.77.0.2").packed,
                                     sgid=Gid("::ffff:10.77.0.1").packed)  # fmt: skip
        mask = sa.component_mask(sa.PATH_RECORD, ["dgid", "sgid"])
        got: list[object] = []
        req = sa_port.request(Method.GET_TABLE, SaAttr.PATH_RECORD, data, mask,
                              callback=got.append)  # fmt: skip
        a = req.wait(WAIT)
        assert a.status is Status.SUCCESS, a.detail
        assert (a.method, a.attr_id) == (Method.GET_TABLE_RESP, SaAttr.PATH_RECORD)
        (rec,) = [sa.PATH_RECORD.decode(r) for r in a.records]
        assert rec["dgid"] == Gid("::ffff:10.77.0.2").packed and rec["mtu"] == 4
        assert got == [a]
        assert req.roce is not None and req.roce.answer is not None
        assert req.roce.answer.path is not None
        assert req.roce.answer.path.dmac == side.peer_mac
        with pytest.raises(Unsupported):
            sa_port.request(Method.GET, SaAttr.NODE_RECORD)
        silent = sa.PATH_RECORD.encode(dgid=Gid("::ffff:10.77.0.98").packed,
                                       sgid=Gid("::ffff:10.77.0.1").packed)  # fmt: skip
        req = sa_port.request(Method.GET, SaAttr.PATH_RECORD, silent, mask, timeout_ms=10_000)
        req.cancel()
        assert req.wait(WAIT).status is Status.CANCELED
        assert req.roce is not None and req.roce.wait(WAIT).status is Status.CANCELED
        req = sa_port.request(Method.GET, SaAttr.PATH_RECORD, silent, mask, timeout_ms=10_000)
    finally:
        sa_port.close()
    # closing the port ends what is pending: the SA request and its resolution
    assert req.wait(WAIT).status is Status.CANCELED
    assert req.roce is not None and req.roce.wait(WAIT).status is Status.CANCELED


def _expected_mtu(ns: Ns, dev: str, port: PortAttr) -> int:
    """The IB MTU code that fits the interface's MTU less 96 bytes of RoCE headers."""
    link_mtu = int(str(ns.json("link", "show", dev)[0]["mtu"]))
    fits = [m for m in Mtu if 128 << m <= link_mtu - 96 and m <= port.active_mtu]
    return int(max(fits))


def test_public_query_api_on_the_rxe_port(side: Side) -> None:
    """ibal.sa.path_records and ib_query's PATH_REC_BY_GIDS on the Ethernet port answer
    as on IB, from the kernel's tables; a non-path query raises Unsupported."""
    # fresh addresses on B: nothing in A's neighbour table before these queries
    side.b.ip("addr", "add", "10.77.0.21/24", "dev", "vb")
    side.b.ip("addr", "add", "fd77::21/64", "dev", "vb", "nodad")
    assert _neigh_mac(side.a, "10.77.0.21", "va") is None
    mtu = _expected_mtu(side.a, "va", side.port)
    ttl = int(side.a.sysctl_get("net.ipv4.ip_default_ttl"))
    pg = side.port.port_guid
    src, dst = "::ffff:10.77.0.1", "::ffff:10.77.0.21"
    (rec,) = ibal.sa.path_records(side.al, Gid(src), Gid(dst), port_guid=pg, timeout_ms=5000)
    assert (rec["dgid"], rec["sgid"]) == (Gid(dst).packed, Gid(src).packed)
    assert (rec["mtu"], rec["hop_limit"], rec["dlid"], rec["p_key"]) == (mtu, ttl, 0, 0xFFFF)
    assert _neigh_mac(side.a, "10.77.0.21", "va") == side.peer_mac  # resolved by ARP

    got: list[QueryRec] = []
    q = ibal.sa.query(side.al, QueryReq(
        query_type=QueryType.PATH_REC_BY_GIDS,
        query_input=GidPair(src_gid="fd77::1", dest_gid="fd77::21"), port_guid=pg,
        timeout_ms=5000, query_context="ctx", callback=got.append))  # fmt: skip
    qr = q.wait(WAIT)
    assert got == [qr]
    assert (qr.status, qr.result_cnt, qr.context) == (Status.SUCCESS, 1, "ctx"), qr.detail
    assert qr.result_mad is not None
    pr = ibal.sa.get_query_path_rec(qr.result_mad, 0)
    assert (pr["dgid"], pr["sgid"]) == (Gid("fd77::21").packed, Gid("fd77::1").packed)
    hop6 = int(side.a.sysctl_get("net.ipv6.conf.va.hop_limit"))
    assert (pr["mtu"], pr["hop_limit"]) == (mtu, hop6)
    assert _neigh_mac(side.a, "fd77::21", "va") == side.peer_mac  # resolved by ND

    with pytest.raises(Unsupported):
        ibal.sa.query(side.al, QueryReq(query_type=QueryType.NODE_REC_BY_NODE_GUID,
                                        query_input=1, port_guid=pg))  # fmt: skip
    with pytest.raises(Unsupported):
        ibal.sa.node_records(side.al, lid=1, port_guid=pg)
