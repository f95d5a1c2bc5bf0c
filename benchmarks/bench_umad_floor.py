"""The Python + ctypes floor of a directed-route sweep: bare libibumad, no AL, no threads.

In one run, on the fat tree ``bench_discover.py`` uses (ibsim + OpenSM, all as
the same host under umad2sim): ``ibnetdiscover`` as a whole command, then, in
one Python process, N directed-route SMPs (NodeInfo, NodeDescription,
SwitchInfo and PortInfo to the fabric's nodes along their shortest paths, in
the mix of a sweep: 4,945 by default, ``ibal discover``'s count on the default
tree) sent with ``umad_send`` and read with ``umad_recv`` from one thread,
keeping ``window`` of them in flight.  Every MAD is built before the clock
starts, so the loop is only the two foreign calls per SMP and the loop's own
Python: what no Python MAD stack on this backend can beat.  Medians of wall
and CPU time (user + system); compare ratios only (the machine is shared).

    python benchmarks/bench_umad_floor.py [--smps 4945] [--windows 1,16,64] [--runs 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAD = 256
NODE_INFO, NODE_DESC, SWITCH_INFO, PORT_INFO = 0x0011, 0x0010, 0x0012, 0x0015


def paths(spines: int, leaves: int, hosts: int) -> list[tuple[tuple[int, ...], int]]:
    """(initial path, ports) of every node, seen from the last host (``H-<leaves-1>-<hosts>``).

    Host port 1 goes to its leaf; leaf ports ``hosts+1..`` to the spines; spine
    port ``j+1`` to leaf ``j``; leaf port ``k`` to host ``k`` (``fat_tree``).
    """
    out: list[tuple[tuple[int, ...], int]] = [((), 1), ((1,), hosts + spines)]
    out += [((1, hosts + 1 + i), leaves) for i in range(spines)]
    for j in range(leaves):
        if j != leaves - 1:
            out.append(((1, hosts + 1, j + 1), hosts + spines))
        down = (1,) if j == leaves - 1 else (1, hosts + 1, j + 1)
        out += [((*down, k), 1) for k in range(1, hosts + 1) if (j, k) != (leaves - 1, hosts)]
    return out


Request = tuple[tuple[int, ...], int, int]


def requests(spines: int, leaves: int, hosts: int, n: int) -> list[Request]:
    """``n`` (path, attribute, modifier) in a sweep's mix, repeated NodeInfo to fill up to ``n``."""
    reqs: list[Request] = []
    for path, ports in paths(spines, leaves, hosts):
        reqs += [(path, NODE_INFO, 0), (path, NODE_DESC, 0)]
        if ports > 1:
            reqs.append((path, SWITCH_INFO, 0))
            reqs += [(path, PORT_INFO, p) for p in range(ports + 1)]
        else:
            reqs.append((path, PORT_INFO, 1))
    while len(reqs) < n:
        reqs.append((reqs[len(reqs) % len(reqs)][0], NODE_INFO, 0))
    return reqs[:n]


def dr_smp(tid: int, path: tuple[int, ...], attr: int, mod: int) -> bytes:
    """A directed-route SubnGet SMP, permissive LIDs, ``path`` its initial path."""
    hdr = struct.pack(">BBBBHBBQHHIQHH", 1, 0x81, 1, 0x01, 0, 0, len(path), tid, attr, 0, mod,
                      0, 0xFFFF, 0xFFFF)  # fmt: skip
    initial = bytes([0, *path]).ljust(64, b"\0")
    return hdr.ljust(128, b"\0") + initial + bytes(64)


def inner(smps: int, windows: list[int], runs: int, tree: tuple[int, int, int]) -> None:
    """Under umad2sim: the bare loop per window; JSON on stdout."""
    lib = ctypes.CDLL("libibumad.so.3", use_errno=True)
    i, p = ctypes.c_int, ctypes.c_void_p
    lib.umad_open_port.argtypes = [ctypes.c_char_p, i]
    lib.umad_register.argtypes = [i, i, i, ctypes.c_uint8, p]
    lib.umad_send.argtypes = [i, i, p, i, i, i]
    lib.umad_recv.argtypes = [i, p, ctypes.POINTER(i), i]
    assert lib.umad_init() == 0
    portid = lib.umad_open_port(None, 0)
    assert portid >= 0, portid
    hsize = lib.umad_size()
    agent = lib.umad_register(portid, 0x81, 1, 0, None)  # every response method
    assert agent >= 0, agent
    reqs = requests(*tree, smps)
    # struct ib_user_mad: agent_id, status, timeout_ms, retries, length, then the address:
    # QPN 0, Q_Key 0, DLID permissive (big-endian), the rest zero.
    addr = struct.pack(">IIH", 0, 0, 0xFFFF).ljust(hsize - 20, b"\0")
    header = struct.pack("<5I", 0, 0, 1000, 0, 0) + addr
    out: dict[str, object] = {"smps": smps, "wall": {}, "cpu": {}}
    rx = ctypes.create_string_buffer(hsize + MAD)
    length = ctypes.c_int(MAD)
    send, recv, byref = lib.umad_send, lib.umad_recv, ctypes.byref
    tid = 0x1000
    for w in windows:
        walls, cpus = [], []
        for _ in range(runs):
            bufs = []
            for path, attr, mod in reqs:
                tid += 1
                bufs.append(ctypes.create_string_buffer(header + dr_smp(tid, path, attr, mod)))
            t, c = time.perf_counter(), time.process_time()
            sent = got = 0
            while got < smps:
                while sent < smps and sent - got < w:
                    assert send(portid, agent, bufs[sent], MAD, 1000, 0) == 0
                    sent += 1
                length.value = MAD
                rc = recv(portid, rx, byref(length), -1)
                if rc < 0 or rx.raw[4:8] != b"\0\0\0\0":  # an error or a time-out
                    raise SystemExit(f"umad_recv {rc}, status {rx.raw[4:8].hex()}")
                got += 1
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        out["wall"][str(w)] = walls  # type: ignore[index]
        out["cpu"][str(w)] = cpus  # type: ignore[index]
    print(json.dumps(out))


CPU: list[float] = []


def _timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    if r.returncode:
        raise SystemExit(f"{args} failed: {r.stderr[-2000:]}")
    return took, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--leaves", type=int, default=40)
    ap.add_argument("--hosts", type=int, default=24)
    ap.add_argument("--smps", type=int, default=4945)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--windows", default="1,16,64")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    windows = [int(w) for w in a.windows.split(",")]
    tree_shape = (a.spines, a.leaves, a.hosts)
    if a.inner:
        inner(a.smps, windows, a.runs, tree_shape)
        return 0

    from ibal.mad.discover import parse_ibnetdiscover
    from ibal.testing.ibsim import Fabric, fat_tree

    with tempfile.TemporaryDirectory(prefix="ibal-bench-floor-") as tmp:
        tree = fat_tree(Path(tmp) / "fat.net", spines=a.spines, leaves=a.leaves,
                        hosts_per_leaf=a.hosts)  # fmt: skip
        with Fabric(tree.path, Path(tmp) / "fabric", ready_within=300) as fabric:
            env = fabric.env_for(tree.hosts[-1])
            env["PYTHONPATH"] = f"{REPO}:{os.environ.get('PYTHONPATH', '')}"
            c_runs, c_cpu = [], []
            for _ in range(a.runs):
                took, text = _timed(["ibnetdiscover"], env, fabric.workdir)
                c_runs.append(took)
                c_cpu.append(CPU[-1])
            assert len(parse_ibnetdiscover(text)["nodes"]) == tree.nodes
            _, raw = _timed([sys.executable, __file__, "--inner", "--smps", str(a.smps),
                             "--runs", str(a.runs), "--windows", a.windows,
                             "--spines", str(a.spines), "--leaves", str(a.leaves),
                             "--hosts", str(a.hosts)], env, fabric.workdir)  # fmt: skip
            res = json.loads(raw.strip().splitlines()[-1])
    c, cc = statistics.median(c_runs), statistics.median(c_cpu)
    print(f"fat tree: {a.spines} spines, {a.leaves} leaves, {a.hosts} hosts per leaf "
          f"({tree.nodes} nodes); {a.smps} SMPs per loop; medians of {a.runs} runs")  # fmt: skip
    print(f"ibnetdiscover whole command   {c * 1000:8.1f} ms   cpu {cc * 1000:7.1f} ms")
    for w in windows:
        s, sc = statistics.median(res["wall"][str(w)]), statistics.median(res["cpu"][str(w)])
        print(f"bare umad loop, window {w:4d}  {s * 1000:8.1f} ms {s / c:5.2f}x   "
              f"cpu {sc * 1000:7.1f} ms {sc / cc:5.2f}x   "
              f"{sc / a.smps * 1e6:5.1f} µs cpu/SMP")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
