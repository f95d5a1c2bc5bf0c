"""ibal's RoCE path against the Linux kernel's rdma_cm, for the same destination.

In the lab guest (kernel rxe0 on eth0, 10.99.0.2) ibal resolves the path to the
host end of the link (10.99.0.1, a tap in the lab's namespace) through the
rdma_core provider's port and the guest's IP stack; then librdmacm resolves the
same addresses (``rdma_resolve_addr`` + ``rdma_resolve_route``, the kernel's
``cma_resolve_iboe_route``).  Both start from an empty neighbour table.  The
MAC must be the tap's, as the kernel learnt it, and the PathRecord fields the
kernel's, except where docs/sa.md says why not (packet lifetime: 18 on Linux
6.1, 16 since; rate: the kernel's "port current" or ethtool speed; flow
label: rdma_cm hashes its port numbers into it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.types import Gid

pytestmark = [pytest.mark.lab, pytest.mark.rdma_core]

GUEST = Path(__file__).resolve().parent / "roce_kernel_guest.py"


def test_path_matches_rdma_cm(ibal_lab_net: LabSession) -> None:
    lab_requires("pyverbs")
    s = ibal_lab_net
    cfg = s.net_config
    assert cfg is not None
    tap = json.loads(s.host_run(["ip", "-j", "link", "show", cfg.tap]).stdout)[0]
    r = s.run([sys.executable, str(GUEST), cfg.guest_ip, cfg.host_ip], timeout=240)
    assert r.returncode == 0, r.stderr_text
    out = json.loads(r.stdout_text.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))  # shown with -s: both records side by side
    ours, kernel = out["ibal"], out["kernel"]
    assert "dmac" in ours, ours
    tap_mac = tap["address"].replace(":", "")
    assert ours["dmac"] == tap_mac  # ibal's probe made the guest kernel learn it
    assert ours["neigh_after"].replace(":", "") == tap_mac
    assert kernel["neigh_after"].replace(":", "") == tap_mac  # what rdma_cm made it learn
    assert ours["dgid"] == kernel["dgid"] == Gid("::ffff:" + cfg.host_ip).packed.hex()
    assert ours["sgid"] == kernel["sgid"] == Gid("::ffff:" + cfg.guest_ip).packed.hex()
    assert ours["netdev"] == "eth0"
    same = ("mtu", "hop_limit", "reversible", "sl", "mtu_selector", "rate_selector",
            "packet_life_time_selector")  # fmt: skip
    assert {k: ours[k] for k in same} == {k: kernel[k] for k in same}
    assert (ours["tclass"], kernel["traffic_class"]) == (0, 0)
    assert ours["p_key"] == kernel["pkey"] == 0xFFFF
    assert kernel["packet_life_time"] in (16, 18) and ours["packet_life_time"] == 16
    assert ours["mtu"] == min(ours["port_active_mtu"], 3)  # virtio-net 1500: 1024
