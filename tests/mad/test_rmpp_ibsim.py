"""What OpenSM puts in the RMPP header of a GetTable answer, decoded by ibal.mad.rmpp.

OpenSM sets only the Active flag and leaves version, type, segment number and
PayloadLength to the kernel MAD layer that segments for it; ibsim has no such
layer (docs/mad.md, RMPP), so the MAD arrives with Active set and the rest
zero.  Our receiver must treat that as malformed RMPP: ABORT with
UNSUPPORTED_VERSION (as the Linux MAD layer does), counted, no crash.

Reuses the ibsim/OpenSM fixture of the umad backend's test (same topology,
same readiness probe, same skip/fail rules).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.mad.rmpp import RmppHeader, RmppReceiver, RmppStatus, RmppType, Send, State

_UMAD_TEST = Path(__file__).resolve().parents[1] / "providers/rdma_core/test_umad_ibsim.py"
_spec = importlib.util.spec_from_file_location("_umad_ibsim_fixture", _UMAD_TEST)
assert _spec is not None and _spec.loader is not None
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
fabric = _mod.fabric
PROBE = Path(__file__).with_name("rmpp_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_opensm_first_segment_header(fabric: dict[str, str]) -> None:
    env = {**fabric, "PYTHONPATH": f"{REPO}:{fabric.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=env["IBAL_TEST_CWD"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["method"] == 0x92 and got["active"] and got["attr_offset"] == 14  # NodeRecord
    assert (got["type"], got["version"], got["segment"], got["first"], got["last"]) == (
        "NONE", 0, 0, False, False)  # fmt: skip
    assert (got["status"], got["payload_length"]) == (0, 0)
    mad = bytes.fromhex(got["mad"])
    rx = RmppReceiver(class_header_size=20)
    rx.start(0.0)
    acts = rx.handle(mad, 0.0)
    (send,) = [a for a in acts if isinstance(a, Send)]
    h = RmppHeader.of(send.mad)
    assert (h.type, h.status) == (RmppType.ABORT, RmppStatus.UNSUPPORTED_VERSION)
    assert send.mad[8:16] == mad[8:16] and send.mad[3] == 0x12  # same TID, back to the SA
    assert rx.counters.malformed == 1 and rx.state is State.FAILED
