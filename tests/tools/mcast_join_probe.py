"""Run under umad2sim as a node: a FullMember of OpenSM's IPoIB broadcast group while
stdin stays open (``ibtracert -m``'s test needs a group whose MFTs have ports)."""

from __future__ import annotations

import json
import sys

BCAST_MGID = "ff12:401b:ffff::ffff:ffff"


def main() -> int:
    import ibal
    from ibal.sa.mcast import JoinState, join_mcast

    al = ibal.open_al(providers={"rdma_core": {}})
    ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == "ibsim0")
    m = join_mcast((ca, 1), BCAST_MGID, join_state=JoinState.FULL)
    r = m.wait(60.0)
    ok = r.status.name == "SUCCESS"
    print(json.dumps({"status": r.status.name, "mlid": m.member_rec.mlid if ok else 0}),
          flush=True)  # fmt: skip
    sys.stdin.read()
    if ok:
        m.leave(wait=True, timeout=60.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
