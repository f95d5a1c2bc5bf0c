"""Run under umad2sim as a fabric node: an ``ibal ibping`` server that ibsim can reach.

ibsim gives a QP1 request only to the process holding the SM flag at the port,
so the probe takes it (:func:`ibal.testing.ibsim_sm_flag.hold_sm_flag`), then
serves pings with :class:`ibal.tools.ping.PingServer` under the name given
on the command line; it prints ``ready`` once serving and stops at EOF on stdin,
printing how many pings it answered.
"""

from __future__ import annotations

import sys

import ibal
from ibal.testing.ibsim_sm_flag import hold_sm_flag
from ibal.tools.ping import PingServer


def main() -> int:
    with ibal.open_al() as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        flag = hold_sm_flag(ca)
        server = PingServer(ca, ca.query_port(1).port_guid, sys.argv[1])
        print("ready", flush=True)
        sys.stdin.read()
        server.close()
        flag.destroy()
        print(f"answered {server.answered}", flush=True)
        ca.close(wait=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
