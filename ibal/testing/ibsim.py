"""A simulated InfiniBand fabric for tests and benchmarks: ibsim with OpenSM as its SM.

:class:`Fabric` starts ``ibsim -s NETFILE`` (its console on a pipe this
process owns) under a socket name of its own (``IBSIM_SOCKNAME``), starts
``opensm`` as a client of it (``LD_PRELOAD`` of ``libumad2sim.so``,
``SIM_HOST`` the SM node), and waits, polling with a deadline, until
``sminfo`` says MASTER and ``ibnetdiscover`` lists every node of the net file
with no port at LID 0.  :meth:`Fabric.env_for` is the environment a client
process needs to join as a given node; :meth:`Fabric.unlink` and
:meth:`Fabric.relink` take a link down and up on ibsim's console.

Every process started here is ended by :meth:`Fabric.stop` (only those).
Clients should run with ``cwd=fabric.workdir``: ``umad2sim`` writes a fake
sysfs (``sys-PID/``) into the working directory.

:func:`fat_tree` writes a two-level fat tree in ibnetdiscover's net-file
format; :func:`missing_packages` names the Debian packages that are absent.
"""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

UMAD2SIM_GLOB = "/usr/lib/*/umad2sim/libumad2sim.so"
LIBIBUMAD_GLOB = "/usr/lib/*/libibumad.so.3"
PROMPT = "sim> "
POLL_INTERVAL = 0.2
DATA_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "ibsim"
"""The net files shipped with the tests (present in a source checkout)."""


def _first(pattern: str) -> Path | None:
    found = sorted(glob.glob(pattern))
    return Path(found[0]) if found else None


def umad2sim_path() -> Path | None:
    """``libumad2sim.so`` (Debian ``libumad2sim0``), or ``None``."""
    return _first(UMAD2SIM_GLOB)


def missing_packages() -> list[str]:
    """The Debian packages a fabric needs that are not installed, by package name."""
    need = {
        "ibsim-utils": shutil.which("ibsim") is not None,
        "opensm": shutil.which("opensm") is not None,
        "infiniband-diags": shutil.which("sminfo") is not None
        and shutil.which("ibnetdiscover") is not None,
        "libumad2sim0": umad2sim_path() is not None,
        "libibumad3": _first(LIBIBUMAD_GLOB) is not None,
    }
    return [pkg for pkg, ok in need.items() if not ok]


class FabricError(RuntimeError):
    """ibsim or OpenSM did not start or did not bring the subnet up; the message has the logs."""


# ------------------------------------------------------------------ net files


@dataclass(frozen=True)
class NetNode:
    """One node of a net file: ``Switch``/``Hca``, its name and its port count."""

    kind: str
    name: str
    ports: int


_NODE = re.compile(r'^\s*(Switch|Hca)\s+(\d+)\s+"([^"]+)"', re.M)


def net_nodes(netfile: Path) -> list[NetNode]:
    """The nodes a net file declares, in order (the first HCA hosts the SM by default)."""
    return [
        NetNode(m.group(1), m.group(3), int(m.group(2)))
        for m in _NODE.finditer(netfile.read_text())
    ]


@dataclass(frozen=True)
class FatTree:
    """What :func:`fat_tree` wrote: the file and the node names by role."""

    path: Path
    spines: tuple[str, ...]
    leaves: tuple[str, ...]
    hosts: tuple[str, ...]

    @property
    def nodes(self) -> int:
        return len(self.spines) + len(self.leaves) + len(self.hosts)

    @property
    def sm_host(self) -> str:
        return self.hosts[0]


def fat_tree(path: Path, *, spines: int, leaves: int, hosts_per_leaf: int) -> FatTree:
    """Write a two-level fat tree: every leaf switch linked once to every spine switch.

    Leaf ``j`` port ``k`` (1..hosts_per_leaf) holds host ``H-j-k``; its ports
    after that go to the spines in order; spine ``i`` port ``j+1`` goes to
    leaf ``j``.  Hosts are single-port HCAs; the first host comes first in
    the file, so ibsim takes it as the default SM port.  ibsim's limits
    (``-N``/``-S``/``-P``, 2048 nodes and 256 switches by default) are the
    caller's: :class:`Fabric` passes what the file needs.
    """
    if min(spines, leaves, hosts_per_leaf) < 1:
        raise ValueError("a fat tree needs at least one spine, one leaf and one host per leaf")
    leaf_ports = hosts_per_leaf + spines
    if leaf_ports > 254 or leaves > 254:
        raise ValueError("a switch has at most 254 ports here")
    spine_names = tuple(f"S-spine-{i}" for i in range(spines))
    leaf_names = tuple(f"S-leaf-{j}" for j in range(leaves))
    host_names = tuple(f"H-{j}-{k}" for j in range(leaves) for k in range(1, hosts_per_leaf + 1))
    out: list[str] = [f"# two-level fat tree: {spines} spines, {leaves} leaves, "
                      f"{hosts_per_leaf} hosts per leaf\n"]  # fmt: skip
    for j in range(leaves):
        for k in range(1, hosts_per_leaf + 1):
            out.append(f'Hca 1 "H-{j}-{k}"\n[1] "{leaf_names[j]}"[{k}]\n\n')
    for j, leaf in enumerate(leaf_names):
        out.append(f'Switch {leaf_ports} "{leaf}"\n')
        for k in range(1, hosts_per_leaf + 1):
            out.append(f'[{k}] "H-{j}-{k}"[1]\n')
        for i, spine in enumerate(spine_names):
            out.append(f'[{hosts_per_leaf + 1 + i}] "{spine}"[{j + 1}]\n')
        out.append("\n")
    for i, spine in enumerate(spine_names):
        out.append(f'Switch {leaves} "{spine}"\n')
        for j, leaf in enumerate(leaf_names):
            out.append(f'[{j + 1}] "{leaf}"[{hosts_per_leaf + 1 + i}]\n')
        out.append("\n")
    path.write_text("".join(out))
    return FatTree(path, spine_names, leaf_names, host_names)


# ------------------------------------------------------------------ the fabric


class _Console:
    """ibsim's console: commands on its stdin, answers read up to the next prompt."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], log: Path) -> None:
        self._stdin = stdin
        self._chunks: queue.Queue[str | None] = queue.Queue()
        self._log = log
        self._buf = ""
        self._lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read, args=(stdout,), name="ibsim-console", daemon=True
        )
        self._reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        with self._log.open("a", encoding="utf-8", errors="replace") as log:
            while True:
                data = os.read(stdout.fileno(), 65536)
                if not data:
                    self._chunks.put(None)
                    return
                text = data.decode(errors="replace")
                log.write(text)
                log.flush()
                self._chunks.put(text)

    def read_until_prompt(self, deadline: float) -> str:
        """Console output up to (not including) the next prompt."""
        while PROMPT not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FabricError(f"ibsim console: no prompt in time (got {self._buf[-500:]!r})")
            try:
                chunk = self._chunks.get(timeout=left)
            except queue.Empty:
                continue
            if chunk is None:
                raise FabricError(f"ibsim console closed (got {self._buf[-500:]!r})")
            self._buf += chunk
        text, _, self._buf = self._buf.partition(PROMPT)
        return text

    def command(self, line: str, timeout: float) -> str:
        if "\n" in line or len(line) > 120:  # ibsim reads lines of at most 127 bytes
            raise ValueError(f"not one short console line: {line!r}")
        with self._lock:
            self._stdin.write(line.encode() + b"\n")
            self._stdin.flush()
            return self.read_until_prompt(time.monotonic() + timeout).strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()
        self._reader.join(timeout=5)


class Fabric:
    """ibsim on ``netfile`` with OpenSM as SM on ``sm_node``; see the module docstring.

    ``workdir`` holds the logs, OpenSM's cache and the clients' fake sysfs.
    ``sweep_interval`` is OpenSM's ``-s`` (seconds; ``None``: its default);
    traps from ibsim (a port's link changing) start a sweep at once anyway.
    """

    def __init__(
        self,
        netfile: Path,
        workdir: Path,
        *,
        sm_node: str | None = None,
        ready_within: float = 60.0,
        sweep_interval: int | None = None,
        opensm_args: Sequence[str] = (),
    ) -> None:
        self.netfile = Path(netfile).resolve()
        self.workdir = Path(workdir).resolve()
        self.nodes = net_nodes(self.netfile)
        hcas = [n.name for n in self.nodes if n.kind == "Hca"]
        if not hcas:
            raise ValueError(f"{netfile} declares no HCA to run the SM on")
        self.sm_node = sm_node or hcas[0]
        self.ready_within = ready_within
        self.sweep_interval = sweep_interval
        self.opensm_args = tuple(opensm_args)
        self.sockname = f"ibal-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.ibsim_log = self.workdir / "ibsim.log"
        self.opensm_log = self.workdir / "opensm.log"
        self.timings: dict[str, float] = {}
        """Seconds: ``ibsim`` (to its first prompt), ``sm_ready`` (OpenSM start to ready)."""
        self._ibsim: subprocess.Popen[bytes] | None = None
        self._opensm: subprocess.Popen[bytes] | None = None
        self._console: _Console | None = None
        self._umad2sim = umad2sim_path()

    # ------------------------------------------------------------ environment
    def env_for(self, node: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a libibumad client joining this fabric as ``node``.

        Its CA is then ``ibsim0``.  ``base`` defaults to this process's
        environment; an ``LD_PRELOAD`` there is kept after umad2sim.
        """
        if node not in {n.name for n in self.nodes}:
            raise ValueError(f"{self.netfile.name} has no node {node!r}")
        if self._umad2sim is None:
            raise FabricError("libumad2sim.so not found (apt-get install libumad2sim0)")
        env = dict(os.environ if base is None else base)
        preload = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{self._umad2sim} {preload}".strip()
        env["IBSIM_SOCKNAME"] = self.sockname
        env["SIM_HOST"] = node
        return env

    def run(
        self, args: Sequence[str], node: str | None = None, *, timeout: float = 120.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client (e.g. an infiniband-diags tool) as ``node`` (default: a non-SM HCA)."""
        return subprocess.run(
            list(args), env=self.env_for(node or self.default_client), cwd=self.workdir,
            capture_output=True, text=True, timeout=timeout, check=check,
        )  # fmt: skip

    @property
    def default_client(self) -> str:
        """The first HCA that does not run the SM (or the SM node on a one-HCA fabric)."""
        for n in self.nodes:
            if n.kind == "Hca" and n.name != self.sm_node:
                return n.name
        return self.sm_node

    # ------------------------------------------------------------ life cycle
    def __enter__(self) -> Fabric:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start ibsim and OpenSM and wait until the subnet is up (``FabricError`` if not)."""
        missing = missing_packages()
        if missing:
            raise FabricError(f"needs the Debian packages: {' '.join(missing)}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_ibsim()
            self._start_opensm()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def _sim_limits(self) -> list[str]:
        switches = [n for n in self.nodes if n.kind == "Switch"]
        ports = sum(n.ports + (1 if n.kind == "Switch" else 0) for n in self.nodes)
        args: list[str] = []
        if len(self.nodes) > 2048:
            args += ["-N", str(len(self.nodes))]
        if len(switches) > 256:
            args += ["-S", str(len(switches))]
        if ports > 13312:
            args += ["-P", str(ports)]
        return args

    def _start_ibsim(self) -> None:
        started = time.monotonic()
        env = {**os.environ, "IBSIM_SOCKNAME": self.sockname}
        self._ibsim = subprocess.Popen(
            ["ibsim", "-s", *self._sim_limits(), str(self.netfile)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self.workdir, env=env,
        )  # fmt: skip
        assert self._ibsim.stdin is not None and self._ibsim.stdout is not None
        self._console = _Console(self._ibsim.stdin, self._ibsim.stdout, self.ibsim_log)
        self._console.read_until_prompt(time.monotonic() + self.ready_within)
        self.timings["ibsim"] = time.monotonic() - started

    def _start_opensm(self) -> None:
        env = self.env_for(self.sm_node)
        env["OSM_CACHE_DIR"] = str(self.workdir)  # not the shared /var/cache/opensm
        env["OSM_TMP_DIR"] = str(self.workdir)
        args = ["opensm", "-f", str(self.opensm_log), "--dump_files_dir", str(self.workdir)]
        if self.sweep_interval is not None:
            args += ["-s", str(self.sweep_interval)]
        self._sm_started = time.monotonic()
        self._opensm = subprocess.Popen(
            [*args, *self.opensm_args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "opensm.stderr").open("wb"), cwd=self.workdir, env=env,
        )  # fmt: skip

    def wait_ready(self) -> None:
        """Poll until the SM is MASTER and every node is discovered with a LID (deadline)."""
        deadline = time.monotonic() + self.ready_within
        want = len(self.nodes)
        last = ""
        while True:
            self.check_alive()
            left = max(deadline - time.monotonic(), 1.0)
            try:
                r = self.run(["sminfo"], timeout=left)
                if "SMINFO_MASTER" in r.stdout:
                    d = self.run(["ibnetdiscover"], timeout=left)
                    found = len(_DISCOVERED_NODE.findall(d.stdout))
                    zero = _LID_ZERO.search(d.stdout)
                    if d.returncode == 0 and found == want and zero is None:
                        self.timings["sm_ready"] = time.monotonic() - self._sm_started
                        return
                    last = f"ibnetdiscover: {found} of {want} nodes, lid 0 seen: {zero is not None}"
                else:
                    last = f"sminfo: {r.stdout.strip()} {r.stderr.strip()}"
            except subprocess.TimeoutExpired as exc:
                last = f"{exc.cmd[0]} did not answer in time"
            if time.monotonic() > deadline:
                raise FabricError(f"the subnet did not come up in {self.ready_within} s ({last})"
                                  f"\n{self.logs()}")  # fmt: skip
            # A poll interval, not synchronisation: each probe answered "not yet".
            time.sleep(min(POLL_INTERVAL, max(deadline - time.monotonic(), 0)))

    def check_alive(self) -> None:
        """``FabricError`` (with the logs) if ibsim or OpenSM has exited."""
        for name, p in (("ibsim", self._ibsim), ("opensm", self._opensm)):
            if p is not None and p.poll() is not None:
                raise FabricError(f"{name} exited with status {p.returncode}\n{self.logs()}")

    def stop(self) -> None:
        """End OpenSM and ibsim (only the processes started here); idempotent."""
        osm, self._opensm = self._opensm, None
        sim, self._ibsim = self._ibsim, None
        console, self._console = self._console, None
        if osm is not None:
            _end(osm)
        if console is not None and sim is not None and sim.poll() is None:
            with contextlib.suppress(FabricError, OSError, ValueError):
                console.command("Quit", timeout=5)
        if sim is not None:
            _end(sim)
        if console is not None:
            console.close()

    def stop_sm(self) -> None:
        """End OpenSM (ibsim keeps running): SA requests go unanswered until :meth:`start_sm`."""
        osm, self._opensm = self._opensm, None
        if osm is not None:
            _end(osm)

    def start_sm(self, node: str | None = None) -> None:
        """Start OpenSM again, on ``node`` (default: where it ran last), and wait until ready.

        On another node the ports see a new SM LID (SM_CHANGE); the new OpenSM
        starts with no multicast groups but its own.
        """
        self.stop_sm()
        if node is not None:
            self.env_for(node)  # checks the name
            self.sm_node = node
        self._start_opensm()
        self.wait_ready()

    # ------------------------------------------------------------ console
    def console(self, line: str, timeout: float = 30.0) -> str:
        """One ibsim console command (``help`` lists them); its output."""
        if self._console is None:
            raise FabricError("ibsim is not running")
        return self._console.command(line, timeout)

    def unlink(self, node: str, port: int) -> str:
        """Take the link at ``node``'s ``port`` down (both ends go DOWN; ibsim traps the SM)."""
        return self.console(f'Unlink "{node}"[{port}]')

    def relink(self, node: str, port: int) -> str:
        """Restore a link :meth:`unlink` removed (the SM then brings it to ACTIVE)."""
        return self.console(f'ReLink "{node}"[{port}]')

    def logs(self, tail: int = 4000) -> str:
        """The ends of ibsim's and OpenSM's logs, for failure reports."""
        parts = []
        for path in (self.ibsim_log, self.opensm_log, self.workdir / "opensm.stderr"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"--- {path.name} (last {tail} chars)\n{text[-tail:]}")
        return "\n".join(parts)


_DISCOVERED_NODE = re.compile(r'^(?:Switch|Ca|Rt)\s+\d+\s+"', re.M)
_LID_ZERO = re.compile(r"\blid 0\b")


def _end(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


__all__ = [
    "DATA_DIR",
    "Fabric",
    "FabricError",
    "FatTree",
    "NetNode",
    "fat_tree",
    "missing_packages",
    "net_nodes",
    "umad2sim_path",
]
