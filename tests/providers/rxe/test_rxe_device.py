"""rxe devices: configuration, GID table and GUIDs, port state following the interface."""

from __future__ import annotations

import errno
import ipaddress
import queue
import subprocess
import threading
from pathlib import Path

import pytest
from netns_util import Netns, netns

from ibal.providers.rxe import netif
from ibal.providers.rxe.counters import DeviceCounters
from ibal.providers.rxe.device import (
    RXE_LIMITS,
    ConfigError,
    Device,
    DeviceEvent,
    DeviceSpec,
    Registry,
    config_path,
    load_config,
    parse_devices,
    startup_specs,
)
from ibal.transport.qp import Counters
from ibal.types import AsyncEvent, Gid, GidType, LinkLayer, LinkState, Mtu
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet

WAIT = 20.0  # generous: events come from the kernel through a thread


# ----------------------------------------------------------------- config


def test_env_var_binds_devices_to_interfaces_and_addresses() -> None:
    specs = parse_devices("rxe0=tap0, rxe1=127.0.0.2,rxe2=fd00::5")
    assert [(s.name, s.netdev, s.address) for s in specs] == [
        ("rxe0", "tap0", None),
        ("rxe1", None, ipaddress.ip_address("127.0.0.2")),
        ("rxe2", None, ipaddress.ip_address("fd00::5")),
    ]
    assert parse_devices("") == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("rxe0", "name=netdev"),
        ("rxe0=lo,rxe0=127.0.0.2", "given twice"),
        ("rxe0=a/b", "neither"),
        ("=lo", "bad device name"),
        ("rxe0=averyveryverylongname", "neither"),
    ],
)
def test_env_var_errors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_devices(text)


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "rxe.toml"
    path.write_text(
        '[devices.rxe0]\nnetdev = "eth0"\n'
        '[devices.rxe1]\naddress = "127.0.0.3"\nrx_mode = "udp"\ncapture = "/tmp/x.pcap"\n'
    )
    a, b = load_config(path)
    assert (a.name, a.netdev, a.rx_mode) == ("rxe0", "eth0", "raw")
    assert (b.name, b.address, b.rx_mode, b.capture) == (
        "rxe1", ipaddress.ip_address("127.0.0.3"), "udp", "/tmp/x.pcap",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('[devices.rxe0]\nnetdev = "lo"\naddress = "127.0.0.2"\n', "exactly one"),
        ("[devices.rxe0]\n", "exactly one"),
        ('[devices.rxe0]\nnetdev = "lo"\nspeed = 3\n', "unknown option 'speed'"),
        ('[devices.rxe0]\naddress = "300.1.1.1"\n', "devices.rxe0"),
        ('[devices.rxe0]\nnetdev = "lo"\nrx_mode = "fast"\n', "rx_mode"),
        ("[devices\n", "rxe.toml"),
    ],
)
def test_config_file_errors_name_the_file_and_device(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "rxe.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=says):
        load_config(path)


def test_startup_devices_env_then_file_then_loopback(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert config_path(home) == tmp_path / ".config" / "ibal" / "rxe.toml"
    assert config_path({**home, "XDG_CONFIG_HOME": "/x"}) == Path("/x/ibal/rxe.toml")
    assert [(s.name, s.netdev) for s in startup_specs(home)] == [("rxe0", "lo")]
    cfg = tmp_path / ".config" / "ibal" / "rxe.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[devices.rxe7]\naddress = "127.0.0.7"\n')
    assert [s.name for s in startup_specs(home)] == ["rxe7"]
    assert [s.name for s in startup_specs({**home, "IBAL_RXE_DEVICES": "rxe9=lo"})] == ["rxe9"]
    assert startup_specs({**home, "IBAL_RXE_DEVICES": ""}) == []
    other = tmp_path / "other.toml"
    other.write_text('[devices.rxe3]\nnetdev = "lo"\n')
    assert [s.name for s in startup_specs({**home, "IBAL_RXE_CONFIG": str(other)})] == ["rxe3"]


# ----------------------------------------------------------------- GIDs and GUIDs


def test_eui64_guid_and_default_gid_follow_the_mac() -> None:
    mac = bytes.fromhex("021122334455")
    assert netif.eui64(mac) == bytes.fromhex("001122fffe334455")
    assert netif.guid(mac) == 0x001122FFFE334455
    assert netif.default_gid(mac) == Gid("fe80::11:22ff:fe33:4455")
    # kernel rxe on lo (all-zero MAC), seen in the lab: node_guid 0200:00ff:fe00:0000
    assert netif.guid(bytes(6)) == 0x020000FFFE000000
    assert netif.default_gid(bytes(6)) == Gid("fe80::200:ff:fe00:0")


@pytest.mark.parametrize(
    ("mtu", "ib"),
    [(65536, Mtu.MTU_4096), (4176, Mtu.MTU_4096), (4175, Mtu.MTU_2048), (1500, Mtu.MTU_1024),
     (1104, Mtu.MTU_1024), (1103, Mtu.MTU_512), (576, Mtu.MTU_256), (68, Mtu.MTU_256)],
)  # fmt: skip
def test_active_mtu_is_the_largest_ib_mtu_below_netdev_mtu_less_80(mtu: int, ib: Mtu) -> None:
    assert netif.active_mtu(mtu) is ib


def test_device_on_lo_reports_what_kernel_rxe_reports() -> None:
    with netns() as ns, ns.entered():
        reg = Registry()
        try:
            dev = reg.create(DeviceSpec("rxe0", netdev="lo"))
            # `ibv_devinfo -v` of kernel rxe on lo in the lab (Debian 6.1):
            assert [(e.index, e.gid, e.gid_type, e.netdev) for e in dev.gid_table] == [
                (0, Gid("fe80::200:ff:fe00:0"), GidType.ROCE_V2, "lo"),
                (1, Gid("::ffff:127.0.0.1"), GidType.ROCE_V2, "lo"),
                (2, Gid("::1"), GidType.ROCE_V2, "lo"),
            ]
            attr = dev.ca_attr()
            assert attr.ca_guid == attr.system_image_guid == 0x020000FFFE000000
            assert (attr.vendor_id, attr.max_qps, attr.max_cqes, attr.max_srq_sges) == (
                0xFFFFFF, 1048560, 32767, 27,
            )  # fmt: skip
            port = attr.port(1)
            assert port.port_guid == 0x020000FFFE000000
            assert port.link_state is LinkState.ACTIVE
            assert (port.active_mtu, port.max_mtu) == (Mtu.MTU_4096, Mtu.MTU_4096)
            assert port.pkeys == (0xFFFF,)
            assert port.link_layer is LinkLayer.ETHERNET
            assert port.gids[1] == Gid("::ffff:127.0.0.1")
            assert sorted(map(str, dev.io.addresses)) == ["127.0.0.1", "::1"]
            info = dev.info()
            assert (info["netdev"], info["state"], info["node_guid"]) == (
                "lo", "ACTIVE", "020000fffe000000",
            )  # fmt: skip
            counters = info["counters"]
            assert isinstance(counters, dict)
            assert counters["link_downed"] == 0 and counters["drop_bad_icrc"] == 0
        finally:
            reg.close()


def _dummy(ns: Netns, name: str = "dum0") -> None:
    """An Ethernet-like interface ``name`` with a known MAC and addresses: a veth
    whose peer (``name``-p) is up, so it has carrier (some kernels lack ``dummy``)."""
    ns.ip("link", "add", name, "type", "veth", "peer", "name", f"{name}p")
    ns.ip("link", "set", f"{name}p", "up")
    ns.ip("link", "set", name, "address", "02:11:22:33:44:55", "mtu", "1500")
    # no duplicate address detection: the link-local address is usable at once
    subprocess.run(
        ["ip", "netns", "exec", ns.name, "sysctl", "-qw", f"net.ipv6.conf.{name}.accept_dad=0"],
        check=True,
        timeout=30,
    )
    ns.ip("addr", "add", "10.1.0.1/24", "dev", name)
    ns.ip("addr", "add", "fd00::1/64", "dev", name, "nodad")
    ns.ip("link", "set", name, "up")


class Events:
    """Device events as they come, waited for with a timeout (no sleeps)."""

    def __init__(self) -> None:
        self.q: queue.Queue[DeviceEvent] = queue.Queue()

    def __call__(self, ev: DeviceEvent) -> None:
        self.q.put(ev)

    def wait_for(self, event: AsyncEvent, until: object = None) -> None:
        while True:
            ev = self.q.get(timeout=WAIT)
            if ev.event is event and (until is None or until()):  # type: ignore[operator]
                return


def test_device_on_a_dummy_interface_gids_guid_mtu_and_events() -> None:
    with netns() as ns:
        _dummy(ns)
        with ns.entered():
            reg = Registry()
        try:
            with ns.entered():
                dev = reg.create(DeviceSpec("rxe0", netdev="dum0"))
            events = Events()
            dev.subscribe(events)
            gids = [e.gid for e in dev.gid_table]
            # link-local fe80::11:22ff:fe33:4455 (if already there) equals GID 0: not repeated
            assert gids == [Gid("fe80::11:22ff:fe33:4455"), Gid("::ffff:10.1.0.1"), Gid("fd00::1")]
            assert dev.node_guid == 0x001122FFFE334455
            assert dev.port_attr().active_mtu is Mtu.MTU_1024
            assert dev.port_state is LinkState.ACTIVE
            ll = ipaddress.ip_address("fe80::11:22ff:fe33:4455")
            assert set(map(str, dev.io.addresses)) == {"10.1.0.1", "fd00::1", str(ll)}
            # GID 0 is reachable: a packet to the link-local address arrives
            inbox: queue.Queue[int] = queue.Queue()
            dev.set_receiver(lambda pkts: [inbox.put(p.psn) for p in pkts])
            dev.io.send(Packet(Opcode.UD_SEND_ONLY, 1, 33, b"ll"), ll.packed, 0xC000, src=ll)
            dev.io.flush()
            assert inbox.get(timeout=WAIT) == 33
            dev.set_receiver(None)

            ns.ip("link", "set", "dum0", "down")
            events.wait_for(AsyncEvent.PORT_DOWN)
            assert dev.port_state is LinkState.DOWN
            assert dev.counters.link_downed == 1
            ns.ip("link", "set", "dum0", "up")
            events.wait_for(AsyncEvent.PORT_ACTIVE)
            assert dev.port_attr().link_state is LinkState.ACTIVE
            # carrier loss (the veth's peer goes down) is a port down too
            ns.ip("link", "set", "dum0p", "down")
            events.wait_for(AsyncEvent.PORT_DOWN)
            assert dev.counters.link_downed == 2
            ns.ip("link", "set", "dum0p", "up")
            events.wait_for(AsyncEvent.PORT_ACTIVE)

            ns.ip("addr", "add", "10.1.0.9/24", "dev", "dum0")
            events.wait_for(AsyncEvent.GID_CHANGE, lambda: Gid("::ffff:10.1.0.9") in _gids(dev))
            assert _gids(dev).index(Gid("::ffff:10.1.0.9")) == 2  # IPv4 before IPv6
            # port_attr is memoised per view of the port: a new GID is a new view
            assert [e.gid for e in dev.port_attr().gid_table] == _gids(dev)
            assert ipaddress.ip_address("10.1.0.9") in dev.io.addresses
            ns.ip("addr", "del", "10.1.0.1/24", "dev", "dum0")
            events.wait_for(AsyncEvent.GID_CHANGE, lambda: Gid("::ffff:10.1.0.1") not in _gids(dev))
            assert ipaddress.ip_address("10.1.0.1") not in dev.io.addresses

            mtu_seen = threading.Event()
            reg.watcher.subscribe(
                lambda ev: mtu_seen.set() if ev.interface and ev.interface.mtu == 2200 else None
            )
            ns.ip("link", "set", "dum0", "mtu", "2200")
            assert mtu_seen.wait(WAIT)
            assert dev.port_attr().active_mtu is Mtu.MTU_2048
        finally:
            reg.close()


def _gids(dev: Device) -> list[Gid]:
    return [e.gid for e in dev.gid_table]


def test_devices_come_and_go_at_run_time_and_with_their_interface() -> None:
    with netns() as ns:
        _dummy(ns)
        added: list[str] = []
        removed: queue.Queue[str] = queue.Queue()
        with ns.entered():
            reg = Registry(
                on_added=lambda d: added.append(d.name), on_removed=lambda d: removed.put(d.name)
            )
        try:
            with ns.entered():
                reg.start(
                    [
                        DeviceSpec("rxe0", netdev="dum0"),
                        DeviceSpec("rxe1", address=ipaddress.ip_address("127.0.0.2")),
                    ]
                )
            assert added == ["rxe0", "rxe1"]
            assert [e.gid for e in reg.get("rxe1").gid_table] == [
                Gid("fe80::200:ff:fe00:0"), Gid("::ffff:127.0.0.2"),
            ]  # fmt: skip
            with pytest.raises(ValueError, match="exists"):
                reg.create(DeviceSpec("rxe0", netdev="lo"))
            reg.remove("rxe1")
            assert removed.get(timeout=WAIT) == "rxe1"
            ns.ip("link", "del", "dum0")
            assert removed.get(timeout=WAIT) == "rxe0"
            assert reg.devices() == []
        finally:
            reg.close()


def test_two_devices_on_one_address_or_a_missing_interface_fail_clearly() -> None:
    with netns() as ns, ns.entered():
        reg = Registry()
        try:
            reg.create(DeviceSpec("rxe0", address=ipaddress.ip_address("127.0.0.5")))
            with pytest.raises(OSError) as e:
                reg.create(DeviceSpec("rxe1", address=ipaddress.ip_address("127.0.0.5")))
            assert e.value.errno == errno.EADDRINUSE
            with pytest.raises(KeyError):
                reg.create(DeviceSpec("rxe2", netdev="nosuch0"))
            assert [d.name for d in reg.devices()] == ["rxe0"]
        finally:
            reg.close()


def test_limits_are_kernel_rxe_s() -> None:
    assert (RXE_LIMITS.max_sge, RXE_LIMITS.max_inline_data, RXE_LIMITS.max_qp_rd_atom) == (
        32, 512, 128,
    )  # fmt: skip
    assert (RXE_LIMITS.max_pkt_per_ack, RXE_LIMITS.max_unacked_psns) == (64, 128)


def test_counters_have_kernel_rxe_names_and_every_drop_reason() -> None:
    c = DeviceCounters(("no_consumer",))
    assert isinstance(c, Counters)  # what every QP core of the device counts into
    snap = c.snapshot()
    # rxe_hw_counters.c, in its order
    assert list(c.hw_counters()) == [
        "sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
        "send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err",
        "retry_rnr_exceeded_err", "completer_retry_err", "send_err", "link_downed",
        "rdma_sends", "rdma_recvs",
    ]  # fmt: skip
    for reason in iba.DropReason:
        assert snap[f"drop_{reason.value}"] == 0
    assert snap["drop_no_consumer"] == snap["drop_handler_error"] == 0
    c.sent_pkts += 3
    c.drop("pkey")
    c.drop("bad_icrc", 2)
    snap = c.snapshot()
    assert (snap["sent_pkts"], snap["drop_pkey"], snap["drop_bad_icrc"], c.dropped) == (3, 1, 2, 3)
