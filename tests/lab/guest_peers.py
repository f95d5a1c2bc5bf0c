"""Host side of the guest's pyverbs scripts: stage one in the shared directory and start it."""

from __future__ import annotations

import shutil
from pathlib import Path

from ibal.lab import GuestJob, LabSession

HERE = Path(__file__).resolve().parent
PEER_LIB = HERE / "pyverbs_peer.py"
"""What every guest script imports; it must sit beside the script."""


def start_peer(s: LabSession, script: str, *args: object, timeout: float = 300) -> GuestJob:
    """Run ``tests/lab/<script> ARGS`` in the guest with Debian's python3 (and pyverbs).

    Scripts go in the shared dir: the guest's /tmp is its own tmpfs.
    """
    for path in (HERE / script, PEER_LIB):
        shutil.copy(path, s.host_dir)
    argv = ["/usr/bin/python3", s.guest_path(s.host_dir / script), *map(str, args)]
    return s.guest_start(argv, timeout=timeout)
