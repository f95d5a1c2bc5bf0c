"""``ibal pingpong`` (rdma_core provider on kernel rxe) against the unmodified
``ibv_rc_pingpong`` / ``ibv_ud_pingpong`` in the lab guest, both directions.

One 2-CPU guest for the module (ibal's start-up under emulation is most of the
time); each case is a server/client pair run by ``pingpong_pairs.py`` in the
guest, which prints one JSON line per case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibal.lab import Lab, LabSession
from ibal.lab.pytest_plugin import lab_requires

pytestmark = pytest.mark.lab

HERE = Path(__file__).parent
REPO = HERE.parent.parent
DRIVER = HERE / "pingpong_pairs.py"
IBAL = [sys.executable, "-m", "ibal.cli", "pingpong", "--provider", "rdma_core", "-d", "rxe0"]
GID = ["-g", "1"]  # the IPv4-mapped GID of rxe0 on lo


@pytest.fixture(scope="module")
def guest(ibal_lab: Lab) -> Iterator[LabSession]:
    lab_requires("pyverbs")
    if shutil.which("ibv_rc_pingpong") is None or shutil.which("ibv_ud_pingpong") is None:
        reason = "ibv_rc_pingpong/ibv_ud_pingpong missing (apt-get install ibverbs-utils)"
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(reason)
    lab = Lab(kernel=ibal_lab.kernel_spec, cache_dir=ibal_lab.cache_dir, cpus=2)
    with lab.session() as s:
        shutil.copy(DRIVER, s.host_dir)
        yield s


def run_cases(
    s: LabSession, cases: list[dict[str, Any]], parallel: int = 1
) -> dict[str, dict[str, Any]]:
    r = s.run(
        [sys.executable, s.guest_path(s.host_dir / DRIVER.name), json.dumps(cases), str(parallel)],
        timeout=240 * len(cases),
        cwd=str(REPO),
    )
    assert r.returncode == 0, r.stderr_text
    return {d["name"]: d for d in map(json.loads, r.stdout_text.splitlines())}


ADDR = re.compile(
    r"(local|remote) address: +LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})"
)


def check(res: dict[str, Any], size: int, iters: int) -> None:
    for side in ("server", "client"):
        out = res[f"{side}_out"]
        assert res[f"{side}_rc"] == 0, f"{res['name']} {side}: {res[f'{side}_err']}\n{out}"
        assert f"{size * iters * 2} bytes in " in out, out
        assert re.search(rf"^{iters} iters in [0-9.]+ seconds = [0-9.]+ usec/iter$", out, re.M)
    s = {m[0]: m[1:] for m in ADDR.findall(res["server_out"])}
    c = {m[0]: m[1:] for m in ADDR.findall(res["client_out"])}
    assert s["remote"] == c["local"] and c["remote"] == s["local"]


PARALLEL = 2
"""Pairs at once in the guest (its 2 CPUs): each Python side's start-up under TCG is most
of a case's time. Every case has a TCP port of its own (PORT, PORT + 1, ...)."""
PORT = 18515


def pair_cases(tool: str, extra: list[str], sizes: list[int]) -> list[dict[str, Any]]:
    cases = []
    for size in sizes:
        n = 3 if size >= 1 << 20 else 10
        args = [*GID, "-s", str(size), "-n", str(n), *extra]
        ours = IBAL + (["--ud"] if tool == "ibv_ud_pingpong" else []) + args
        theirs = [tool, "-d", "rxe0", *args]
        cases.append({"name": f"ibal-server-{size}", "server": ours,
                      "client": [*theirs, "127.0.0.1"], "size": size, "iters": n})  # fmt: skip
        cases.append({"name": f"ibv-server-{size}", "server": theirs,
                      "client": [*ours, "127.0.0.1"], "size": size, "iters": n})  # fmt: skip
    for i, case in enumerate(cases):
        port = ["-p", str(PORT + i)]
        case["server"] = [*case["server"], *port]
        case["client"] = [*case["client"][:-1], *port, case["client"][-1]]  # before the host
    return cases


@pytest.mark.timeout(2400)
def test_rc_pingpong_interoperates_both_ways(guest: LabSession) -> None:
    cases = pair_cases("ibv_rc_pingpong", [], [1, 4096, 65536, 1 << 20])
    results = run_cases(guest, cases, PARALLEL)
    for case in cases:
        check(results[case["name"]], case["size"], case["iters"])


@pytest.mark.timeout(1200)
def test_rc_pingpong_with_completion_events_and_mtu(guest: LabSession) -> None:
    cases = pair_cases("ibv_rc_pingpong", ["-e", "-m", "4096", "-r", "4"], [8192])
    results = run_cases(guest, cases, PARALLEL)
    for case in cases:
        check(results[case["name"]], case["size"], case["iters"])


@pytest.mark.timeout(1800)
def test_ud_pingpong_interoperates_both_ways(guest: LabSession) -> None:
    cases = pair_cases("ibv_ud_pingpong", [], [1, 1024, 4096])
    results = run_cases(guest, cases, PARALLEL)
    for case in cases:
        check(results[case["name"]], case["size"], case["iters"])


PERFTEST = [sys.executable, "-m", "ibal.cli", "perftest"]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("test", ["write_bw", "send_lat"])
def test_ibal_perftest_between_two_guest_processes(guest: LabSession, test: str) -> None:
    size, iters = (65536, 500) if test == "write_bw" else (8, 200)
    args = [test, "--provider", "rdma_core", "-d", "rxe0", "-x", "1", "-F",
            "-s", str(size), "-n", str(iters)]  # fmt: skip
    cases = [{"name": test, "server": PERFTEST + args, "client": [*PERFTEST, *args, "127.0.0.1"]}]
    res = run_cases(guest, cases)[test]
    for side in ("server", "client"):
        out = res[f"{side}_out"]
        assert res[f"{side}_rc"] == 0, f"{side}: {res[f'{side}_err']}\n{out}"
        lines = out.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith(" #bytes"))
        fields = lines[header + 1].split()
        assert fields[:2] == [str(size), str(iters)], out
        assert len(fields) == (5 if test == "write_bw" else 9)
        assert all(float(f) > 0 for f in fields[2:]), out
        assert " Link type       : Ethernet" in lines and " GID index       : 1" in lines
