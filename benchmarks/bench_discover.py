"""``ibal discover`` vs ``ibnetdiscover`` on a generated two-level fat tree on ibsim + OpenSM.

In one run: ibsim + OpenSM on a fat tree (default 8 spines, 40 leaves, 24
hosts per leaf: 1,008 nodes), then, all as the same host under umad2sim,
``ibnetdiscover`` as a whole command (several runs), ``ibal discover`` as a
whole command, and the in-process sweep (the time from the first SMP to the
topology, interpreter start, imports and opening the AL excluded) at a few
window sizes.  Every result is checked to have found every node.  Figures are
medians; compare ratios only (the machine is shared).  Each figure also has its
CPU time (user + system, all threads of the process): on a loaded machine the
wall time mostly measures the scheduler, the CPU time what the code costs.

    python benchmarks/bench_discover.py [--spines 8 --leaves 40 --hosts 24] [--runs 5]
        [--baseline DIR]

``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/base main``)
times that tree's whole command too, in the same rounds: each round runs
``ibnetdiscover``, this tree's ``ibal discover``, then the baseline's, so a
before/after pair sees the same load.

Last, the floor: ``bench_umad_floor.py``'s bare ctypes libibumad loop (the same
SMP count, no AL, no threads) on the same fabric, what no Python MAD stack on
this backend can beat (``--no-floor`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def inner(windows: list[int], runs: int, via: str) -> None:
    """Under umad2sim: open the AL and the port once, then time sweeps; JSON on stdout."""
    t0 = time.perf_counter()
    import ibal
    from ibal.mad.discover import sweep
    from ibal.mad.rpc import MadClient, pick_port

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    al = ibal.open_al()
    client = MadClient(pick_port(al, via=via))
    t_open = time.perf_counter() - t1
    out: dict[str, object] = {"import": t_import, "open": t_open, "sweeps": {}}
    sweeps: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    nodes = 0
    for w in windows:
        for _ in range(runs):
            t, c = time.perf_counter(), time.process_time()
            eng = sweep(client, window=w)
            sweeps.setdefault(str(w), []).append(time.perf_counter() - t)
            cpu.setdefault(str(w), []).append(time.process_time() - c)
            nodes = len(eng.topology.nodes)
            assert not eng.failed, eng.failed[:3]
            out["smps"] = eng.asked
    out["sweeps"] = sweeps
    out["cpu"] = cpu
    out["nodes"] = nodes
    out["stats"] = client.stats
    t2 = time.perf_counter()
    client.close()
    al.close()
    out["close"] = time.perf_counter() - t2
    print(json.dumps(out))


CPU: list[float] = []  # CPU time of each _timed command, in order


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    c = _cpu_children()
    t = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t
    CPU.append(_cpu_children() - c)
    if r.returncode:
        raise SystemExit(f"{args} failed: {r.stderr[-2000:]}")
    return took, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--leaves", type=int, default=40)
    ap.add_argument("--hosts", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--windows", default="16,64,256")
    ap.add_argument("--via", default="service,agent", help="MAD paths for the in-process sweep")
    ap.add_argument("--baseline", type=Path, help="another checkout whose whole command to time "
                    "alternately with this one's")  # fmt: skip
    ap.add_argument("--no-floor", action="store_true", help="skip bench_umad_floor's loop")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    windows = [int(w) for w in a.windows.split(",")]
    if a.inner:
        inner(windows, a.runs, a.via)
        return 0

    from ibal.mad.discover import parse_ibnetdiscover
    from ibal.testing.ibsim import Fabric, fat_tree

    with tempfile.TemporaryDirectory(prefix="ibal-bench-discover-") as tmp:
        tree = fat_tree(Path(tmp) / "fat.net", spines=a.spines, leaves=a.leaves,
                        hosts_per_leaf=a.hosts)  # fmt: skip
        with Fabric(tree.path, Path(tmp) / "fabric", ready_within=300) as fabric:
            node = tree.hosts[-1]
            env = fabric.env_for(node)
            env["PYTHONPATH"] = f"{REPO}:{os.environ.get('PYTHONPATH', '')}"
            # byte-compiled modules, as an installed ibal has (cached outside the tree)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
            cwd = fabric.workdir
            trees = {"ibal": env}
            if a.baseline is not None:
                base = dict(env)
                base["PYTHONPATH"] = f"{a.baseline.resolve()}:{os.environ.get('PYTHONPATH', '')}"
                base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache-baseline")
                trees["baseline"] = base
            for tree_env in trees.values():  # byte-compile
                _timed([sys.executable, "-m", "ibal.cli", "--help"], tree_env, cwd)
            c_runs, c_text, c_cpu = [], "", []
            whole: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in trees}
            want: dict[str, object] | None = None
            for _ in range(a.runs):  # one round: ibnetdiscover, then each tree's command
                took, c_text = _timed(["ibnetdiscover"], env, cwd)
                c_runs.append(took)
                c_cpu.append(CPU[-1])
                if want is None:
                    want = parse_ibnetdiscover(c_text)
                    assert len(want["nodes"]) == tree.nodes  # type: ignore[arg-type]
                for name, tree_env in trees.items():
                    took, text = _timed([sys.executable, "-m", "ibal.cli", "discover"],
                                        tree_env, cwd)  # fmt: skip
                    whole[name][0].append(took)
                    whole[name][1].append(CPU[-1])
                    got = parse_ibnetdiscover(text)
                    assert got == want, f"{name}: ibal discover found another topology"
            py_runs, py_cpu = whole["ibal"]
            t_pass, _ = _timed([sys.executable, "-c", "pass"], env, cwd)
            inner_runs = {}
            for via in a.via.split(","):
                _, raw = _timed([sys.executable, __file__, "--inner", "--runs", str(a.runs),
                                 "--windows", a.windows, "--via", via], env, cwd)  # fmt: skip
                inner_runs[via] = json.loads(raw.strip().splitlines()[-1])
                assert inner_runs[via]["nodes"] == tree.nodes
            floor = None
            if not a.no_floor:  # the same SMP count as the sweep, bare ctypes, one thread
                smps = next(iter(inner_runs.values()))["smps"]
                _, raw = _timed([sys.executable, str(REPO / "benchmarks" / "bench_umad_floor.py"),
                                 "--inner", "--smps", str(smps), "--runs", str(a.runs),
                                 "--windows", a.windows, "--spines", str(a.spines),
                                 "--leaves", str(a.leaves), "--hosts", str(a.hosts)],
                                env, cwd)  # fmt: skip
                floor = json.loads(raw.strip().splitlines()[-1])
    c = statistics.median(c_runs)
    py = statistics.median(py_runs)
    res = next(iter(inner_runs.values()))
    print(f"fat tree: {a.spines} spines, {a.leaves} leaves, {a.hosts} hosts per leaf "
          f"({tree.nodes} nodes); {res['smps']} SMPs per sweep; "
          f"medians of {a.runs} runs")  # fmt: skip
    cc, pc = statistics.median(c_cpu), statistics.median(py_cpu)
    print(f"ibnetdiscover whole command      {c * 1000:8.1f} ms   cpu {cc * 1000:7.1f} ms")
    print(f"ibal discover whole command      {py * 1000:8.1f} ms   {py / c:5.2f}x ibnetdiscover"
          f"   cpu {pc * 1000:7.1f} ms {pc / cc:5.2f}x")  # fmt: skip
    if "baseline" in whole:
        bw, bc = (statistics.median(v) for v in whole["baseline"])
        print(f"  baseline whole command         {bw * 1000:8.1f} ms   {bw / c:5.2f}x ibnetdiscover"
              f"   cpu {bc * 1000:7.1f} ms {bc / cc:5.2f}x")  # fmt: skip
    for via, res in inner_runs.items():
        for w, runs in res["sweeps"].items():
            s = statistics.median(runs)
            sc = statistics.median(res["cpu"][w])
            print(f"sweep via {via:7s} window {int(w):4d}  {s * 1000:8.1f} ms   {s / c:5.2f}x "
                  f"ibnetdiscover   {res['smps'] / s:8.0f} SMPs/s   cpu {sc * 1000:7.1f} ms "
                  f"{sc / cc:5.2f}x")  # fmt: skip
    if floor is not None:
        for w in windows:
            s = statistics.median(floor["wall"][str(w)])
            sc = statistics.median(floor["cpu"][str(w)])
            print(f"floor: bare umad loop, window {w:4d} {s * 1000:8.1f} ms   {s / c:5.2f}x "
                  f"ibnetdiscover   {floor['smps'] / s:8.0f} SMPs/s   cpu {sc * 1000:7.1f} ms "
                  f"{sc / cc:5.2f}x")  # fmt: skip
    print(f"python3 -c pass                  {t_pass * 1000:8.1f} ms")
    print(f"in the whole command: imports {res['import'] * 1000:.0f} ms, open AL + port "
          f"{res['open'] * 1000:.0f} ms, close {res['close'] * 1000:.0f} ms")  # fmt: skip
    print(f"client stats: {res['stats']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
