"""Network namespaces with a tap device: the host side of the `--net` link."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ibal.netns import setns

#: Every namespace the lab creates has this prefix, then the creator's pid.
NETNS_PREFIX = "ibal-lab"
_NETNS_RE = re.compile(rf"^{NETNS_PREFIX}-(\d+)-[0-9a-f]+$")
_NETNS_DIR = Path("/run/netns")


class NetnsError(RuntimeError):
    """An `ip` command that sets up or tears down the namespace failed."""


@dataclass(frozen=True)
class NetConfig:
    """Addresses of the lab link. Both ends must be in one subnet.

    The defaults are private addresses that exist only inside the namespace
    the lab creates for each session, so nothing leaves this machine.
    """

    host_address: str = "10.99.0.1/24"
    guest_address: str = "10.99.0.2/24"
    tap: str = "tap0"
    guest_mac: str = "52:54:00:99:00:02"

    def __post_init__(self) -> None:
        host = ipaddress.ip_interface(self.host_address)
        guest = ipaddress.ip_interface(self.guest_address)
        if host.version != 4 or guest.version != 4:
            raise ValueError(
                "lab addresses must be IPv4 (rxe's GID index 1 is the IPv4-mapped one)"
            )
        if host.network != guest.network or host.ip == guest.ip:
            raise ValueError(
                f"{self.host_address} and {self.guest_address} "
                "must be distinct addresses in one subnet"
            )

    @property
    def host_ip(self) -> str:
        """The host (namespace) end's address, without prefix length."""
        return str(ipaddress.ip_interface(self.host_address).ip)

    @property
    def guest_ip(self) -> str:
        """The guest's eth0 address, without prefix length."""
        return str(ipaddress.ip_interface(self.guest_address).ip)


def _ip(*args: str) -> None:
    """Run one `ip` command; raise NetnsError with its stderr on failure."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class NetNamespace:
    """A network namespace holding one tap device addressed as `config.host_address`."""

    def __init__(self, name: str, config: NetConfig) -> None:
        self.name = name
        self.config = config
        self._deleted = False

    @classmethod
    def create(cls, config: NetConfig) -> NetNamespace:
        """Create a uniquely named namespace with lo and the tap up."""
        ns = cls(f"{NETNS_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}", config)
        _ip("netns", "add", ns.name)
        try:
            _ip("-n", ns.name, "link", "set", "lo", "up")
            _ip("-n", ns.name, "tuntap", "add", "dev", config.tap, "mode", "tap")
            _ip("-n", ns.name, "addr", "add", config.host_address, "dev", config.tap)
            _ip("-n", ns.name, "link", "set", config.tap, "up")
        except BaseException:
            ns.delete()
            raise
        return ns

    def argv(self, command: Sequence[str]) -> list[str]:
        """`command` wrapped so that it runs inside this namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def pids(self) -> list[int]:
        """Processes currently in the namespace (qemu, host-side helpers, their children)."""
        proc = subprocess.run(
            ["ip", "netns", "pids", self.name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return [int(w) for w in proc.stdout.split() if w.isdigit()]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move the calling thread into the namespace for the `with` body.

        Sockets created inside keep the namespace after the block, so host-side
        Python (a userspace RoCE engine, a test's UDP peer) can open them here
        and use them from any thread.
        """
        with (
            open("/proc/thread-self/ns/net", "rb") as orig,
            open(_NETNS_DIR / self.name, "rb") as target,
        ):
            setns(target.fileno())
            try:
                yield
            finally:
                setns(orig.fileno())

    def delete(self) -> None:
        """Kill whatever still runs in the namespace and delete it (idempotent)."""
        if self._deleted:
            return
        self._deleted = True
        delete_namespace(self.name)


def delete_namespace(name: str) -> None:
    """Kill the processes of namespace `name`, then remove it; the tap goes with it."""
    if not (_NETNS_DIR / name).exists():
        return
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30, check=False
        )
        for word in out.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(word), signal.SIGKILL)
    _ip("netns", "del", name)


def lab_namespaces() -> list[str]:
    """Names of namespaces that the lab created (by any process)."""
    if not _NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in _NETNS_DIR.iterdir() if _NETNS_RE.match(p.name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(*, all_namespaces: bool = False) -> list[str]:
    """Delete lab namespaces whose creating process is gone (or all of them); return their names."""
    removed = []
    for name in lab_namespaces():
        m = _NETNS_RE.match(name)
        if m and (all_namespaces or not _alive(int(m.group(1)))):
            with contextlib.suppress(NetnsError):
                delete_namespace(name)
                removed.append(name)
    return removed
