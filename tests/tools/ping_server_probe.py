"""Run under umad2sim as a fabric node: an ``ibal ibping`` server that ibsim can reach.

ibsim gives a QP1 request only to the process holding the SM flag at the port,
so the probe takes it (:func:`ibal.testing.ibsim_sm_flag.hold_sm_flag`), then
serves pings (:func:`ibal.tools.ping.ping_server`, under the name given on the
command line) and ibsysstat (:func:`ibal.tools.ping.sysstat_server`); it
prints ``ready`` once serving and stops at EOF on stdin, printing how many
requests each server answered.
"""

from __future__ import annotations

import sys

import ibal
from ibal.testing.ibsim_sm_flag import hold_sm_flag
from ibal.tools.ping import ping_server, sysstat_server


def main() -> int:
    with ibal.open_al() as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        flag = hold_sm_flag(ca)
        guid = ca.query_port(1).port_guid
        pings = ping_server(ca, guid, sys.argv[1])
        stats = sysstat_server(ca, guid)
        print("ready", flush=True)
        sys.stdin.read()
        pings.close()
        stats.close()
        flag.destroy()
        print(f"answered {pings.answered} {stats.answered}", flush=True)
        ca.close(wait=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
