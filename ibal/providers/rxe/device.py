"""rxe devices: a RoCE port bound to a network interface or one IP address.

The analogue of ``rdma link add rxe0 type rxe netdev eth0``.  A
:class:`Device` owns its counters, its sockets (:class:`~.io.DeviceIO`) and
a port whose state follows the interface: link down/up, MTU and address
changes arrive from a :class:`~.netif.LinkWatcher` and are reported to the
device's subscribers as ``PORT_DOWN``/``PORT_ACTIVE``/``GID_CHANGE``.
A :class:`Registry` creates and removes devices at run time, starting from
:func:`startup_specs` (``IBAL_RXE_DEVICES``, else the config file, else one
device on the loopback interface).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ibal.providers.rxe import netif
from ibal.providers.rxe.counters import DeviceCounters
from ibal.providers.rxe.io import ROCE_PORT, DeviceIO, RxMode
from ibal.providers.rxe.netif import EventKind, Interface, IpAddress, NetEvent
from ibal.providers.rxe.settings import ENV_DEVICES, config_path
from ibal.types import (
    DEFAULT_PKEY,
    AsyncEvent,
    AtomicCap,
    CaAttr,
    GidEntry,
    LinkLayer,
    LinkState,
    Mtu,
    PortAttr,
    PortCap,
)
from ibal.wire.packet import Packet

DEFAULT_NETDEV: Final = "lo"


class ConfigError(ValueError):
    """A device list or config file that cannot be used; the message says where."""


# ---------------------------------------------------------------- limits


@dataclass(frozen=True)
class Limits:
    """Kernel rxe's limits (``rxe_param.h``, recent mainline; checked against
    ``ibv_devinfo -v`` of the lab's 6.1 kernel): reported by ``query_ca`` and
    enforced by the CA layer."""

    max_qp: int = (1 << 20) - 16
    max_qp_wr: int = 1 << 20
    max_sge: int = 32
    max_sge_rd: int = 32
    max_inline_data: int = 512
    max_cq: int = 1 << 20
    max_cqe: int = (1 << 15) - 1
    max_mr: int = (1 << 19) - 1
    max_mw: int = (1 << 19) - 1
    max_pd: int = 1 << 20
    max_ah: int = (1 << 15) - 1
    max_srq: int = (1 << 20) - (1 << 17) - 1
    max_srq_wr: int = 1 << 20
    max_srq_sge: int = 27
    max_qp_rd_atom: int = 128
    max_qp_init_rd_atom: int = 128
    max_res_rd_atom: int = 258048
    max_mcast_grp: int = 8192
    max_mcast_qp_attach: int = 56
    max_total_mcast_qp_attach: int = 458752
    max_msg_sz: int = 1 << 31
    max_mr_size: int = (1 << 64) - 1
    pkey_tbl_len: int = 1
    gid_tbl_len: int = 1024
    local_ca_ack_delay: int = 15
    vendor_id: int = 0xFFFFFF
    vendor_part_id: int = 0
    max_pkt_per_ack: int = 64  # RXE_MAX_PKT_PER_ACK
    max_unacked_psns: int = 128  # RXE_MAX_UNACKED_PSNS
    inflight_skbs_high: int = 64  # RXE_INFLIGHT_SKBS_PER_QP_HIGH
    inflight_skbs_low: int = 16
    max_mtu: Mtu = Mtu.MTU_4096


RXE_LIMITS: Final = Limits()


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class DeviceSpec:
    """What a device is bound to: an interface (``netdev``) or one address."""

    name: str
    netdev: str | None = None
    address: IpAddress | None = None
    rx_mode: RxMode = "raw"
    capture: str | None = None
    port: int = ROCE_PORT

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"bad device name {self.name!r}")
        if (self.netdev is None) == (self.address is None):
            raise ConfigError(f"{self.name}: give exactly one of netdev and address")
        if self.rx_mode not in ("raw", "udp"):
            raise ConfigError(f"{self.name}: rx_mode must be raw or udp, not {self.rx_mode!r}")

    @classmethod
    def bound_to(cls, name: str, target: str, **options: Any) -> DeviceSpec:
        """``target`` is an IP address if it parses as one, else an interface name."""
        try:
            return cls(name, address=ipaddress.ip_address(target), **options)
        except ValueError:
            pass
        if not target or "/" in target or len(target) > 15:
            raise ConfigError(f"{name}: {target!r} is neither an address nor an interface name")
        return cls(name, netdev=target, **options)


def parse_devices(text: str) -> list[DeviceSpec]:
    """``IBAL_RXE_DEVICES`` syntax: ``rxe0=tap0,rxe1=127.0.0.2`` (``name=netdev|address``)."""
    specs: list[DeviceSpec] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, target = item.partition("=")
        if not sep:
            raise ConfigError(f"{ENV_DEVICES}: {item!r} is not name=netdev or name=address")
        specs.append(DeviceSpec.bound_to(name.strip(), target.strip()))
    _unique(specs, ENV_DEVICES)
    return specs


def _unique(specs: list[DeviceSpec], where: str) -> None:
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"{where}: device {sorted(dup)[0]} given twice")


_OPTIONS: Final = {"netdev", "address", "rx_mode", "capture", "port"}


def load_config(path: Path) -> list[DeviceSpec]:
    """Devices from a TOML file: one ``[devices.NAME]`` table each, with
    ``netdev`` or ``address`` and optionally ``rx_mode``, ``capture``, ``port``."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from e
    devices = data.get("devices", {})
    if not isinstance(devices, dict):
        raise ConfigError(f"{path}: [devices] must be a table")
    specs = []
    for name, opts in devices.items():
        if not isinstance(opts, dict):
            raise ConfigError(f"{path}: devices.{name} must be a table")
        unknown = set(opts) - _OPTIONS
        if unknown:
            raise ConfigError(f"{path}: devices.{name}: unknown option {sorted(unknown)[0]!r}")
        target = opts.get("netdev", opts.get("address"))
        if not isinstance(target, str) or ("netdev" in opts) == ("address" in opts):
            raise ConfigError(f"{path}: devices.{name}: give exactly one of netdev and address")
        extra = {k: opts[k] for k in ("rx_mode", "capture", "port") if k in opts}
        try:
            if "address" in opts:
                specs.append(DeviceSpec(name, address=ipaddress.ip_address(target), **extra))
            else:
                specs.append(DeviceSpec(name, netdev=target, **extra))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path}: devices.{name}: {e}") from e
    _unique(specs, str(path))
    return specs


def startup_specs(env: Mapping[str, str] = os.environ) -> list[DeviceSpec]:
    """The devices a process starts with: ``IBAL_RXE_DEVICES`` if set (empty: none),
    else the config file if it exists, else ``rxe0`` on ``lo``."""
    if ENV_DEVICES in env:
        return parse_devices(env[ENV_DEVICES])
    path = config_path(env)
    if path.exists():
        return load_config(path)
    return [DeviceSpec("rxe0", netdev=DEFAULT_NETDEV)]


# ---------------------------------------------------------------- device


@dataclass(frozen=True)
class DeviceEvent:
    """A port event for the CA layer to raise (``PORT_ACTIVE``, ``PORT_DOWN``, ``GID_CHANGE``)."""

    device: str
    event: AsyncEvent
    port_num: int = 1


@dataclass
class _PortView:
    iface: Interface
    gids: tuple[GidEntry, ...] = ()
    state: LinkState = LinkState.DOWN
    errors: list[str] = field(default_factory=list)


class Device:
    """One rxe device: a port on an interface, its counters and sockets.

    Created by :class:`Registry` (or directly, with a watcher of the current
    network namespace).  ``on_packets`` receives decoded packets on the
    device's receive thread (:class:`~.io.DeviceIO`); until the CA layer sets
    one with :meth:`set_receiver` packets are counted as ``no_consumer``
    drops.  Subscribers (:meth:`subscribe`) get :class:`DeviceEvent`\\ s on the
    watcher's thread.  Raises ``KeyError`` for an interface or address that
    does not exist and ``OSError`` when the UDP port is taken (kernel rxe binds
    the wildcard address: it and an ibal device cannot share an address).
    """

    def __init__(self, spec: DeviceSpec, watcher: netif.LinkWatcher) -> None:
        self.spec = spec
        self.name = spec.name
        self.limits = RXE_LIMITS
        self.counters = DeviceCounters(("no_consumer",))
        if spec.netdev is not None:
            iface = netif.interface(spec.netdev)
        else:
            assert spec.address is not None
            iface = netif.interface_of(spec.address)
        self.ifindex = iface.index
        self.node_guid = netif.guid(iface.mac)
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[DeviceEvent], None]] = []
        self._receiver: Callable[[list[Packet]], None] | None = None
        self._port = _PortView(iface)
        self._port_memo: tuple[tuple[object, ...], PortAttr] | None = None
        capture = None
        if spec.capture is not None or os.environ.get("IBAL_CAPTURE"):
            from ibal.providers.rxe.wire import rxe_capture

            capture = rxe_capture(spec.capture)
        self.io = DeviceIO(
            self._deliver, self.counters, port=spec.port, rx_mode=spec.rx_mode,
            capture=capture, name=spec.name,
        )  # fmt: skip
        self.engine = self.io.engine
        try:
            self._apply(iface, initial=True)
        except BaseException:
            self.io.close()
            raise
        self._watcher = watcher
        watcher.subscribe(self._on_net)
        self._closed = False

    # ------------------------------------------------------------ CA-facing
    def set_receiver(self, on_packets: Callable[[list[Packet]], None] | None) -> None:
        """Where received packets go (any thread; the receive thread calls it)."""
        self._receiver = on_packets

    def subscribe(self, callback: Callable[[DeviceEvent], None]) -> None:
        with self._lock:
            self._subscribers.append(callback)

    @property
    def netdev(self) -> str:
        return self._port.iface.name

    @property
    def port_state(self) -> LinkState:
        return self._port.state

    @property
    def gid_table(self) -> tuple[GidEntry, ...]:
        return self._port.gids

    @property
    def errors(self) -> tuple[str, ...]:
        """Addresses whose sockets could not be opened, with the reason."""
        return tuple(self._port.errors)

    def port_attr(self) -> PortAttr:
        """Port 1 as ``query_ca`` reports it: one object while the port's view is unchanged
        (``_apply`` replaces the interface, GIDs and state objects on every change), so the
        per-verb callers (modify_qp, create_av, query_ca) cost a comparison, not a build."""
        p = self._port
        memo = self._port_memo
        if memo is not None:
            iface, gids, state = memo[0]
            if p.iface is iface and p.gids is gids and p.state is state:
                return memo[1]
        attr = self._build_port_attr(p)
        self._port_memo = ((p.iface, p.gids, p.state), attr)
        return attr

    def _build_port_attr(self, p: _PortView) -> PortAttr:
        return PortAttr(
            port_num=1,
            port_guid=self.node_guid,
            link_state=p.state,
            active_mtu=netif.active_mtu(p.iface.mtu),
            max_mtu=self.limits.max_mtu,
            cap=PortCap.IS_CM_SUPPORTED,
            pkeys=(DEFAULT_PKEY,),
            link_layer=LinkLayer.ETHERNET,
            active_speed="2.5 Gbps",
            active_width="1X",
            subnet_timeout=0,
            gid_table=p.gids,
        )

    def ca_attr(self) -> CaAttr:
        """The device as ``query_ca`` reports it (kernel rxe's limits)."""
        lim = self.limits
        return CaAttr(
            ca_guid=self.node_guid,
            vendor_id=lim.vendor_id,
            device_id=lim.vendor_part_id,
            system_image_guid=self.node_guid,
            max_pds=lim.max_pd,
            max_qps=lim.max_qp,
            max_wrs=lim.max_qp_wr,
            max_sges=lim.max_sge,
            max_cqs=lim.max_cq,
            max_cqes=lim.max_cqe,
            max_srqs=lim.max_srq,
            max_srq_wrs=lim.max_srq_wr,
            max_srq_sges=lim.max_srq_sge,
            max_avs=lim.max_ah,
            max_mrs=lim.max_mr,
            max_mws=lim.max_mw,
            max_mr_size=lim.max_mr_size,
            max_inline=lim.max_inline_data,
            max_qp_init_depth=lim.max_qp_init_rd_atom,
            max_qp_resp_res=lim.max_qp_rd_atom,
            max_mcast_grps=lim.max_mcast_grp,
            max_qps_per_mcast_grp=lim.max_mcast_qp_attach,
            atomicity=AtomicCap.LOCAL,
            local_ack_delay=lim.local_ca_ack_delay,
            ports=(self.port_attr(),),
        )

    def info(self) -> dict[str, object]:
        """What ``ibal info`` shows for the device: binding, port, GIDs, counters."""
        p = self._port
        return {
            "name": self.name,
            "netdev": p.iface.name,
            "address": str(self.spec.address) if self.spec.address is not None else None,
            "node_guid": f"{self.node_guid:016x}",
            "state": p.state.name,
            "active_mtu": netif.active_mtu(p.iface.mtu).bytes,
            "gids": [f"{e.index}: {e.gid} ({e.gid_type.value}, {e.netdev})" for e in p.gids],
            "sockets": [str(ip) for ip in self.io.addresses],
            "rx_mode": self.spec.rx_mode,
            "errors": list(p.errors),
            "counters": self.counters.snapshot(),
        }

    def close(self) -> None:
        """Close the sockets and stop following the interface (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._watcher.unsubscribe(self._on_net)
        self.io.close()

    # ------------------------------------------------------------ internals
    def _deliver(self, packets: list[Packet]) -> None:
        r = self._receiver
        if r is None:
            self.counters.drop("no_consumer", len(packets))
            return
        r(packets)

    def _bound(self, iface: Interface) -> list[IpAddress]:
        if self.spec.address is not None:
            return [self.spec.address]
        return [a.ip for a in iface.addresses if a.usable]

    def _apply(self, iface: Interface, *, initial: bool = False) -> list[AsyncEvent]:
        """Take a new view of the interface; the events it causes."""
        p = self._port
        events: list[AsyncEvent] = []
        gids = netif.gid_table(iface, self.spec.address)
        state = LinkState.ACTIVE if iface.running else LinkState.DOWN
        want = set(self._bound(iface))
        have = set(self.io.addresses)
        for ip in have - want:
            self.io.remove_address(ip)
        for ip in sorted(want - have, key=str):
            try:
                # a link-local IPv6 address binds with the interface as its scope
                self.io.add_address(ip, iface.index if ip.is_link_local else 0)
            except OSError as e:
                if initial:
                    raise
                p.errors.append(f"{ip}: {e.strerror or e}")
        if not initial:
            if gids != p.gids:
                events.append(AsyncEvent.GID_CHANGE)
            if state is not p.state:
                events.append(
                    AsyncEvent.PORT_ACTIVE if state is LinkState.ACTIVE else AsyncEvent.PORT_DOWN
                )
                if state is LinkState.DOWN:
                    self.counters.link_downed += 1
        p.iface, p.gids, p.state = iface, gids, state
        return events

    def _on_net(self, ev: NetEvent) -> None:
        if ev.index != self.ifindex or self._closed:
            return
        if ev.kind is EventKind.LINK_GONE:
            events = [AsyncEvent.PORT_DOWN] if self._port.state is LinkState.ACTIVE else []
            self._port.state = LinkState.DOWN
        elif ev.kind is EventKind.LINK and ev.interface is not None:
            # the link message has no addresses: keep the ones we know
            x = ev.interface
            iface = Interface(x.index, x.name, x.mac, x.mtu, x.flags, self._port.iface.addresses)
            events = self._apply(iface)
        else:
            try:
                iface = netif.interfaces()[self.ifindex]
            except KeyError:
                return
            events = self._apply(iface)
        with self._lock:
            subs = list(self._subscribers)
        for e in events:
            for cb in subs:
                # a subscriber's bug must not stop the watcher
                with contextlib.suppress(Exception):
                    cb(DeviceEvent(self.name, e))


# ---------------------------------------------------------------- registry


class Registry:
    """The devices of a process (or of one network namespace): create, remove, list.

    ``on_added``/``on_removed`` are called with each device as it comes and
    goes (the CA layer's ``register_ca``/``deregister_ca``); a device whose
    interface disappears is removed.  Construct it in the thread whose network
    namespace the devices live in.
    """

    def __init__(
        self,
        on_added: Callable[[Device], None] | None = None,
        on_removed: Callable[[Device], None] | None = None,
    ) -> None:
        self._devices: dict[str, Device] = {}
        self._lock = threading.Lock()
        self.on_added = on_added
        self.on_removed = on_removed
        self.watcher = netif.LinkWatcher()
        self.watcher.subscribe(self._on_net)

    def create(self, spec: DeviceSpec) -> Device:
        """Add a device (``rdma link add``); ``ValueError`` when the name is taken."""
        with self._lock:
            if spec.name in self._devices:
                raise ValueError(f"device {spec.name} exists")
            dev = Device(spec, self.watcher)
            self._devices[spec.name] = dev
        if self.on_added is not None:
            self.on_added(dev)
        return dev

    def start(self, specs: Iterable[DeviceSpec] | None = None) -> list[Device]:
        """Create the start-up devices (:func:`startup_specs` by default)."""
        return [self.create(s) for s in (startup_specs() if specs is None else specs)]

    def remove(self, name: str) -> None:
        """Remove a device (``rdma link delete``); ``KeyError`` when there is none."""
        with self._lock:
            dev = self._devices.pop(name)
        if self.on_removed is not None:
            self.on_removed(dev)
        dev.close()

    def get(self, name: str) -> Device:
        return self._devices[name]

    def devices(self) -> list[Device]:
        with self._lock:
            return list(self._devices.values())

    def close(self) -> None:
        for name in [d.name for d in self.devices()]:
            self.remove(name)
        self.watcher.close()

    def _on_net(self, ev: NetEvent) -> None:
        if ev.kind is not EventKind.LINK_GONE:
            return
        for dev in self.devices():
            if dev.ifindex == ev.index:
                self.remove(dev.name)
