"""SA PathRecord queries per second against OpenSM on ibsim: ``saquery`` vs ``ibal``.

In one run, on one ibsim + OpenSM fabric (``tests/data/ibsim/small.net`` by
default), all as the same host under umad2sim, the same PathRecord question
(``-p --src-to-dst SRC:DST``: a SubnAdmGetTable with SLID, DLID, NumbPath):

* ``saquery``: one process per query (``--runs`` of them),
* ``ibal saquery``: one process per query (``python -m ibal.cli``),
* one ibal process asking ``--queries`` PathRecords through
  :meth:`ibal.sa.SaPort.request` with callbacks, ``W`` requests in flight
  (``--windows``); the time from the first request to the last answer
  (interpreter start, imports and opening the AL excluded, printed apart).

Every answer is checked (status SUCCESS, one PathRecord, the asked SLID and
DLID).  Each figure has its wall time and its CPU time (user + system; for
the in-process loop, the client's own, OpenSM's and ibsim's, read from
``/proc`` for the processes started for this fabric), which shows where the
limit is: on a loaded machine the wall time mostly measures the scheduler.
Compare ratios only (the machine is shared).

    python benchmarks/bench_sa.py [--runs 20] [--queries 2000] [--windows 1,8,32,128]
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
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def inner(src: int, dst: int, queries: int, windows: list[int]) -> None:
    """Under umad2sim: open the AL and the SA port once, then time windows of requests."""
    t0 = time.perf_counter()
    import ibal
    from ibal.sa import SaPort
    from ibal.wire.mad import sa
    from ibal.wire.mad.consts import Method, SaAttr

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    al = ibal.open_al()
    port = SaPort.open(al)
    t_open = time.perf_counter() - t1
    names = ["slid", "dlid", "numb_path"]
    data = bytes(sa.PATH_RECORD.encode(slid=src, dlid=dst, numb_path=0x7F))
    mask = sa.component_mask(sa.PATH_RECORD, names)
    out: dict[str, object] = {"import": t_import, "open": t_open, "runs": {}}
    runs: dict[str, dict[str, float]] = {}
    # one warm-up query (first-use costs: pools, the SM LID, OpenSM's path cache)
    first = port.request(Method.GET_TABLE, SaAttr.PATH_RECORD, data, mask).wait(30)
    assert first.ok and len(first.records) == 1, first
    for w in windows:
        runs[str(w)] = _window(port, w, queries, data, mask, (src, dst))
        print(json.dumps({"window": w, **runs[str(w)]}), file=sys.stderr, flush=True)
    out["runs"] = runs
    out["stale"] = port.stats.get("stale_answers", 0)
    port.close()
    al.close()
    print(json.dumps(out))


def _window(port: Any, w: int, queries: int, data: bytes, mask: int,
            want: tuple[int, int]) -> dict[str, float]:  # fmt: skip
    """``queries`` PathRecord requests, ``w`` in flight (each answer sends the next)."""
    from ibal.wire.mad import sa
    from ibal.wire.mad.consts import Method, SaAttr

    lock = threading.Lock()
    done = threading.Event()
    state = {"sent": 0, "got": 0}
    bad: list[str] = []

    def send() -> None:
        port.request(Method.GET_TABLE, SaAttr.PATH_RECORD, data, mask, timeout_ms=2000,
                     retry_cnt=3, callback=on_answer)  # fmt: skip

    def on_answer(a: Any) -> None:
        ok = a.ok and len(a.records) == 1
        if ok:
            rec = sa.PATH_RECORD.decode(a.records[0])
            ok = (rec["slid"], rec["dlid"]) == want
        with lock:
            state["got"] += 1
            if not ok:
                bad.append(f"{a.status.name} {a.detail}")
            again = state["sent"] < queries
            if again:
                state["sent"] += 1
            if state["got"] == queries:
                done.set()
        if again:
            send()

    c0, w0 = time.process_time(), time.perf_counter()
    n = min(w, queries)
    with lock:
        state["sent"] = n
    for _ in range(n):
        send()
    if not done.wait(600):
        raise SystemExit(f"window {w}: {state['got']} of {queries} answers in 600 s")
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if bad:
        raise SystemExit(f"window {w}: {len(bad)} bad answers, e.g. {bad[:3]}")
    return {"wall": wall, "cpu": cpu, "queries": queries}


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _proc_cpu(pid: int) -> float:
    """User + system seconds of ``pid`` (its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _fabric_pids(workdir: Path) -> dict[str, int]:
    """ibsim's and OpenSM's PIDs: the processes with those names working in ``workdir``
    (the fabric starts both there; another helper's fabric has another directory)."""
    found: dict[str, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            comm = Path(f"/proc/{d}/comm").read_text().strip()
            if comm in ("ibsim", "opensm") and Path(os.readlink(f"/proc/{d}/cwd")) == workdir:
                found[comm] = int(d)
        except OSError:
            continue
    return found


def _timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    c = _cpu_children()
    t = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t
    if r.returncode or r.stdout.count("PathRecord dump:") != 1:
        raise SystemExit(f"{args} failed: {r.stdout[-500:]} {r.stderr[-2000:]}")
    return took, _cpu_children() - c, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="processes per tool")
    ap.add_argument("--queries", type=int, default=2000, help="queries per in-process window")
    ap.add_argument("--windows", default="1,8,32,128")
    ap.add_argument("--netfile", type=Path, help="an ibsim net file [default: small.net]")
    ap.add_argument("--node", default="Host", help="the client node")
    ap.add_argument("--inner", nargs=2, type=int, metavar=("SRC", "DST"),
                    help=argparse.SUPPRESS)  # fmt: skip
    a = ap.parse_args()
    windows = [int(w) for w in a.windows.split(",")]
    if a.inner:
        inner(a.inner[0], a.inner[1], a.queries, windows)
        return 0

    from ibal.testing.ibsim import DATA_DIR, Fabric

    netfile = a.netfile or DATA_DIR / "small.net"
    with tempfile.TemporaryDirectory(prefix="ibal-bench-sa-") as tmp, \
            Fabric(netfile, Path(tmp) / "fabric") as fabric:  # fmt: skip
        env = fabric.env_for(a.node)
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        # byte-compiled modules, as an installed ibal has (cached outside the tree)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cwd = fabric.workdir
        subprocess.run([sys.executable, "-m", "ibal.cli", "--help"], env=env, cwd=cwd,
                       capture_output=True, check=True)  # byte-compile  # fmt: skip
        pids = _fabric_pids(cwd)
        assert set(pids) == {"ibsim", "opensm"}, pids
        me = subprocess.run(["smpquery", "-D", "portinfo", "0"], env=env, cwd=cwd,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
        src = int(next(ln for ln in me.splitlines() if ln.startswith("Lid:")).split(".")[-1])
        dst = int(next(ln for ln in me.splitlines() if ln.startswith("SMLid:")).split(".")[-1])
        pr = ["-p", "--src-to-dst", f"{src}:{dst}"]
        cmds = {"saquery": ["saquery", *pr],
                "ibal saquery": [sys.executable, "-m", "ibal.cli", "saquery", *pr]}  # fmt: skip
        wall: dict[str, list[float]] = {k: [] for k in cmds}
        cpu: dict[str, list[float]] = {k: [] for k in cmds}
        texts: dict[str, str] = {}
        for _ in range(a.runs):  # alternate, so both see the same load
            for name, args in cmds.items():
                w, c, texts[name] = _timed(args, env, cwd)
                wall[name].append(w)
                cpu[name].append(c)
        assert texts["saquery"] == texts["ibal saquery"], texts
        sm0 = {k: _proc_cpu(p) for k, p in pids.items()}
        r = subprocess.run([sys.executable, __file__, "--inner", str(src), str(dst),
                            "--queries", str(a.queries), "--windows", a.windows],
                           env=env, cwd=cwd, capture_output=True, text=True,
                           timeout=3600)  # fmt: skip
        if r.returncode:
            raise SystemExit(f"in-process run failed: {r.stderr[-3000:]}")
        sm1 = {k: _proc_cpu(p) for k, p in pids.items()}
        inproc = json.loads(r.stdout.strip().splitlines()[-1])

    print(f"fabric {netfile.name}, PathRecord {src} -> {dst}, {a.runs} processes per tool, "
          f"{a.queries} queries per window")  # fmt: skip
    per_q = statistics.median(wall["saquery"])
    base_qps = 1 / per_q
    print(f"{'':34} {'wall/query':>11} {'CPU/query':>10} {'queries/s':>10} {'x saquery':>9}")
    for name in cmds:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name + ' (process per query)':34} {w * 1e3:9.2f}ms {c * 1e3:8.2f}ms "
              f"{1 / w:10.1f} {(1 / w) / base_qps:9.2f}")  # fmt: skip
    for win, run in inproc["runs"].items():
        q = run["queries"]
        qps = q / run["wall"]
        print(f"{'ibal, one process, window ' + win:34} {run['wall'] / q * 1e3:9.3f}ms "
              f"{run['cpu'] / q * 1e3:8.3f}ms {qps:10.1f} {qps / base_qps:9.2f}")  # fmt: skip
    total_q = sum(run["queries"] for run in inproc["runs"].values()) + 1
    total_wall = sum(run["wall"] for run in inproc["runs"].values())
    sm = {k: (sm1[k] - sm0[k]) for k in sm0}
    client = sum(run["cpu"] for run in inproc["runs"].values())
    print(f"in-process run: import {inproc['import'] * 1e3:.0f} ms, open AL + SA port "
          f"{inproc['open'] * 1e3:.0f} ms; CPU per query over all windows: client "
          f"{client / total_q * 1e6:.0f} us, OpenSM {sm['opensm'] / total_q * 1e6:.0f} us, "
          f"ibsim {sm['ibsim'] / total_q * 1e6:.0f} us (whole process, incl. its sweeps); "
          f"wall per query {total_wall / total_q * 1e6:.0f} us")  # fmt: skip
    print(json.dumps({"saquery_wall": wall["saquery"], "ibal_wall": wall["ibal saquery"],
                      "saquery_cpu": cpu["saquery"], "ibal_cpu": cpu["ibal saquery"],
                      "inproc": inproc, "fabric_cpu": sm}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
