"""What OpenSM puts in the RMPP header of a GetTable answer, decoded by ibal.transport.rmpp.

OpenSM sets only the Active flag and leaves version, type, segment number and
PayloadLength to the kernel MAD layer that segments for it; ibsim has no such
layer (docs/mad.md, RMPP), so the MAD arrives with Active set and the rest
zero.  Our receiver must treat that as malformed RMPP: ABORT with
UNSUPPORTED_VERSION (as the Linux MAD layer does), counted, no crash.

Runs on the shared ibsim/OpenSM harness (the ``ibsim_fabric`` fixture of
:mod:`ibal.testing.ibsim`: same skip/fail rules as every ibsim test).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric
from ibal.transport.rmpp import RmppReceiver, State, Transmit
from ibal.wire.mad.rmpp import RmppHeader, RmppStatus, RmppType

PROBE = Path(__file__).with_name("rmpp_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_opensm_first_segment_header(ibsim_fabric: Fabric) -> None:
    env = ibsim_fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=ibsim_fabric.workdir)  # fmt: skip
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
    (send,) = [a for a in acts if isinstance(a, Transmit)]
    h = RmppHeader.of(send.mad)
    assert (h.type, h.status) == (RmppType.ABORT, RmppStatus.UNSUPPORTED_VERSION)
    assert send.mad[8:16] == mad[8:16] and send.mad[3] == 0x12  # same TID, back to the SA
    assert rx.counters.malformed == 1 and rx.state is State.FAILED
