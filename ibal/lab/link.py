"""A virtual network between lab guests: addresses, qemu netdevs and the hub for N > 2.

Each guest's link NIC is a qemu ``-netdev dgram`` on a Unix datagram socket in
the cluster's temp dir, so the link needs no host privilege and no host
address: two guests send their frames straight to each other's socket; with
more guests every one sends to a hub socket that copies each frame to all the
others (a repeater: the link is one broadcast domain, as a hub is).
"""

from __future__ import annotations

import contextlib
import ipaddress
import selectors
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

#: qemu's largest frame on a socket netdev is 64 KiB + 4 KiB; a datagram
#: socket never splits one, so one receive is one frame.
_FRAME_MAX = 69632


@dataclass(frozen=True)
class LinkConfig:
    """The shared link: guest i gets host address i + 1 of `subnet`.

    mtu: the link NICs' MTU. At 9000 both kernel rxe and ibal's rxe run
    RoCE's 4096-byte MTU, as on ``lo``; at 1500 they drop to 1024.
    """

    subnet: str = "10.98.0.0/24"
    mtu: int = 9000

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.subnet)
        if net.version != 4:
            raise ValueError("the lab link must be IPv4 (rxe's GID index 1 is the IPv4-mapped one)")
        if not 576 <= self.mtu <= 65535:
            raise ValueError(f"link MTU {self.mtu} outside 576..65535")

    def address(self, index: int) -> str:
        """Guest `index`'s address with prefix length, e.g. ``10.98.0.1/24``."""
        net = ipaddress.ip_network(self.subnet)
        if index < 0 or index + 1 >= net.num_addresses - 1:
            raise ValueError(f"{self.subnet} has no address for guest {index}")
        return f"{net.network_address + index + 1}/{net.prefixlen}"

    def ip(self, index: int) -> str:
        """Guest `index`'s address without prefix length."""
        return self.address(index).split("/")[0]

    @staticmethod
    def mac(index: int) -> str:
        """Guest `index`'s link MAC (locally administered, qemu's 52:54:00 prefix)."""
        if not 0 <= index < 256:
            raise ValueError(f"guest index {index} outside 0..255")
        return f"52:54:00:98:01:{index:02x}"


@dataclass(frozen=True)
class GuestLink:
    """One guest's end of the link: its NIC and what the agent configures on it."""

    index: int
    address: str
    mac: str
    mtu: int
    local: Path
    remote: Path

    @property
    def ip(self) -> str:
        """The address without prefix length."""
        return self.address.split("/")[0]

    def qemu_args(self) -> list[str]:
        """The ``-netdev``/``-device`` pair of this NIC."""
        netdev = (
            f"dgram,id=link0,local.type=unix,local.path={self.local},"
            f"remote.type=unix,remote.path={self.remote}"
        )
        return [
            "-netdev", netdev,
            "-device", f"virtio-net-pci,netdev=link0,mac={self.mac},romfile=",
        ]  # fmt: skip


def plan_links(config: LinkConfig, count: int, directory: Path) -> list[GuestLink]:
    """The link ends of `count` guests whose sockets live in `directory`.

    Two guests point at each other; more point at the hub's socket for them
    (``hub-i.sock``, served by `Hub`).
    """
    if count < 2:
        raise ValueError(f"a link needs at least 2 guests, not {count}")
    links = []
    for i in range(count):
        local = directory / f"guest-{i}.sock"
        remote = directory / (f"guest-{1 - i}.sock" if count == 2 else f"hub-{i}.sock")
        links.append(
            GuestLink(i, config.address(i), config.mac(i), config.mtu, local, remote)
        )
    return links


class Hub:
    """A repeater between N guests' datagram sockets: every frame to every other guest.

    One thread; `close()` stops it. Frames to a guest whose socket is not
    bound yet (still starting) are dropped and counted, as a wire would lose them.
    """

    def __init__(self, links: list[GuestLink]) -> None:
        self.links = links
        self.forwarded = 0
        self.dropped = 0
        self._socks: list[socket.socket] = []
        self._sel = selectors.DefaultSelector()
        self._stop_r, self._stop_w = socket.socketpair()
        try:
            for link in links:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socks.append(s)
                s.bind(str(link.remote))
                s.setblocking(False)
                self._sel.register(s, selectors.EVENT_READ, link.index)
        except BaseException:
            self.close()
            raise
        self._sel.register(self._stop_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="ibal-lab-hub", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    return
                src: int = key.data
                sock = self._socks[src]
                while True:
                    try:
                        frame = sock.recv(_FRAME_MAX)
                    except BlockingIOError:
                        break
                    except OSError:
                        return
                    self._repeat(src, frame)

    def _repeat(self, src: int, frame: bytes) -> None:
        for link in self.links:
            if link.index == src:
                continue
            try:
                # Sent from the hub's socket for the receiver: qemu ignores the source.
                self._socks[link.index].sendto(frame, str(link.local))
                self.forwarded += 1
            except OSError:
                self.dropped += 1

    def close(self) -> None:
        """Stop the thread and close the sockets (idempotent)."""
        with contextlib.suppress(OSError):
            self._stop_w.send(b"x")
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        for s in (*self._socks, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                s.close()
        self._socks = []
        with contextlib.suppress(Exception):
            self._sel.close()
