"""``ibal saquery`` against ``saquery`` (infiniband-diags) on the same ibsim + OpenSM fabric.

Both run as ``Host`` under umad2sim in the same test; the texts must be equal,
nothing masked (the SA's answers do not move between the two runs: no
counters, no timestamps).  The ibal commands run in one process through the
CLI's entry point (``tests/mad/tools_probe.py``: each opens and closes its
own AL and SA port, as a process of its own does); one also runs as
``python -m ibal.cli`` on its own.

ibsim carries no RMPP: an answer longer than one MAD arrives as its first
MAD.  ``saquery`` then prints the records that fitted (a short list, even
garbage from the bytes after the cut); ``ibal saquery`` must refuse with a
clear message and exit status 1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).resolve().parents[1] / "mad" / "tools_probe.py"
REPO = Path(__file__).resolve().parents[2]
NODE = "Host"


def _env(fabric: Fabric) -> dict[str, str]:
    env = fabric.env_for(NODE)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _ibal(fabric: Fabric, cmds: list[list[str]]) -> list[dict[str, Any]]:
    """``ibal saquery ARGS`` for each argument list, in one process."""
    r = subprocess.run([sys.executable, str(PROBE)],
                       input=json.dumps([["saquery", *c] for c in cmds]), env=_env(fabric),
                       cwd=fabric.workdir, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _saquery(fabric: Fabric, args: list[str]) -> subprocess.CompletedProcess[str]:
    return fabric.run(["saquery", *args], NODE, timeout=60)


def _field(text: str, name: str) -> str:
    m = re.search(rf"^\s*{name}\.+(\S+)$", text, re.M)
    assert m, (name, text)
    return m.group(1)


@pytest.fixture
def lids(ibsim_module_fabric: Fabric) -> dict[str, str]:
    """LIDs from smpquery (directed route: no SA involved)."""
    f = ibsim_module_fabric
    me = f.run(["smpquery", "-D", "portinfo", "0"], NODE, check=True).stdout
    sw = f.run(["smpquery", "-D", "portinfo", "0,1", "0"], NODE, check=True).stdout
    peer = f.run(["smpquery", "-D", "portinfo", "0,1,3"], NODE, check=True).stdout

    def lid(text: str, name: str = "Lid") -> str:
        m = re.search(rf"^{name}:\.+(\d+)$", text, re.M)
        assert m, text
        return m.group(1)

    return {"host": lid(me), "sm": lid(me, "SMLid"), "switch": lid(sw), "peer": lid(peer)}


@pytest.mark.timeout(600)
def test_ibal_saquery_prints_what_saquery_prints(ibsim_module_fabric: Fabric,
                                                 lids: dict[str, str]) -> None:  # fmt: skip
    f = ibsim_module_fabric
    host, sm, sw, peer = lids["host"], lids["sm"], lids["switch"], lids["peer"]
    pr = _saquery(f, ["-p", "--src-to-dst", f"{host}:{sm}"]).stdout
    sgid, dgid = _field(pr, "sgid"), _field(pr, "dgid")
    cases = [
        ["NR", host], ["NR", sw], ["NodeRecord", sm], ["nr", f"{peer}//"],
        ["PIR", host], ["PIR", f"{sw}/2"], ["PortInfoRecord", f"{sm}/1/0"],
        ["-p", "--src-to-dst", f"{host}:{sm}"], ["-p", "--src-to-dst", f"{sm}:{peer}"],
        ["--src-to-dst", f"0x{int(peer):x}:{host}"],
        ["PR", "--slid", host, "--dlid", peer], ["-p", "--slid", peer, "--dlid", sw, "-n", "1"],
        ["--sgid-to-dgid", f"{sgid}-{dgid}"], ["PR", "--sgid", sgid, "--dgid", dgid, "-M", "0x83"],
        ["MCMR"], ["MCMR", "--mlid", "0xc000"], ["-g"], ["SR"], ["-S"], ["CPI"], ["-c"],
        ["IIR"], ["-I"], ["-s"], ["LR"], ["-x"], ["LR", f"{sw}/2"], ["LR", f"{host}/1", sw],
        ["NR", "77"],  # no such LID: no record, nothing printed
    ]  # fmt: skip
    ours = _ibal(f, cases)
    for args, got in zip(cases, ours, strict=True):
        theirs = _saquery(f, args)
        assert theirs.returncode == 0, (args, theirs.stderr)
        assert got["code"] == 0, (args, got)
        assert got["stdout"].splitlines() == theirs.stdout.splitlines(), args
    printed = {tuple(a): o["stdout"] for a, o in zip(cases, ours, strict=True)}
    assert printed[("NR", host)].count("NodeRecord dump:") == 1
    assert "Host" in printed[("NR", host)]
    assert printed[("MCMR",)].count("MCMember Record dump:") >= 1
    assert printed[("NR", "77")] == ""
    # The CLI as a process of its own (its fast exit included).
    r = subprocess.run([sys.executable, "-m", "ibal.cli", "saquery", "-p", "--src-to-dst",
                        f"{host}:{peer}"], env=_env(f), cwd=f.workdir, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == _saquery(f, ["-p", "--src-to-dst", f"{host}:{peer}"]).stdout
    assert r.stdout.count("PathRecord dump:") == 1


@pytest.mark.timeout(600)
def test_an_answer_ibsim_cut_is_an_error_not_a_short_list(
    ibsim_module_fabric: Fabric, lids: dict[str, str]
) -> None:
    """Four nodes' NodeRecords (448 bytes), 16 PathRecords, a port's GUIDInfo blocks, a
    node name or the members' names (found in every NodeRecord): more than one MAD;
    ibsim carries the first."""
    f = ibsim_module_fabric
    cases: list[tuple[list[str], str, int]] = [  # (args, saquery's record head, records there are)
        (["NR"], "NodeRecord dump:", 4), (["-N"], "NodeRecord dump:", 4),
        (["PR"], "PathRecord dump:", 16), (["GIR", lids["host"]], "GUIDInfo Record dump:", 0),
        (["NR", "Host"], "NodeRecord dump:", 1), (["-m"], "MCMemberRecord member dump:", 1),
        (["-p", "--src-to-dst", f"Host:{lids['sm']}"], "PathRecord dump:", 1),
    ]  # fmt: skip
    ours = _ibal(f, [a for a, _, _ in cases])
    for (args, _, _), got in zip(cases, ours, strict=True):
        assert got["code"] == 1 and got["stdout"] == "", (args, got)
        assert "cut short" in got["stderr"] and "not printing a partial list" in got["stderr"]
    # saquery, reading the same cut answers, prints fewer records than there are (or fails
    # looking the name up): the short lists ibal saquery refuses.
    for args, head, there in cases[:3]:
        theirs = _saquery(f, args)
        assert theirs.stdout.count(head) < there, args
