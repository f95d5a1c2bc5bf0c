"""Helpers for the administrator's tools' tests against infiniband-diags on ibsim + OpenSM.

``ibal`` commands run under umad2sim as a fabric node, many in one process
(``tests/mad/tools_probe.py``: the CLI's entry point, each command opening its
own AL and CA); the real tools run as the same node in the same test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema

from ibal.testing.ibsim import Fabric
from ibal.tools.diagcli import schema

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "mad" / "tools_probe.py"
NODE = "Host"


def env(fabric: Fabric, node: str = NODE) -> dict[str, str]:
    e = fabric.env_for(node)
    e["PYTHONPATH"] = f"{REPO}:{e.get('PYTHONPATH', '')}"
    e["PYTHONFAULTHANDLER"] = "1"  # a crash under umad2sim shows its stack
    return e


def ibal(fabric: Fabric, cmds: list[list[str]], node: str = NODE,
         ok: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """``ibal CMD`` for each command, in one process: exit codes, stdout, stderr."""
    r = subprocess.run([sys.executable, str(PROBE)], input=json.dumps(cmds), env=env(fabric, node),
                       cwd=fabric.workdir, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    if ok:
        for cmd, res in zip(cmds, out, strict=True):
            assert res["code"] == 0, (cmd, res)
    return out


def tool(fabric: Fabric, args: list[str], node: str = NODE, ok: bool = True) -> str:
    r = fabric.run(args, node)
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def valid(command: str, text: str) -> Any:
    """``text`` (a ``--json`` output) parsed and validated against the command's schema."""
    data = json.loads(text)
    jsonschema.validate(data, schema(command))
    return data


def lids(fabric: Fabric, node: str = NODE) -> dict[str, int]:
    """This node's LID, its SM's and the LID of the switch one hop away."""
    sw = tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "0"], node)
    me = tool(fabric, ["smpquery", "-D", "portinfo", "0"], node)

    def field(text: str, name: str) -> int:
        m = re.search(rf"^{name}:\.+(\d+)$", text, re.M)
        assert m, text
        return int(m.group(1))

    return {"switch": field(sw, "Lid"), "host": field(me, "Lid"), "sm": field(me, "SMLid")}
