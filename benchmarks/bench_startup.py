"""Start-up of the diagnostics: each whole command against the C tool and ``python3 -c pass``.

One ibsim + OpenSM fat tree (default 8 spines, 40 leaves, 24 hosts per leaf:
1,008 nodes), every command run as the same host under umad2sim, in rounds:
each round runs ``python3 -c pass``, ``smpquery nodeinfo LID`` and ``ibal
smpquery nodeinfo LID``, ``ibnetdiscover`` and ``ibal discover``, ``ibal
--help`` and ``python3 -c 'import ibal.cli'``, so every pair sees the same
load.  Wall time and CPU (the child's user + system) per command, medians;
outputs are checked (the same NodeInfo text, the same topology).  Modules are
byte-compiled once first, as an installed ibal has them.

    python3 benchmarks/bench_startup.py [--spines 8 --leaves 40 --hosts 24] [--runs 7]
        [--json] [--baseline DIR]

``--baseline DIR``: another ibal tree (e.g. ``git archive COMMIT | tar -x -C DIR``)
whose ``smpquery`` and ``discover`` run in the same rounds, for a before/after
that sees the same load.

The issue's targets: ``ibal discover`` at most 2.0x ``ibnetdiscover``, ``ibal
smpquery nodeinfo`` within 3x of ``python3 -c pass`` (whole commands, wall).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    c = _cpu_children()
    t = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"{args} failed: {r.stderr[-2000:]}")
    return wall, _cpu_children() - c, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--leaves", type=int, default=40)
    ap.add_argument("--hosts", type=int, default=24)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="the medians as JSON too")
    ap.add_argument("--baseline", type=Path, help="another ibal tree to run alongside")
    a = ap.parse_args()

    from ibal.mad.discover import parse_ibnetdiscover
    from ibal.testing.ibsim import Fabric, fat_tree

    py = sys.executable
    ibal = [py, "-m", "ibal.cli"]
    with tempfile.TemporaryDirectory(prefix="ibal-bench-startup-") as tmp:
        tree = fat_tree(Path(tmp) / "fat.net", spines=a.spines, leaves=a.leaves,
                        hosts_per_leaf=a.hosts)  # fmt: skip
        with Fabric(tree.path, Path(tmp) / "fabric", ready_within=300) as fabric:
            env = fabric.env_for(tree.hosts[-1])
            env["PYTHONPATH"] = f"{REPO}:{os.environ.get('PYTHONPATH', '')}"
            env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte-compiled, as installed
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
            cwd = fabric.workdir
            _timed([*ibal, "--help"], env, cwd)
            _timed([*ibal, "discover"], env, cwd)  # compiles the discover path
            me = _timed(["smpquery", "-D", "portinfo", "0", "1"], env, cwd)[2]
            m = re.search(r"^Lid:\.+(\d+)$", me, re.M)
            assert m, me
            lid = m.group(1)
            cmds = {
                "python3 -c pass": [py, "-c", "pass"],
                "python3 -c 'import ibal.cli'": [py, "-c", "import ibal.cli"],
                "ibal --help": [*ibal, "--help"],
                "smpquery nodeinfo": ["smpquery", "nodeinfo", lid],
                "ibal smpquery nodeinfo": [*ibal, "smpquery", "nodeinfo", lid],
                "ibnetdiscover": ["ibnetdiscover"],
                "ibal discover": [*ibal, "discover"],
            }
            envs = {k: env for k in cmds}
            if a.baseline is not None:
                old = dict(env, PYTHONPATH=f"{a.baseline.resolve()}:"
                           f"{os.environ.get('PYTHONPATH', '')}",
                           PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache-baseline"))  # fmt: skip
                for name, args in (("smpquery nodeinfo", ["smpquery", "nodeinfo", lid]),
                                   ("discover", ["discover"])):  # fmt: skip
                    key = f"baseline ibal {name}"
                    cmds[key], envs[key] = [*ibal, *args], old
                    _timed(cmds[key], old, cwd)  # byte-compiles the baseline
            wall: dict[str, list[float]] = {k: [] for k in cmds}
            cpu: dict[str, list[float]] = {k: [] for k in cmds}
            out: dict[str, str] = {}
            for _ in range(a.runs):
                for name, args in cmds.items():
                    w, c, text = _timed(args, envs[name], cwd)
                    wall[name].append(w)
                    cpu[name].append(c)
                    out[name] = text
            assert out["ibal smpquery nodeinfo"] == out["smpquery nodeinfo"]
            topo = parse_ibnetdiscover(out["ibnetdiscover"])
            assert len(topo["nodes"]) == tree.nodes
            assert parse_ibnetdiscover(out["ibal discover"]) == topo
            if a.baseline is not None:
                assert out["baseline ibal smpquery nodeinfo"] == out["smpquery nodeinfo"]
                assert parse_ibnetdiscover(out["baseline ibal discover"]) == topo
    load = os.getloadavg()[0]
    med = {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in cmds}
    print(f"fat tree: {a.spines} spines, {a.leaves} leaves, {a.hosts} hosts per leaf "
          f"({tree.nodes} nodes); medians of {a.runs} rounds; load {load:.1f} at the end")
    base = {"ibal smpquery nodeinfo": "python3 -c pass", "ibal discover": "ibnetdiscover",
            "smpquery nodeinfo": "python3 -c pass", "ibal --help": "python3 -c pass",
            "python3 -c 'import ibal.cli'": "python3 -c pass",
            "baseline ibal smpquery nodeinfo": "python3 -c pass",
            "baseline ibal discover": "ibnetdiscover"}  # fmt: skip
    print(f"{'command':32s} {'wall ms':>8s} {'CPU ms':>8s}   ratio (wall, CPU)")
    for name, (w, c) in med.items():
        ref = base.get(name)
        ratio = ""
        if ref:
            rw, rc = med[ref]
            ratio = f"{w / rw:5.2f}x / {c / rc:5.2f}x {ref}"
        print(f"{name:32s} {w * 1000:8.1f} {c * 1000:8.1f}   {ratio}")
    if a.json:
        print(json.dumps({"nodes": tree.nodes, "runs": a.runs, "load": load,
                          "medians": {k: {"wall": w, "cpu": c} for k, (w, c) in med.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
