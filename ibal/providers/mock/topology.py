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

    @property
    def gid(self) -> Gid:
        """GID index 0: the subnet prefix and the port GUID."""
        return Gid((self.subnet_prefix << 64) | self.guid)

    @property
    def name(self) -> str:
        return f"{self.ca.name}/{self.num}"

    def __repr__(self) -> str:
        return f"<MockPort {self.name} lid=0x{self.lid:x} {self.state.name}>"


class Switch:
    """A subnet switch: forwards between every link attached to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.links: list[Link] = []

    def __repr__(self) -> str:
        return f"<Switch {self.name} links={len(self.links)}>"


Endpoint = MockPort | Switch


class Link:
    """A physical link between two endpoints (CA ports or switches)."""

    def __init__(self, a: Endpoint, b: Endpoint, name: str) -> None:
        self.a = a
        self.b = b
        self.name = name
        self.up = True

    def other(self, end: Endpoint) -> Endpoint:
        return self.b if end is self.a else self.a

    def __repr__(self) -> str:
        return f"<Link {self.name} {'up' if self.up else 'DOWN'}>"


def default_pkeys(extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    keys = [DEFAULT_PKEY]
    keys.extend(k & 0xFFFF for k in extra if (k & 0xFFFF) != DEFAULT_PKEY)
    return keys
