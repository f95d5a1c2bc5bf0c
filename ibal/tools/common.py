"""What the traffic tools (``pingpong``, ``perftest``) share: the CA, the TCP set-up, options.

Each tool raises its own :class:`ToolError` subclass; the helpers take it as
``error`` so a failure here reaches the caller as that tool's error.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from ibal.al import AccessLayer, Ca, Cq, Pd
from ibal.status import IbError
from ibal.types import Mtu, Wc, WcStatus, WcType

R = TypeVar("R")

DEFAULT_PORT = 18515
"""The TCP port of the real tools' out-of-band exchange."""
MTUS = {m.bytes: m for m in Mtu}


class ToolError(Exception):
    """A failure a tool reports with a message and exit status 1."""


@dataclass
class ExchangeOptions:
    """What librdmacm's example tools (``udaddy``, ``ucmatose``, ``mckey``) share:
    ``-b``, ``-c``, ``-C``, ``-S``; a size of 0 sends nothing, as theirs."""

    bind: str | None = None
    connections: int = 1
    count: int = 10
    size: int = 100
    timeout: float = 60.0
    """Seconds to wait for a peer, a completion or the disconnect."""
    error: ClassVar[type[ToolError]] = ToolError

    def check(self) -> None:
        if self.connections < 1:
            raise self.error(f"invalid connection count {self.connections}")
        if self.count < 0 or self.size < 0:
            raise self.error("message count and size are not negative")

    @property
    def messages(self) -> int:
        """The messages each node sends or takes: none when the size is 0."""
        return self.count if self.size else 0


@dataclass
class ExchangeResult:
    """What a run of such a tool moved: per node, the payloads received (in order)."""

    received: list[list[bytes]]


def run_checked(opts: ExchangeOptions, name: str, body: Callable[[], R]) -> R:
    """``body()`` after ``opts.check()``, a status exception or bad value from the
    access layer reported as the tool's error (``name: why``)."""
    opts.check()
    try:
        return body()
    except (IbError, ValueError) as exc:
        raise opts.error(f"{name}: {exc}") from exc


def wait_one(cq: Cq, kind: WcType, timeout: float, error: type[ToolError]) -> Wc:
    """The next completion on ``cq``, which must be a successful ``kind``: one at a
    time, so sends and receives may share the CQ and none is lost."""
    got = cq.wait(timeout, max_entries=1)
    if not got:
        raise error(f"no {kind.name} completion in {timeout} s")
    wc = got[0]
    if wc.status is not WcStatus.SUCCESS:
        raise error(f"completion {wc.wc_type.name} {wc.status.name}")
    if wc.wc_type is not kind:
        raise error(f"a {wc.wc_type.name} completion while waiting for {kind.name}")
    return wc


class _Closes(Protocol):
    def close(self) -> None: ...


def close_nodes(nodes: Iterable[_Closes], pd: Pd, ca: Ca) -> None:
    """A tool's nodes on ``pd``, then the PD, then the CA handle."""
    for node in nodes:
        node.close()
    pd.dealloc()
    ca.close()


def find_ca(al: AccessLayer, device: str | None, error: type[ToolError] = ToolError) -> Ca:
    """The CA named ``device`` (by name or GUID), else the first one."""
    guids = al.get_ca_guids()
    if not guids:
        raise error("No IB devices found")
    for guid in guids:
        ca = al.open_ca(guid)
        if device is None or device in (ca.name, f"{guid:016x}", hex(guid)):
            return ca
        ca.close(wait=True)
    raise error(f"IB device {device} not found")


def listen(port: int = DEFAULT_PORT) -> socket.socket:
    """The server's listening socket: IPv6 and IPv4 where the host has both."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(
                ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1
            )
        except OSError:
            pass
    return socket.create_server(("", port), backlog=1)


def dial(servername: str, port: int, error: type[ToolError]) -> socket.socket:
    """The client's connection to the server's exchange port."""
    try:
        return socket.create_connection((servername, port))
    except OSError as exc:
        raise error(f"Couldn't connect to {servername}:{port}: {exc}") from exc


def accept_one(listener: socket.socket | None, port: int) -> socket.socket:
    """The server's one connection: on ``listener`` (tests bind port 0), else on ``port``."""
    lsock = listener if listener is not None else listen(port)
    try:
        conn, _ = lsock.accept()
    finally:
        lsock.close()
    return conn


def check_options(error: type[ToolError], *, mtu: int | None, port: int, size: int,
                  iters: int) -> None:
    """The options every tool judges alike (``mtu`` ``None``: the port's)."""
    if mtu is not None and mtu not in MTUS:
        raise error(f"invalid MTU {mtu} (256, 512, 1024, 2048 or 4096)")
    if size < 1 or iters < 1:
        raise error("size and iterations must be positive")
    if not 0 < port < 65536:
        raise error(f"invalid port {port}")
