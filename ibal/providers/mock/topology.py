"""Ports, switches and links of the mock fabric."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.types import DEFAULT_PKEY, Gid, LinkState, Mtu, PortCap

if TYPE_CHECKING:
    from ibal.providers.mock.ca import MockCa
    from ibal.providers.mock.objects import MockQp

DEFAULT_SUBNET_PREFIX = 0xFE80_0000_0000_0000

DEFAULT_PORT_CAP = (
    PortCap.IS_TRAP_SUPPORTED
    | PortCap.IS_NOTICE_SUPPORTED
    | PortCap.IS_SLMAP_SUPPORTED
    | PortCap.IS_SYSGUID_SUPPORTED
    | PortCap.IS_CLIENT_REREGISTER_SUPPORTED
)

Route = tuple["MockPort", tuple["Link", ...]]

# Performance counters of a port (CA or switch), see ibal.providers.mock.pma: the raw
# counters (data and packets, then the error counters) and each attribute's baselines
PM_RAW = 9
PM_SLOTS = 3 * PM_RAW


class MockPort:
    """One port of a mock CA: identity, P_Key table, link and counters."""

    __slots__ = (
        "ca",
        "cap",
        "guid",
        "init_type",
        "lid",
        "link",
        "lmc",
        "max_mtu",
        "num",
        "pkey_violations",
        "pkeys",
        "pm",
        "qkey_violations",
        "removed",
        "routes",
        "routes_gen",
        "special",
        "state",
        "subnet_prefix",
    )

    def __init__(
        self,
        ca: MockCa,
        num: int,
        guid: int,
        lid: int,
        pkeys: list[int],
        subnet_prefix: int = DEFAULT_SUBNET_PREFIX,
    ) -> None:
        self.ca = ca
        self.num = num
        self.guid = guid
        self.lid = lid
        self.lmc = 0
        self.pkeys = pkeys
        self.cap = DEFAULT_PORT_CAP
        self.state = LinkState.DOWN
        self.max_mtu = Mtu.MTU_4096
        self.link: Link | None = None
        self.special: list[MockQp | None] = [None, None]  # QP0, QP1
        self.qkey_violations = 0
        self.pkey_violations = 0
        self.init_type = 0
        self.subnet_prefix = subnet_prefix
        self.removed = False
        self.routes: dict[int, Route | None] = {}
        self.routes_gen = -1
        # PMA counters the engine feeds (xmit/rcv words, xmit/rcv packets) and the
        # PMA's baselines: see ibal.providers.mock.pma
        self.pm = [0] * PM_SLOTS

    @property
    def gid(self) -> Gid:
        """GID index 0: the subnet prefix and the port GUID."""
        return Gid((self.subnet_prefix << 64) | self.guid)

    @property
    def name(self) -> str:
        return f"{self.ca.name}/{self.num}"

    def __repr__(self) -> str:
        return f"<MockPort {self.name} lid=0x{self.lid:x} {self.state.name}>"


SWITCH_PORTS = 36


class Switch:
    """A subnet switch: forwards between every link attached to it.

    Port 0 is the management port (its SMA and LID); a cable takes the lowest
    free external port (1..``num_ports``).  ``lft`` is the linear forwarding
    table the subnet manager fills (LID -> out port).
    """

    def __init__(self, name: str, guid: int = 0, num_ports: int = SWITCH_PORTS) -> None:
        self.name = name
        self.guid = guid
        self.lid = 0
        self.num_ports = num_ports
        self.description = name
        self.links: list[Link] = []
        self.port_links: list[Link | None] = [None] * (num_ports + 1)
        self.lft: dict[int, int] = {}
        # each port's counters (the PMA's, as a CA port's ``pm``), fed by the traffic crossing
        self.pm = [[0] * PM_SLOTS for _ in range(num_ports + 1)]

    def attach(self, link: Link) -> int:
        """Cable ``link`` to the lowest free external port; its number."""
        for num in range(1, self.num_ports + 1):
            if self.port_links[num] is None:
                self.port_links[num] = link
                self.links.append(link)
                return num
        raise ValueError(f"{self.name}: all {self.num_ports} ports are cabled")

    def free_ports(self) -> int:
        return self.port_links.count(None) - 1  # port 0 is never cabled

    def detach(self, link: Link) -> None:
        if link in self.links:
            self.links.remove(link)
        for num, ln in enumerate(self.port_links):
            if ln is link:
                self.port_links[num] = None

    def port_of(self, link: Link) -> int:
        """The external port ``link`` is cabled to (0 if it is not)."""
        for num, ln in enumerate(self.port_links):
            if ln is link:
                return num
        return 0

    def __repr__(self) -> str:
        return f"<Switch {self.name} lid=0x{self.lid:x} links={len(self.links)}>"


Endpoint = MockPort | Switch


class Link:
    """A physical link between two endpoints (CA ports or switches)."""

    def __init__(self, a: Endpoint, b: Endpoint, name: str) -> None:
        self.a = a
        self.b = b
        self.name = name
        self.up = True
        # the counters of the port at each end (a CA port's, or the switch port's)
        self.pm_a: list[int] = a.pm if isinstance(a, MockPort) else []
        self.pm_b: list[int] = b.pm if isinstance(b, MockPort) else []

    def other(self, end: Endpoint) -> Endpoint:
        return self.b if end is self.a else self.a

    def __repr__(self) -> str:
        return f"<Link {self.name} {'up' if self.up else 'DOWN'}>"


def default_pkeys(extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    keys = [DEFAULT_PKEY]
    keys.extend(k & 0xFFFF for k in extra if (k & 0xFFFF) != DEFAULT_PKEY)
    return keys
