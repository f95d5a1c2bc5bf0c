"""Run under umad2sim (ibsim) as a node: multicast memberships held against OpenSM.

Joins four memberships on the MAD-only CA's port (no QP: ``(ca, 1)``), through
the port's ``SaPort`` (opened by ``join_mcast``): it
creates group ``NEW_MGID`` as FullMember and joins it again as NonMember,
joins OpenSM's IPoIB broadcast group as SendOnlyNonMember, and creates a group
whose MGID the SA assigns.  Commands come on stdin, one per line; each answer
is one JSON line on stdout:

* (start) -> ``{"phase": "joined", "port_gid", "recs": {name: {mgid, mlid, join_state}}}``
* ``rejoin`` -> waits until every membership reported a successful rejoin
  (the SM moved: SM_CHANGE on the port) -> ``{"phase": "rejoined", "recs", "events"}``
* ``try MGID`` -> a join without create: ``{"phase": "tried", "status", "error_status"}``
* ``leave NAME`` -> ``{"phase": "left", "name", "status"}``
* ``quit``
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

WAIT = 60.0
BCAST_MGID = "ff12:401b:ffff::ffff:ffff"


def main() -> int:
    import ibal
    from ibal.sa.mcast import JoinState, join_mcast

    al = ibal.open_al(providers={"rdma_core": {"watch_interval": 0.2}})
    ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == "ibsim0")
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    lock = threading.Lock()
    seen: dict[str, list[Any]] = {}

    def cb(name: str) -> Callable[[Any], None]:
        def got(rec: Any) -> None:
            with lock:
                seen.setdefault(name, []).append(rec)
            events.put((name, rec))

        return got

    new = os.environ["NEW_MGID"]
    plan: list[tuple[str, Any, dict[str, Any]]] = [
        ("full", new, {"join_state": JoinState.FULL, "create": True, "q_key": 0x0B1B,
                       "p_key": 0xFFFF}),
        ("non", new, {"join_state": JoinState.NON}),
        ("sendonly", BCAST_MGID, {"join_state": JoinState.SENDONLY}),
        ("auto", None, {"join_state": JoinState.FULL, "create": True, "q_key": 0x0B1C,
                        "p_key": 0xFFFF}),
    ]  # fmt: skip
    members: dict[str, Any] = {}
    for name, mgid, kw in plan:
        m = join_mcast((ca, 1), mgid, callback=cb(name), **kw)
        r = m.wait(WAIT)
        if r.status.name != "SUCCESS":
            print(json.dumps({"phase": "error", "name": name, "status": r.status.name,
                              "error_status": r.error_status}), flush=True)  # fmt: skip
            return 1
        members[name] = m

    def recs() -> dict[str, dict[str, Any]]:
        return {n: {"mgid": str(m.member_rec.mgid), "mlid": m.member_rec.mlid,
                    "join_state": int(m.member_rec.join_state)}
                for n, m in members.items()}  # fmt: skip

    port_gid = str(ca.query_port(1).gids[0])
    print(json.dumps({"phase": "joined", "port_gid": port_gid, "recs": recs()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "rejoin":
            want = set(members)
            log: list[list[Any]] = []
            while want:
                name, rec = events.get(timeout=WAIT)
                log.append([name, rec.status.name, rec.rejoin])
                if rec.rejoin and rec.status.name == "SUCCESS":
                    want.discard(name)
            print(json.dumps({"phase": "rejoined", "recs": recs(), "events": log}), flush=True)
        elif cmd[0] == "try":  # a join without create, its outcome only
            m = join_mcast((ca, 1), cmd[1], timeout_ms=500, retry_cnt=1)
            r = m.wait(WAIT)
            out = {"phase": "tried", "status": r.status.name, "error_status": r.error_status,
                   "alive": m.alive}  # fmt: skip
            print(json.dumps(out), flush=True)
        elif cmd[0] == "leave":
            m = members.pop(cmd[1])
            m.leave(wait=True, timeout=WAIT)
            print(json.dumps({"phase": "left", "name": cmd[1],
                              "status": m.leave_status.name}), flush=True)  # fmt: skip
        elif cmd[0] == "quit":
            break
    al.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
