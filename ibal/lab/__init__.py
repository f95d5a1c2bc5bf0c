"""ibal lab: a real kernel RDMA stack (rdma_rxe) in a throwaway qemu guest.

`Lab().run(["ibv_devinfo", "-d", "rxe0"])` boots a guest under software
emulation with the host's root filesystem shared read-only, sets up rxe0, runs
the command and returns its exit status and output. `Lab().session(net=True)`
keeps one guest up for several commands and links it to a network namespace
on the host. `Lab().cluster(2)` boots two guests on one virtual link, kernel
rxe on each end. See docs/lab.md.
"""

from ibal.lab.cluster import LabCluster
from ibal.lab.host import CheckItem, CheckReport, Kernel, LabUnavailable, check
from ibal.lab.link import LinkConfig
from ibal.lab.netns import NetConfig, NetNamespace, cleanup_stale
from ibal.lab.vm import (
    DEFAULT_BOOT_TIMEOUT,
    DEFAULT_TIMEOUT,
    TIMEOUT_RETURNCODE,
    GuestJob,
    Lab,
    LabBootError,
    LabCommandError,
    LabError,
    LabResult,
    LabSession,
    LabVMError,
    cleanup_stale_tempdirs,
)

__all__ = [
    "DEFAULT_BOOT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "TIMEOUT_RETURNCODE",
    "CheckItem",
    "CheckReport",
    "GuestJob",
    "Kernel",
    "Lab",
    "LabBootError",
    "LabCluster",
    "LabCommandError",
    "LabError",
    "LabResult",
    "LabSession",
    "LabUnavailable",
    "LabVMError",
    "LinkConfig",
    "NetConfig",
    "NetNamespace",
    "check",
    "cleanup_stale",
    "cleanup_stale_tempdirs",
]
