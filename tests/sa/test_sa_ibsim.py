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

from ibal.testing.ibsim import Fabric
from ibal.types import Gid
from ibal.wire.mad import dump, sa
from ibal.wire.mad.consts import Method, SaAttr

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


def py(probe: Probe, fn: str, *args: Any, **kwargs: Any) -> list[bytes]:
    got = probe.ask(op="py", fn=fn, args=list(args), kwargs=kwargs)
    assert got["status"] == "SUCCESS", got
    return [bytes.fromhex(r) for r in got["records"]]


def node_guid_of(fabric: Fabric, lid: int) -> int:
    text = saquery(fabric, "NR", str(lid))
    return int(next(ln for ln in text.splitlines() if "node_guid" in ln).split(".")[-1], 16)


@pytest.mark.timeout(300)
def test_pythonic_queries_match_saquery(ibsim_module_fabric: Fabric, probe: Probe) -> None:
    fab = ibsim_module_fabric
    info = probe.ask(op="info")
    host, sm = info["lid"], info["sm_lid"]
    peer_guid = node_guid_of(fab, sm)
    # NodeRecord by LID and by node GUID
    [nr] = py(probe, "node_records", lid=host)
    assert dump.saquery_node_record(nr).splitlines() == saquery(fab, "NR", str(host)).splitlines()
    [nr] = py(probe, "node_records", guid=peer_guid)
    assert dump.saquery_node_record(nr).splitlines() == saquery(fab, "NR", str(sm)).splitlines()
    # PortInfoRecord of the host's port
    [pir] = py(probe, "port_info_records", lid=host)
    assert dump.saquery_portinfo_record(pir).splitlines() == saquery(
        fab, "PIR", str(host)).splitlines()
    # PathRecords: by LIDs, by GIDs, by port GUIDs: the same record as saquery -p
    theirs = saquery(fab, "-p", "--src-to-dst", f"{host}:{sm}").splitlines()
    [pr] = py(probe, "path_records", host, sm)
    assert dump.saquery_path_record(pr).splitlines() == theirs
    p = sa.PATH_RECORD.decode(pr)
    sgid, dgid = dump.ntop(p["sgid"]), dump.ntop(p["dgid"])
    [by_gid] = py(probe, "path_records", sgid, dgid)
    assert dump.saquery_path_record(by_gid).splitlines() == theirs
    [by_guid] = py(probe, "path_records", int.from_bytes(p["sgid"][8:], "big"),
                   int.from_bytes(p["dgid"][8:], "big"))
    assert dump.saquery_path_record(by_guid).splitlines() == theirs
    # Selectors: the path's own SL, MTU and rate select it; a larger MTU selects nothing.
    [sel] = py(probe, "path_records", host, sm, sl=p["sl"], mtu=[2, p["mtu"]],
               rate=[2, p["rate"]], packet_life=[3, 0], pkey=p["p_key"], reversible=True)
    assert dump.saquery_path_record(sel).splitlines() == theirs
    assert py(probe, "path_records", host, sm, mtu=[0, p["mtu"]]) == []
    # User-defined: a NodeRecord Get by LID
    [ur] = py(probe, "user_query", Method.GET, SaAttr.NODE_RECORD,
              sa.component_mask(sa.NODE_RECORD, ["lid"]),
              record=sa.NODE_RECORD.encode(lid=sm).hex())
    assert dump.saquery_node_record(ur).splitlines() == saquery(fab, "NR", str(sm)).splitlines()


@pytest.mark.timeout(300)
def test_service_records_match_saquery(ibsim_fabric: Fabric) -> None:
    probe = Probe(ibsim_fabric)
    try:
        info = probe.ask(op="info")
        gid = Gid(info["gid"]).packed
        rec = sa.SERVICE_RECORD.encode(service_id=0x1234_5678_9ABC_DEF0, service_gid=gid,
                                       service_p_key=0xFFFF, service_lease=0xFFFFFFFF,
                                       service_name=b"ibal-sa-test".ljust(64, b"\0"),
                                       service_data8_0=7)  # fmt: skip
        mask = sa.component_mask(sa.SERVICE_RECORD, ["service_id", "service_gid",
                                                     "service_p_key", "service_lease",
                                                     "service_name", "service_data8_0"])
        got = probe.request(Method.SET, SaAttr.SERVICE_RECORD, rec, mask)
        assert got["status"] == "SUCCESS", got
        theirs = saquery(ibsim_fabric, "SR").splitlines()
        for kw in ({"name": "ibal-sa-test"}, {"service_id": 0x1234_5678_9ABC_DEF0}, {}):
            [sr] = py(probe, "service_records", **kw)
            assert dump.saquery_service_record(sr).splitlines() == theirs
        assert py(probe, "service_records", name="no-such-service") == []
    finally:
        probe.close()


@pytest.mark.timeout(300)
def test_no_sm_times_out_and_a_restarted_sm_answers(ibsim_fabric: Fabric) -> None:
    probe = Probe(ibsim_fabric)
    try:
        info = probe.ask(op="info")
        ask = {"method": Method.GET, "attr": SaAttr.NODE_RECORD,
               "data": sa.NODE_RECORD.encode(lid=info["lid"]).hex(),
               "mask": sa.component_mask(sa.NODE_RECORD, ["lid"])}
        assert probe.ask(op="request", **ask)["status"] == "SUCCESS"
        ibsim_fabric.stop_sm()
        got = probe.ask(op="request", timeout_ms=300, retry_cnt=1, **ask)
        assert got["status"] == "TIMEOUT" and "2 tries" in got["detail"], got
        ibsim_fabric.start_sm()
        got = probe.ask(op="request", **ask)  # the same process, nothing reopened
        assert got["status"] == "SUCCESS", got
        [rec] = [bytes.fromhex(r) for r in got["records"]]
        assert dump.saquery_node_record(rec).splitlines() == saquery(
            ibsim_fabric, "NR", str(info["lid"])).splitlines()
    finally:
        probe.close()
