"""Network namespaces of threads: which one a thread is in, and running code in another.

A thread's network namespace decides where the sockets it opens live.  The
lab moves a thread into its namespace to open a userspace RoCE device there;
the device later opens more sockets (a multicast group's) from whatever
thread calls the verb, and must open them in its own namespace, not the
caller's.  ``setns`` needs CAP_SYS_ADMIN; Python has ``os.setns`` only from 3.12.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["NetNs", "setns"]

_CLONE_NEWNET = 0x40000000
_SELF = "/proc/thread-self/ns/net"
T = TypeVar("T")


def setns(fd: int) -> None:
    """setns(2): move the calling thread into the network namespace ``fd`` refers to."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class NetNs:
    """The network namespace of the thread that made this object (kept open)."""

    def __init__(self) -> None:
        self._fd = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
        self._ino = os.fstat(self._fd).st_ino

    def is_current(self) -> bool:
        """Whether the calling thread is in this namespace."""
        return os.stat(_SELF).st_ino == self._ino

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in this namespace: on the calling thread when it is there already,
        else on a short-lived thread that enters it first (the caller's namespace is
        left alone); what ``fn`` raises is raised here."""
        if self.is_current():
            return fn()
        out: list[T] = []
        err: list[BaseException] = []

        def main() -> None:
            try:
                setns(self._fd)
                out.append(fn())
            except BaseException as exc:
                err.append(exc)

        t = threading.Thread(target=main, name="netns-run", daemon=True)
        t.start()
        t.join()
        if err:
            raise err[0]
        return out[0]

    def close(self) -> None:
        os.close(self._fd)
