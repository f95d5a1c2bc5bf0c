"""Host side of the lab tests: the guest's pyverbs scripts (staged in the shared
directory and started), ibal's rxe on the host end of the tap, a guest file's digest."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibal.al import AlManager
from ibal.lab import GuestJob, LabSession
from ibal.providers.rxe.provider import RxeProvider

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


@contextlib.contextmanager
def host_rxe(s: LabSession) -> Iterator[AlManager]:
    """A manager with ibal's rxe (``rxe0``) on the tap's host address; the device's
    sockets live in the lab's namespace."""
    if os.geteuid() != 0:
        pytest.skip("the rxe provider's raw sockets need root")
    cfg = s.net_config
    assert cfg is not None
    with s.in_netns():
        mgr = AlManager()
        mgr.add_provider(RxeProvider({"devices": f"rxe0={cfg.host_ip}"}))
    try:
        yield mgr
    finally:
        mgr.close()


def guest_sha(s: LabSession, path: str, offset: int, length: int) -> str:
    """SHA-256 of ``length`` bytes at ``offset`` of the guest's file ``path``, read in the guest."""
    py = (f"import hashlib;f=open({path!r},'rb');f.seek({offset});"
          f"print(hashlib.sha256(f.read({length})).hexdigest())")  # fmt: skip
    r = s.run(["/usr/bin/python3", "-c", py], timeout=120)
    assert r.returncode == 0, r.stderr_text
    return r.stdout_text.strip()
