"""Run inside the lab guest: the RMPP peer over the kernel's MAD layer (umad, rmpp_version 1).

``python3 rmpp_kernel_guest.py PORT GUEST_GID HOST_GID``: registers
tests/mad/rmpp_peer.py's services through ibal's rdma_core provider (so the
kernel segments and reassembles), then talks to the host over TCP, one JSON
line each way: ``{"ready": ...}``; on ``ask`` it asks the host's peer and
answers with the results; on ``bye`` it reports what it served and exits.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    port, guest_gid, host_gid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    subprocess.run(["modprobe", "ib_umad"], capture_output=True, check=False)
    from rmpp_peer import RmppPeer, qp1

    import ibal
    from ibal.types import Gid, QpType

    with ibal.open_al(providers=["rdma_core"]) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        attr = ca.query().ports[0]
        idx = next(i for i, g in enumerate(attr.gids) if g == Gid(guest_gid))
        alias = ca.alloc_pd().get_spl_qp(attr.port_guid, QpType.QP1_ALIAS)
        peer = RmppPeer(alias, seed=2)  # no timers: the kernel runs RMPP
        srv = socket.create_server(("0.0.0.0", port))
        conn, _ = srv.accept()
        f = conn.makefile("rw")

        def say(obj: object) -> None:
            f.write(json.dumps(obj) + "\n")
            f.flush()

        say({"ready": True, "gid_index": idx, "mad_agents": ca.capabilities.mad_agents,
             "segments_rmpp": alias.segments_rmpp,
             "kernel_rmpp": [s.transport_rmpp for s in peer.services]})  # fmt: skip
        for line in f:
            cmd = line.strip()
            if cmd == "ask":
                try:
                    say(peer.ask(qp1(Gid(host_gid), idx)))
                except Exception as exc:  # reported, not fatal: the host asserts on it
                    say({"error": repr(exc)})
            elif cmd == "bye":
                say({"served": peer.served})
                break
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
