"""ibal.mad dumps against infiniband-diags on the same ibsim + OpenSM fabric.

``umad_query_probe.py`` (on ``Host``, under ``libumad2sim.so``) fetches raw
MADs built with :func:`ibal.wire.mad.header.build`: NodeInfo, NodeDescription,
PortInfo, SwitchInfo, P_KeyTable (directed route and LID routed), PortCounters,
PortCountersExtended and the PMA's ClassPortInfo, and single-record SA
answers from OpenSM (NodeRecord, PortInfoRecord, PathRecord).  The test
dumps them with :mod:`ibal.wire.mad.dump` and compares the text with what
``smpquery``, ``perfquery`` and ``saquery`` print for the same target, header
lines included.  Counters are read by the probe and the tool at different
moments, so the packet/data counters (which the queries themselves move) are
compared after masking those values only.

Runs on the shared ibsim/OpenSM harness (the ``ibsim_module_fabric`` fixture of
:mod:`ibal.testing.ibsim`: skips naming the missing Debian packages, fails
instead when ``IBAL_LAB_REQUIRED=1``).
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
from ibal.wire.mad import dump, header, perf, sa, smp
from ibal.wire.mad.consts import MgmtClass, PerfAttr, SaAttr, SmpAttr

PROBE = Path(__file__).with_name("umad_query_probe.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fabric(ibsim_module_fabric: Fabric) -> dict[str, str]:
    """A client on ``Host`` of the shared small fabric (Switch1 port 2)."""
    env = ibsim_module_fabric.env_for("Host")
    env["IBAL_TEST_CWD"] = str(ibsim_module_fabric.workdir)
    return env


def _tool(args: list[str], env: dict[str, str]) -> str:
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60,
                       cwd=env["IBAL_TEST_CWD"])  # fmt: skip
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def _probe(env: dict[str, str], reqs: list[dict[str, Any]]) -> dict[str, bytes]:
    penv = {**env, "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}"}
    r = subprocess.run(
        [sys.executable, str(PROBE)], input=json.dumps(reqs), env=penv,
        capture_output=True, text=True, timeout=180, cwd=env["IBAL_TEST_CWD"],
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    missing = [k for k, v in got.items() if v is None]
    assert not missing, f"no answer to {missing}: {r.stderr[-2000:]}"
    return {k: bytes.fromhex(v) for k, v in got.items()}


def _ok(mad: bytes) -> memoryview:
    """The attribute data of a successful GetResp."""
    h = header.header(mad)
    assert h.method & 0x80 and h.status & 0x7FFF == 0, h
    return header.payload(mad)


def _smp(name: str, attr: int, *, lid: int | None = None, dr: list[int] | None = None,
         mod: int = 0) -> dict[str, Any]:  # fmt: skip
    if dr is not None:
        return {"name": name, "class": MgmtClass.SUBN_DR, "attr": attr, "dr_path": dr, "mod": mod}
    return {"name": name, "class": MgmtClass.SUBN_LID, "attr": attr, "lid": lid, "mod": mod}


@pytest.fixture
def lids(fabric: dict[str, str]) -> dict[str, int]:
    """The LIDs OpenSM gave: Host's own (DR hop 0) and the switch's (DR 0,1)."""
    got = _probe(fabric, [_smp("host", SmpAttr.PORT_INFO, dr=[]),
                          _smp("sw", SmpAttr.PORT_INFO, dr=[1])])  # fmt: skip
    host = smp.PORT_INFO.decode(_ok(got["host"]))
    sw = smp.PORT_INFO.decode(_ok(got["sw"]))
    return {"host": int(host["lid"]), "sm": int(host["master_sm_lid"]), "switch": int(sw["lid"])}


@pytest.mark.timeout(300)
def test_smp_dumps_match_smpquery(fabric: dict[str, str], lids: dict[str, int]) -> None:
    sw, sm = lids["switch"], lids["sm"]
    reqs = [
        _smp("ni_dr", SmpAttr.NODE_INFO, dr=[]),
        _smp("ni_sw", SmpAttr.NODE_INFO, lid=sw),
        _smp("ni_sw_dr", SmpAttr.NODE_INFO, dr=[1]),
        _smp("nd_dr", SmpAttr.NODE_DESC, dr=[]),
        _smp("nd_sm", SmpAttr.NODE_DESC, lid=sm),
        _smp("pi_dr", SmpAttr.PORT_INFO, dr=[]),
        _smp("pi_sm", SmpAttr.PORT_INFO, lid=sm, mod=1),
        _smp("pi_sw0", SmpAttr.PORT_INFO, lid=sw, mod=0),
        _smp("pi_sw2", SmpAttr.PORT_INFO, dr=[1], mod=2),
        _smp("si_sw", SmpAttr.SWITCH_INFO, lid=sw),
        _smp("pk_dr0", SmpAttr.PKEY_TABLE, dr=[], mod=0),
        _smp("pk_dr1", SmpAttr.PKEY_TABLE, dr=[], mod=1),
        *(_smp(f"gi_dr{i}", SmpAttr.GUID_INFO, dr=[], mod=i) for i in range(4)),
    ]
    got = _probe(fabric, reqs)
    here = dump.portid_str(dr_path=[])
    to_sw_dr = dump.portid_str(dr_path=[1])
    pairs = [
        (dump.smpquery_nodeinfo(_ok(got["ni_dr"]), here), ["nodeinfo", "-D", "0"]),
        (dump.smpquery_nodeinfo(_ok(got["ni_sw"]), dump.portid_str(sw)), ["nodeinfo", str(sw)]),
        (dump.smpquery_nodeinfo(_ok(got["ni_sw_dr"]), to_sw_dr), ["nodeinfo", "-D", "0,1"]),
        (dump.smpquery_nodedesc(_ok(got["nd_dr"])), ["nodedesc", "-D", "0"]),
        (dump.smpquery_nodedesc(_ok(got["nd_sm"])), ["nodedesc", str(sm)]),
        (dump.smpquery_portinfo(_ok(got["pi_dr"]), here, 0), ["portinfo", "-D", "0"]),
        (dump.smpquery_portinfo(_ok(got["pi_sm"]), dump.portid_str(sm), 1),
         ["portinfo", str(sm), "1"]),
        (dump.smpquery_portinfo(_ok(got["pi_sw0"]), dump.portid_str(sw), 0),
         ["portinfo", str(sw), "0"]),
        (dump.smpquery_portinfo(_ok(got["pi_sw2"]), to_sw_dr, 2), ["portinfo", "-D", "0,1", "2"]),
        (dump.smpquery_switchinfo(_ok(got["si_sw"]), dump.portid_str(sw)),
         ["switchinfo", str(sw)]),
    ]  # fmt: skip
    # P_KeyTable: smpquery reads PartitionCap from NodeInfo, then the blocks.
    cap = int(smp.NODE_INFO.decode(_ok(got["ni_dr"]))["partition_cap"])
    pkeys = dump.smpquery_pkeys([_ok(got["pk_dr0"]), _ok(got["pk_dr1"])], cap)
    pairs.append((pkeys, ["pkeys", "-D", "0"]))
    for ours, args in pairs:
        theirs = _tool(["smpquery", *args], fabric)
        assert ours.splitlines() == theirs.splitlines(), args
    # GUIDInfo: smpquery reads GUIDCap from PortInfo, then the blocks (8 GUIDs each).
    gcap = int(smp.PORT_INFO.decode(_ok(got["pi_dr"]))["guid_cap"])
    blocks = [_ok(got[f"gi_dr{i}"]) for i in range((gcap + 7) // 8)]
    guids = dump.smpquery_guids(blocks, gcap)
    assert guids.splitlines() == _tool(["smpquery", "guidinfo", "-D", "0"], fabric).splitlines()


_MOVING = re.compile(r"^(PortXmitData|PortRcvData|PortXmitPkts|PortRcvPkts):\.+\d+$", re.M)


def _counters_masked(text: str) -> tuple[str, dict[str, int]]:
    vals = {m.group(1): int(m.group(0).rsplit(".", 1)[1]) for m in _MOVING.finditer(text)}
    return _MOVING.sub(lambda m: f"{m.group(1)}:<n>", text), vals


@pytest.mark.timeout(300)
def test_perf_dumps_match_perfquery(fabric: dict[str, str], lids: dict[str, int]) -> None:
    host, sw = lids["host"], lids["switch"]

    def pma(name: str, attr: int, lid: int, port: int) -> dict[str, Any]:
        data = perf.PORT_COUNTERS.encode(port_select=port)
        return {"name": name, "class": MgmtClass.PERF, "attr": attr, "lid": lid,
                "data": data.hex()}  # fmt: skip

    cases = [(host, 1), (sw, 1), (sw, 2)]
    reqs = [{"name": f"cpi{lid}", "class": MgmtClass.PERF, "attr": PerfAttr.CLASS_PORT_INFO,
             "lid": lid} for lid in (host, sw)]  # fmt: skip
    for lid, port in cases:
        reqs.append(pma(f"pc{lid}_{port}", PerfAttr.PORT_COUNTERS, lid, port))
        reqs.append(pma(f"px{lid}_{port}", PerfAttr.PORT_COUNTERS_EXT, lid, port))
    before = {(lid, port, x): _tool(["perfquery", *x, str(lid), str(port)], fabric)
              for lid, port in cases for x in ((), ("-x",))}  # fmt: skip
    got = _probe(fabric, reqs)
    for lid, port in cases:
        cpi = perf.CLASS_PORT_INFO.decode(_ok(got[f"cpi{lid}"]))
        cap, cap2 = int(cpi["capability_mask"]), int(cpi["capability_mask2"])
        target = dump.portid_str(lid)
        ours = {
            (): dump.perfquery(_ok(got[f"pc{lid}_{port}"]), target, port, cap),
            ("-x",): dump.perfquery_ext(_ok(got[f"px{lid}_{port}"]), target, port, cap, cap2),
        }
        for x, text in ours.items():
            after = _tool(["perfquery", *x, str(lid), str(port)], fabric)
            o_text, o_vals = _counters_masked(text)
            b_text, b_vals = _counters_masked(before[(lid, port, x)])
            a_text, a_vals = _counters_masked(after)
            assert o_text.splitlines() == a_text.splitlines() == b_text.splitlines(), (lid, x)
            # our reading was taken between the two tool runs
            for k, v in o_vals.items():
                assert b_vals[k] <= v <= a_vals[k], (lid, port, x, k)


@pytest.mark.timeout(300)
def test_sa_record_dumps_match_saquery(fabric: dict[str, str], lids: dict[str, int]) -> None:
    host, sm = lids["host"], lids["sm"]

    def get_table(name: str, attr: int, table: Any, **values: int) -> dict[str, Any]:
        return {"name": name, "class": MgmtClass.SUBN_ADM, "method": 0x12, "attr": attr,
                "lid": sm, "comp_mask": sa.component_mask(table, values),
                "data": table.encode(values).hex()}  # fmt: skip

    reqs = [
        get_table("nr", SaAttr.NODE_RECORD, sa.NODE_RECORD, lid=host),
        get_table("nr_sm", SaAttr.NODE_RECORD, sa.NODE_RECORD, lid=sm),
        get_table("pir", SaAttr.PORT_INFO_RECORD, sa.PORT_INFO_RECORD, endport_lid=host),
        get_table("pr", SaAttr.PATH_RECORD, sa.PATH_RECORD, slid=host, dlid=sm),
    ]
    got = _probe(fabric, reqs)

    def one(name: str, table: Any) -> bytes:
        mad = got[name]
        assert header.header(mad).status == 0
        off = int(header.SA_HEADER.decode(mad, header.SA_HEADER_OFFSET)["attr_offset"])
        recs = sa.records(header.payload(mad)[: off * 8], off, table)
        assert len(recs) == 1
        return recs[0]

    pairs = [
        (dump.saquery_node_record(one("nr", sa.NODE_RECORD)), ["NR", str(host)]),
        (dump.saquery_node_record(one("nr_sm", sa.NODE_RECORD)), ["NR", str(sm)]),
        (dump.saquery_portinfo_record(one("pir", sa.PORT_INFO_RECORD)), ["PIR", str(host)]),
        (dump.saquery_path_record(one("pr", sa.PATH_RECORD)),
         ["-p", "--src-to-dst", f"{host}:{sm}"]),
    ]  # fmt: skip
    for ours, args in pairs:
        theirs = _tool(["saquery", *args], fabric)
        assert ours.splitlines() == theirs.splitlines(), args


@pytest.mark.timeout(300)
def test_service_and_mcmember_records_match_saquery(fabric: dict[str, str],
                                                    lids: dict[str, int]) -> None:  # fmt: skip
    """A ServiceRecord we register (SubnAdmSet) and OpenSM's multicast groups, as saquery shows."""
    sm = lids["sm"]
    values: dict[str, Any] = {
        "service_id": 0x1000000000000ABC,
        "service_p_key": 0xFFFF, "service_lease": 0xFFFFFFFF,
        "service_key": bytes(range(16)), "service_name": b"ibal-test".ljust(64, b"\0"),
        "service_data8_0": 7, "service_data16_1": 0x1234, "service_data32_3": 0xDEADBEEF,
        "service_data64_1": 0x1122334455667788,
    }  # fmt: skip
    # the whole record is given: every non-reserved component
    comps = list(sa.SERVICE_RECORD.names)
    values["service_gid"] = _host_gid(fabric, lids)
    reqs = [
        {"name": "set", "class": MgmtClass.SUBN_ADM, "method": 0x02, "attr": SaAttr.SERVICE_RECORD,
         "lid": sm, "comp_mask": sa.component_mask(sa.SERVICE_RECORD, comps),
         "data": sa.SERVICE_RECORD.encode(values).hex()},
        {"name": "mc", "class": MgmtClass.SUBN_ADM, "method": 0x12,
         "attr": SaAttr.MCMEMBER_RECORD, "lid": sm},
    ]  # fmt: skip
    got = _probe(fabric, reqs)
    assert header.header(got["set"]).status == 0
    stored = bytes(header.payload(got["set"])[: sa.SERVICE_RECORD.size])
    assert sa.SERVICE_RECORD.decode(stored)["service_name"] == values["service_name"]
    ours = dump.saquery_service_record(stored)
    assert ours.splitlines() == _tool(["saquery", "SR"], fabric).splitlines()
    mad = got["mc"]
    off = int(header.SA_HEADER.decode(mad, header.SA_HEADER_OFFSET)["attr_offset"])
    theirs = _tool(["saquery", "MCMR"], fabric)
    n = theirs.count("MCMember Record dump:")
    recs = sa.records(header.payload(mad)[: off * 8 * n], off, sa.MCMEMBER_RECORD)
    ours = "".join(dump.saquery_mcmember_record(r) for r in recs)
    assert n >= 1 and ours.splitlines() == theirs.splitlines()


def _host_gid(fabric: dict[str, str], lids: dict[str, int]) -> bytes:
    """Host's port GID (subnet prefix + port GUID), which OpenSM wants as ServiceGID."""
    got = _probe(fabric, [_smp("pi", SmpAttr.PORT_INFO, dr=[]),
                          _smp("ni", SmpAttr.NODE_INFO, dr=[])])  # fmt: skip
    prefix = int(smp.PORT_INFO.decode(_ok(got["pi"]))["gid_prefix"])
    guid = int(smp.NODE_INFO.decode(_ok(got["ni"]))["port_guid"])
    return prefix.to_bytes(8, "big") + guid.to_bytes(8, "big")


@pytest.mark.timeout(300)
def test_link_guidinfo_informinfo_cpi_and_sminfo_match_the_tools(
    fabric: dict[str, str], lids: dict[str, int]
) -> None:
    """LinkRecords and GUIDInfoRecords OpenSM keeps, an InformInfo subscription we make
    (SubnAdmSet, then its InformInfoRecord), the SA's ClassPortInfo and the SM's SMInfo:
    as ``saquery LR``, ``GIR``, ``IIR``, ``CPI`` and ``sminfo`` print them."""
    sm = lids["sm"]
    subscription = sa.INFORM_INFO.encode(
        lid_range_begin=0xFFFF, is_generic=1, subscribe=1, type=0xFFFF, trap_number=64,
        qpn=1, resp_time_value=18, producer_type=0xFFFFFF,
    )  # fmt: skip

    def sa_req(name: str, method: int, attr: int, data: bytes = b"") -> dict[str, Any]:
        return {"name": name, "class": MgmtClass.SUBN_ADM, "method": method, "attr": attr,
                "lid": sm, "data": data.hex()}  # fmt: skip

    got = _probe(fabric, [
        sa_req("sub", 0x02, SaAttr.INFORM_INFO, subscription),
        sa_req("lr", 0x12, SaAttr.LINK_RECORD),
        sa_req("gir", 0x12, SaAttr.GUID_INFO_RECORD),
        sa_req("iir", 0x12, SaAttr.INFORM_INFO_RECORD),
        _smp("smi", SmpAttr.SM_INFO, lid=sm),
        sa_req("cpi", 0x01, SaAttr.CLASS_PORT_INFO),
    ])  # fmt: skip
    sub = sa.INFORM_INFO.decode(_ok(got["sub"]))
    assert (sub["subscribe"], sub["trap_number"]) == (1, 64)

    def records(name: str, table: Any, head: str, theirs: str) -> list[bytes]:
        mad = got[name]
        assert header.header(mad).status == 0
        off = int(header.SA_HEADER.decode(mad, header.SA_HEADER_OFFSET)["attr_offset"])
        n = theirs.count(head)
        assert n >= 1, theirs
        return sa.records(header.payload(mad)[: off * 8 * n], off, table)

    cases = [
        ("lr", sa.LINK_RECORD, "LinkRecord dump:", "LR", dump.saquery_link_record),
        ("gir", sa.GUID_INFO_RECORD, "GUIDInfo Record dump:", "GIR",
         dump.saquery_guidinfo_record),
        ("iir", sa.INFORM_INFO_RECORD, "InformInfoRecord dump:", "IIR",
         dump.saquery_informinfo_record),
    ]  # fmt: skip
    for name, table, head, query, dumper in cases:
        theirs = _tool(["saquery", query], fabric)
        ours = "".join(dumper(r) for r in records(name, table, head, theirs))
        assert ours.splitlines() == theirs.splitlines(), query
    links = _tool(["saquery", "LR"], fabric)
    assert links.count("LinkRecord dump:") == 6  # small.net: three links, both directions

    cpi = dump.saquery_class_port_info(_ok(got["cpi"]))
    assert cpi.splitlines() == _tool(["saquery", "CPI"], fabric).splitlines()

    count = re.compile(r"activity count \d+")
    theirs = _tool(["sminfo"], fabric)
    ours = dump.sminfo(_ok(got["smi"]), sm)
    assert "SMINFO_MASTER" in ours
    assert count.sub("activity count N", ours) == count.sub("activity count N", theirs)
