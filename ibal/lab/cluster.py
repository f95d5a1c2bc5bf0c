"""Several lab guests on one virtual link: `Lab.cluster(2)` and `ibal lab run --peers N`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from ibal.lab.link import GuestLink, Hub, LinkConfig, plan_links
from ibal.lab.vm import DEFAULT_TIMEOUT, Lab, LabResult, LabSession

_TMP_PREFIX = "ibal-lab-"


class LabCluster:
    """N guests booted in parallel, each with rxe0 on its NIC of one shared link.

    Guest i has address ``link.ip(i)`` on that NIC (10.98.0.1, .2, ... by
    default) and kernel rxe's ``rxe0`` on it, so RoCEv2 between guests crosses
    both guests' IP/UDP stacks. Use as a context manager; leaving it, or any
    guest failing to boot, powers off and cleans up every guest.
    """

    def __init__(
        self,
        lab: Lab,
        count: int,
        *,
        link: LinkConfig | None = None,
        net: bool = False,
        boot_timeout: float | None = None,
    ) -> None:
        self.lab = lab
        self.config = link or LinkConfig()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-link-"))
        self.links: list[GuestLink] = plan_links(self.config, count, self.tmp)
        self.sessions: list[LabSession] = [
            LabSession(lab, net=net, boot_timeout=boot_timeout, link=end) for end in self.links
        ]
        self.hub: Hub | None = None
        #: Seconds from launching the first qemu to the last guest's "ready".
        self.boot_seconds = 0.0
        self._closed = False

    def __len__(self) -> int:
        return len(self.sessions)

    def __getitem__(self, index: int) -> LabSession:
        return self.sessions[index]

    def __iter__(self) -> Iterator[LabSession]:
        return iter(self.sessions)

    def __enter__(self) -> LabCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def addresses(self) -> list[str]:
        """Each guest's address on the link, without prefix length, by index."""
        return [end.ip for end in self.links]

    @property
    def alive(self) -> bool:
        """Every guest is up."""
        return not self._closed and all(s.alive for s in self.sessions)

    def start(self) -> None:
        """Launch every guest, then wait for each; on any failure close them all and raise."""
        t0 = time.monotonic()
        try:
            if len(self.links) > 2:
                self.hub = Hub(self.links)
            for s in self.sessions:
                s.launch()
            for s in self.sessions:
                s.wait_ready()
        except BaseException:
            self.close()
            raise
        self.boot_seconds = time.monotonic() - t0

    def close(self) -> None:
        """Power off every guest and remove the link's sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            for s in self.sessions:
                with contextlib.suppress(Exception):
                    s.close()
        finally:
            if self.hub is not None:
                self.hub.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def env_for(self, index: int, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) plus guest `index`'s place on the link.

        IBAL_LAB_PEER is the guest's index, IBAL_LAB_ADDRESS its address,
        IBAL_LAB_PEERS every guest's address in index order (space-separated).
        """
        env = dict(os.environ if base is None else base)
        env["IBAL_LAB_PEER"] = str(index)
        env["IBAL_LAB_ADDRESS"] = self.links[index].ip
        env["IBAL_LAB_PEERS"] = " ".join(self.addresses)
        return env


def cluster(
    lab: Lab,
    count: int,
    *,
    link: LinkConfig | None = None,
    net: bool = False,
    boot_timeout: float | None = None,
) -> LabCluster:
    """`count` guests on one link, to use as ``with cluster(lab, 2) as (a, b): ...``."""
    return LabCluster(lab, count, link=link, net=net, boot_timeout=boot_timeout)



#: Called with (guest index, "stdout" or "stderr", bytes) as output arrives.
ClusterOutput = Callable[[int, str, bytes], None]


def run_on_all(
    lab_cluster: LabCluster,
    command: Sequence[str] | str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_output: ClusterOutput | None = None,
) -> list[LabResult]:
    """Run `command` in every guest at once, each with `env_for(i, env)`; results by index.

    Output reaches `on_output` in this thread as it arrives.
    """
    base = dict(os.environ if env is None else env)
    jobs = [
        s.guest_start(command, timeout=timeout, env=lab_cluster.env_for(i, base), cwd=cwd)
        for i, s in enumerate(lab_cluster.sessions)
    ]

    def pump() -> None:
        if on_output is None:
            return
        for i, job in enumerate(jobs):
            for stream in ("stdout", "stderr"):
                data = job.read_new(stream)
                if data:
                    on_output(i, stream, data)

    while not all(job.done() for job in jobs):
        pump()
        time.sleep(0.1)  # output arrives through files in the shared directory
    pump()
    return [job.result() for job in jobs]


class LinePrefixer:
    """Writes each guest's output line by line with a ``[i] `` prefix, whole lines only."""

    def __init__(self, write: Callable[[str, bytes], None], count: int) -> None:
        self._write = write
        self._width = len(str(count - 1))
        self._partial: dict[tuple[int, str], bytes] = {}

    def __call__(self, index: int, stream: str, data: bytes) -> None:
        """Take new output of guest `index`; write the lines it completes."""
        buf = self._partial.get((index, stream), b"") + data
        *lines, rest = buf.split(b"\n")
        self._partial[(index, stream)] = rest
        for line in lines:
            self._write(stream, self._prefix(index) + line + b"\n")

    def _prefix(self, index: int) -> bytes:
        return f"[{index:0{self._width}d}] ".encode()

    def flush(self) -> None:
        """Write what is left of unfinished lines (with a newline)."""
        for (index, stream), rest in sorted(self._partial.items()):
            if rest:
                self._write(stream, self._prefix(index) + rest + b"\n")
        self._partial.clear()
