"""Port counters of a kernel RDMA device, from sysfs (``ports/N/hw_counters`` and ``counters``).

The kernel exposes each counter as one file holding a decimal number; reading
them is what ``rdma statistic`` does.  ``hw_counters`` are the driver's own
(kernel rxe: ``sent_pkts``, ``rcvd_pkts``, ``duplicate_request``, ...), the
``counters`` directory the IBA PortCounters (absent on RoCE-only drivers).
"""

from __future__ import annotations

import os

SYSFS_ROOT = "/sys/class/infiniband"
_DIRS = ("hw_counters", "counters")


def port_dir(device: str, port_num: int, root: str = SYSFS_ROOT) -> str:
    return os.path.join(root, device, "ports", str(port_num))


def availability(device: str, root: str = SYSFS_ROOT) -> str | None:
    """``None`` when port 1 of ``device`` has counters in sysfs, else why not."""
    base = port_dir(device, 1, root)
    if any(os.path.isdir(os.path.join(base, d)) for d in _DIRS):
        return None
    return f"no {base}/hw_counters or counters in sysfs"


def read(device: str, port_num: int, root: str = SYSFS_ROOT) -> dict[str, int]:
    """Every readable counter of the port; ``hw_counters`` names win over IBA ones.

    A file that vanished or does not hold a number (the kernel's ``lifespan``
    knob is one) is left out, never raised.
    """
    out: dict[str, int] = {}
    base = port_dir(device, port_num, root)
    for sub in reversed(_DIRS):
        path = os.path.join(base, sub)
        try:
            names = os.listdir(path)
        except OSError:
            continue
        for name in names:
            if sub == "hw_counters" and name == "lifespan":
                continue
            try:
                with open(os.path.join(path, name)) as f:
                    out[name] = int(f.read().strip())
            except (OSError, ValueError):
                continue
    return out
