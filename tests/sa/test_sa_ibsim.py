"""ibal.sa against OpenSM on ibsim, checked against ``saquery`` run in the same test.

``sa_ibsim_probe.py`` runs as ``Host`` under umad2sim (one process, requests
one per line); ``saquery`` is the independent client.  ibsim carries no RMPP:
OpenSM's multi-segment answers arrive as their first segment alone, which
must be reported as an error, not read as a short list.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibal.mad import dump, sa
from ibal.mad.consts import Method, SaAttr
from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).with_name("sa_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]


class Probe:
    """The probe process: one JSON request per line, one JSON answer per line."""

    def __init__(self, fabric: Fabric, node: str = "Host") -> None:
        env = fabric.env_for(node)
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE)], env=env, cwd=fabric.workdir, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError(f"the probe ended: {self.proc.stderr.read()[-3000:]}")
        out: dict[str, Any] = json.loads(line)
        return out

    def request(self, method: int, attr: int, data: bytes = b"", mask: int = 0,
                **kw: Any) -> dict[str, Any]:  # fmt: skip
        return self.ask(op="request", method=method, attr=attr, data=data.hex(), mask=mask, **kw)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        assert rc == 0, self.proc.stderr.read()[-3000:] if self.proc.stderr else rc


@pytest.fixture
def probe(ibsim_module_fabric: Fabric) -> Iterator[Probe]:
    p = Probe(ibsim_module_fabric)
    try:
        yield p
    finally:
        p.close()


def saquery(fabric: Fabric, *args: str) -> str:
    r = fabric.run(["saquery", *args], "Host", timeout=60)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


@pytest.mark.timeout(300)
def test_node_record_by_lid_matches_saquery(ibsim_module_fabric: Fabric, probe: Probe) -> None:
    info = probe.ask(op="info")
    assert info["lid"] and info["sm_lid"]
    for lid in (info["lid"], info["sm_lid"]):
        got = probe.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=lid),
                            sa.component_mask(sa.NODE_RECORD, ["lid"]))
        assert (got["status"], got["method"]) == ("SUCCESS", Method.GET_RESP), got
        [rec] = [bytes.fromhex(r) for r in got["records"]]
        ours = dump.saquery_node_record(rec)
        assert ours.splitlines() == saquery(ibsim_module_fabric, "NR", str(lid)).splitlines()


@pytest.mark.timeout(300)
def test_a_get_table_cut_by_ibsim_is_an_error(ibsim_module_fabric: Fabric, probe: Probe) -> None:
    got = probe.request(Method.GET_TABLE, SaAttr.NODE_RECORD)
    # Four nodes: 448 bytes of NodeRecords, three RMPP segments; ibsim carries the first.
    assert got["status"] == "ERROR" and got["records"] == [], got
    assert "cut short" in got["detail"]
    # saquery on the same fabric prints what fitted one segment (the short list we refuse).
    assert saquery(ibsim_module_fabric, "NR").count("NodeRecord dump:") < 4


@pytest.mark.timeout(300)
def test_a_one_segment_get_table_is_whole(ibsim_module_fabric: Fabric, probe: Probe) -> None:
    """OpenSM's one-segment GetTableResp crosses umad2sim whole (the provider reads its
    length): the one record, not the 200-byte data area cut into records."""
    info = probe.ask(op="info")
    got = probe.request(Method.GET_TABLE, SaAttr.NODE_RECORD,
                        sa.NODE_RECORD.encode(lid=info["lid"]),
                        sa.component_mask(sa.NODE_RECORD, ["lid"]))
    assert (got["status"], got["method"]) == ("SUCCESS", Method.GET_TABLE_RESP), got
    [rec] = [bytes.fromhex(r) for r in got["records"]]
    assert dump.saquery_node_record(rec).splitlines() == saquery(
        ibsim_module_fabric, "NR", str(info["lid"])).splitlines()
