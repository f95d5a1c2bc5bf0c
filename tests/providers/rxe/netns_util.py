"""A throw-away network namespace for rxe device and socket tests (needs root and iproute2)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

_CLONE_NEWNET = 0x40000000


def need_ip() -> None:
    """Skip (naming the Debian package) without `ip`, or without root; in CI
    (``IBAL_LAB_REQUIRED=1``) fail instead."""
    missing = None
    if shutil.which("ip") is None:
        missing = "needs the `ip` command (Debian package iproute2)"
    elif os.geteuid() != 0:
        missing = "needs root (network namespaces, raw sockets)"
    if missing is not None:
        _missing(missing)


def need_root() -> None:
    """Skip without root (rxe's raw sockets); in CI (``IBAL_LAB_REQUIRED=1``) fail."""
    if os.geteuid() != 0:
        _missing("needs root (rxe's raw sockets need CAP_NET_RAW)")


def _missing(what: str) -> None:
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{what} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(what)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Netns:
    """One namespace: run `ip` in it, or enter it in the calling thread."""

    def __init__(self) -> None:
        self.name = f"ibal-rxetest-{os.getpid()}-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=30)
        self.ip("link", "set", "lo", "up")

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, timeout=30, capture_output=True)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread in the namespace; sockets (and threads) made inside stay there."""
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


@contextlib.contextmanager
def netns() -> Iterator[Netns]:
    need_ip()
    ns = Netns()
    try:
        yield ns
    finally:
        ns.delete()
