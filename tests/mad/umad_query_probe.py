"""Run under umad2sim (ibsim): send the MADs described on stdin through umad, print the answers.

stdin: a JSON list of requests ``{"name", "class", "method", "attr", "mod",
"lid", "dr_path", "data", "comp_mask"}`` (data hex); each MAD is built with
:func:`ibal.wire.mad.header.build`.  stdout: one JSON object, name -> the
response MAD in hex (or ``null`` when none came).  ``test_diags_ibsim.py``
dumps them with :mod:`ibal.wire.mad.dump` and compares with infiniband-diags.
"""

from __future__ import annotations

import json
import queue
import sys
from typing import Any

from ibal.providers.rdma_core import umad
from ibal.types import QP1_WELL_KNOWN_QKEY, MadAddr, MadAgentSpec, MadRecv, MadSend, MadSendDone
from ibal.wire.mad import header
from ibal.wire.mad.consts import CLASS_VERSION, MgmtClass

WAIT = 20.0
CA = "ibsim0"


def main() -> int:
    reqs: list[dict[str, Any]] = json.load(sys.stdin)
    agents = umad.UmadAgents(CA)
    rx: queue.Queue[MadRecv] = queue.Queue()
    done: queue.Queue[MadSendDone] = queue.Queue()
    handles: dict[int, object] = {}
    out: dict[str, str | None] = {}
    try:
        for n, r in enumerate(reqs):
            cls = int(r["class"])
            if cls not in handles:
                qp = 0 if cls in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR) else 1
                handles[cls] = agents.register(
                    MadAgentSpec(1, qp, cls, CLASS_VERSION[cls], rx.put, done.put)
                )
            dr = r.get("dr_path")
            mad = header.build(
                cls, int(r.get("method", 1)), int(r["attr"]), tid=n + 1,
                attr_mod=int(r.get("mod", 0)), data=bytes.fromhex(r.get("data", "")),
                dr_path=dr, comp_mask=int(r.get("comp_mask", 0)),
            )  # fmt: skip
            if cls == MgmtClass.SUBN_DR:
                to = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)
            elif cls == MgmtClass.SUBN_LID:
                to = MadAddr(remote_qp=0, remote_qkey=0, dlid=int(r["lid"]))
            else:
                to = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=int(r["lid"]))
            agents.send(handles[cls], MadSend(bytes(mad), to, timeout_ms=1000, retries=3))
            try:
                got = rx.get(timeout=WAIT)
                out[r["name"]] = bytes(got.mad).hex()
            except queue.Empty:
                out[r["name"]] = None
            try:  # the completion of the send; its status does not matter here
                done.get(timeout=WAIT if out[r["name"]] is None else 2.0)
            except queue.Empty:
                print(r["name"], "no send completion", file=sys.stderr)
        for h in handles.values():
            agents.unregister(h)  # type: ignore[arg-type]
    finally:
        agents.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
