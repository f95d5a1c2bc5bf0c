"""IP-level group membership for RoCE multicast (the provider's stand-in for rdma_cm's join)."""

from __future__ import annotations

import socket

import pytest

from ibal.providers.rdma_core.ipmcast import IpMemberships

V4_GROUP = bytes(10) + b"\xff\xff" + bytes([239, 255, 77, 1])  # ::ffff:239.255.77.1
V6_GROUP = bytes.fromhex("ff1e0000000000000000000000007701")


def test_membership_is_reference_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[int, int, bytes]] = []
    closed: list[int] = []

    class FakeSocket:
        def __init__(self, family: int, kind: int) -> None:
            self.family = family

        def setsockopt(self, level: int, opt: int, value: bytes) -> None:
            opened.append((self.family, opt, value))

        def close(self) -> None:
            closed.append(self.family)

    monkeypatch.setattr(socket, "socket", FakeSocket)
    m = IpMemberships()
    assert m.join(3, V4_GROUP) is None
    assert m.join(3, V4_GROUP) is None  # second QP, same group: no second join
    assert m.join(3, V6_GROUP) is None
    assert [(f, o) for f, o, _ in opened] == [
        (socket.AF_INET, socket.IP_ADD_MEMBERSHIP),
        (socket.AF_INET6, socket.IPV6_JOIN_GROUP),
    ]
    assert opened[0][2][:4] == bytes([239, 255, 77, 1])  # struct ip_mreqn, group first
    assert opened[1][2][:16] == V6_GROUP
    m.leave(3, V4_GROUP)
    assert closed == []
    m.leave(3, V4_GROUP)
    assert closed == [socket.AF_INET]
    m.leave(3, V4_GROUP)  # unknown: ignored
    m.close()
    assert closed == [socket.AF_INET, socket.AF_INET6]


def test_a_refused_join_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refusing:
        def __init__(self, family: int, kind: int) -> None:
            pass

        def setsockopt(self, level: int, opt: int, value: bytes) -> None:
            raise OSError(19, "No such device")

        def close(self) -> None:
            pass

    monkeypatch.setattr(socket, "socket", Refusing)
    why = IpMemberships().join(999, V6_GROUP)
    assert why is not None and "ifindex 999" in why
