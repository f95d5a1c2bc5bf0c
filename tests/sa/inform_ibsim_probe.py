"""Run under umad2sim (ibsim) as a node: subscriptions to OpenSM's traps through ibal.sa.

Driven line by line on stdin by ``test_inform_ibsim.py``; every answer is one
JSON line on stdout:

- start: holds ibsim's SM flag for the port (``hold_sm_flag``: else ibsim
  hands the SA's Reports to no one here), subscribes to trap 64, prints
  ``{"event": "ready", "subs": {"64": status}, "gid": port GID}``;
- ``add N``: subscribes to trap N as well, prints the same with all subscriptions;
  ``dup N``: a second subscription to trap N (key ``"N+"``);
- meanwhile each report: ``{"event": "report", "trap", "issuer_lid", "gid", "lid"}``;
- ``unsubscribe``: unsubscribes all, waits for their destroy callbacks, prints
  ``{"event": "unsubscribed", "status": {...}, "late_reports": n}``;
- ``status``: ``{"event": "status", "renewals": {...}, "phase": {...}, "port": state}``;
- ``quit`` (or EOF): closes the AL and releases the flag, prints ``{"event": "bye", ...}``.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

WAIT = 30.0


def main() -> int:
    import ibal
    from ibal.sa.inform import ReportRec, Subscription, subscribe
    from ibal.testing.ibsim_sm_flag import hold_sm_flag

    out_lock = threading.Lock()

    def say(**kw: Any) -> None:
        with out_lock:
            print(json.dumps(kw), flush=True)

    al = ibal.open_al()
    ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == "ibsim0")
    port = ca.query().port(1)
    flag = hold_sm_flag(ca, 1)
    subs: dict[str, Subscription] = {}
    unsubscribed = threading.Event()
    late = [0]

    def report(rec: ReportRec) -> None:
        n = rec.notice
        if unsubscribed.is_set():
            late[0] += 1
        gid = n.details.get("gid")
        say(event="report", trap=n.trap_number, issuer_lid=n.issuer_lid, context=rec.context,
            gid=gid.hex() if isinstance(gid, bytes) else None, lid=n.details.get("lid"))

    def add(trap: int, key: str = "") -> None:
        subs[key or str(trap)] = subscribe(al, trap, port.port_guid, report_cb=report,
                                           report_context=trap)  # fmt: skip

    def ready() -> None:
        status = {k: s.wait(WAIT).status.name for k, s in subs.items()}
        say(event="ready", subs=status, gid=port.gids[0].packed.hex(), lid=port.lid,
            answered_sminfo=flag.answered)

    add(64)
    ready()
    for line in sys.stdin:
        cmd = line.strip()
        if cmd.startswith(("add ", "dup ")):
            trap = int(cmd.split()[1])
            add(trap, f"{trap}+" if cmd.startswith("dup") else "")
            ready()
        elif cmd == "unsubscribe":
            done = {t: threading.Event() for t in subs}
            for t, s in subs.items():
                s.unsubscribe(lambda ctx, e=done[t]: e.set())
            unsubscribed.set()
            ok = all(e.wait(WAIT) for e in done.values())
            status = {k: None if s.unsubscribe_status is None else s.unsubscribe_status.name
                      for k, s in subs.items()}  # fmt: skip
            say(event="unsubscribed", destroyed=ok, late_reports=late[0], status=status)
        elif cmd == "status":
            say(event="status", renewals={k: s.renewals for k, s in subs.items()},
                phase={k: s.phase.value for k, s in subs.items()},
                port=ca.query_port(1).link_state.name)  # fmt: skip
        elif cmd == "quit":
            break
    flag.release()  # before the AL: OpenSM must not poll an unanswered SMInfo
    al.close()
    say(event="bye", late_reports=late[0], answered_sminfo=flag.answered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
