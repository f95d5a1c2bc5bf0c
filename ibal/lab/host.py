"""Discovery of the host pieces the lab needs, and the `check()` report."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

#: Debian packages the lab uses, and what each provides.
APT_PACKAGES: dict[str, str] = {
    "qemu-system-x86": "qemu-system-x86_64, the emulator",
    "linux-image-amd64": "a kernel image with the rdma_rxe module",
    "busybox-static": "the static busybox of the initramfs",
    "kmod": "modprobe, to resolve module dependencies",
    "iproute2": "ip (network namespaces) and rdma (rxe links)",
    "ibverbs-utils": "ibv_devinfo and the ibv_*_pingpong tools",
    "ibverbs-providers": "librxe, the userspace side of rdma_rxe",
    "python3-pyverbs": "pyverbs for Debian's python3",
    "tshark": "packet capture on the lab link (tests only)",
    "perftest": "ib_*_bw / ib_*_lat benchmarks (optional)",
    "rdmacm-utils": "rping, cmtime, udaddy: the RDMA CM interop peers (optional)",
}

#: What a piece is needed for: booting with rxe, --net, pyverbs in the guest,
#: packet capture and benchmarks. Tests skip on the purposes they use.
PURPOSE_RUN = "run"
PURPOSE_NET = "net"
PURPOSE_PYVERBS = "pyverbs"
PURPOSE_CAPTURE = "capture"
PURPOSE_PERFTEST = "perftest"
PURPOSE_RDMACM = "rdmacm"
#: Purposes `ibal lab check` insists on (exit 1 when one is missing).
REQUIRED_PURPOSES = (PURPOSE_RUN, PURPOSE_NET, PURPOSE_PYVERBS)
ALL_PURPOSES = (*REQUIRED_PURPOSES, PURPOSE_CAPTURE, PURPOSE_PERFTEST, PURPOSE_RDMACM)

_RXE_NAMES = ("rdma_rxe.ko", "rdma_rxe.ko.xz", "rdma_rxe.ko.gz", "rdma_rxe.ko.zst")


class LabUnavailable(RuntimeError):
    """A piece the lab needs is missing on this host."""


@dataclass(frozen=True)
class Kernel:
    """A bootable kernel image with its matching modules directory."""

    version: str
    image: Path
    modules_dir: Path


@dataclass(frozen=True)
class CheckItem:
    """One piece of the lab and whether this host has it."""

    name: str
    ok: bool
    detail: str
    package: str | None
    purpose: str = PURPOSE_RUN


@dataclass(frozen=True)
class CheckReport:
    """What `check()` found; `missing_for()` and `apt_command()` derive from it."""

    items: tuple[CheckItem, ...] = field(default_factory=tuple)

    def missing_for(self, *purposes: str) -> list[CheckItem]:
        """Missing items needed for any of the given purposes."""
        return [i for i in self.items if not i.ok and i.purpose in purposes]

    def ok_for(self, *purposes: str) -> bool:
        """True when nothing needed for these purposes is missing."""
        return not self.missing_for(*purposes)

    @property
    def ok(self) -> bool:
        """True when every required piece (boot, --net, pyverbs) is present."""
        return self.ok_for(*REQUIRED_PURPOSES)

    def packages_missing(self, *purposes: str) -> list[str]:
        """Debian packages that would provide the missing items, in a stable order."""
        wanted = purposes or ALL_PURPOSES
        names = {i.package for i in self.missing_for(*wanted) if i.package}
        return [p for p in APT_PACKAGES if p in names]

    def apt_command(self, *purposes: str) -> str | None:
        """The one apt-get command that installs what is missing, or None."""
        pkgs = self.packages_missing(*purposes)
        if not pkgs:
            return None
        return "apt-get install -y " + " ".join(pkgs)

    def skip_reason(self, *purposes: str) -> str | None:
        """A one-line reason naming the missing pieces and packages, or None."""
        missing = self.missing_for(*purposes)
        if not missing:
            return None
        parts = [
            f"{i.name} ({i.package})" if i.package else f"{i.name}: {i.detail}" for i in missing
        ]
        reason = "ibal lab unavailable, missing: " + "; ".join(parts)
        cmd = self.apt_command(*purposes)
        return f"{reason} -- install with: {cmd}" if cmd else reason


def _version_key(version: str) -> list[tuple[int, str]]:
    """Sort key that orders kernel versions numerically where they are numbers."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-+]", version)]


def find_rxe_module(modules_dir: Path) -> Path | None:
    """Path of rdma_rxe in a modules directory (any compression), or None."""
    base = modules_dir / "kernel" / "drivers" / "infiniband" / "sw" / "rxe"
    for name in _RXE_NAMES:
        if (base / name).is_file():
            return base / name
    return None


def find_kernels(
    boot: Path = Path("/boot"), modules_root: Path = Path("/lib/modules")
) -> list[Kernel]:
    """Kernels with an image in /boot and a modules dir holding rdma_rxe, newest first."""
    found: list[Kernel] = []
    for image in boot.glob("vmlinuz-*"):
        version = image.name[len("vmlinuz-") :]
        mods = modules_root / version
        if image.is_file() and (mods / "modules.dep").is_file() and find_rxe_module(mods):
            found.append(Kernel(version, image, mods))
    found.sort(key=lambda k: _version_key(k.version), reverse=True)
    return found


def select_kernel(spec: str | None = None) -> Kernel:
    """The kernel to boot: `spec` (a version or an image path), $IBAL_LAB_KERNEL, or the newest.

    The running kernel is not preferred: container and CI hosts often run one
    that has no image in /boot or no rdma_rxe (this machine does).
    """
    spec = spec or os.environ.get("IBAL_LAB_KERNEL") or None
    kernels = find_kernels()
    if spec is None:
        if not kernels:
            raise LabUnavailable(
                "no /boot/vmlinuz-KVER with /lib/modules/KVER containing rdma_rxe "
                "(apt-get install linux-image-amd64)"
            )
        return kernels[0]
    if "/" in spec:
        image = Path(spec)
        version = image.name.removeprefix("vmlinuz-")
    else:
        version, image = spec, Path("/boot") / f"vmlinuz-{spec}"
    mods = Path("/lib/modules") / version
    if not image.is_file():
        raise LabUnavailable(f"kernel image {image} not found")
    if not find_rxe_module(mods):
        raise LabUnavailable(f"{mods} has no rdma_rxe module")
    return Kernel(version, image, mods)


def is_static_elf(path: Path) -> bool:
    """True when `path` is an ELF executable without a dynamic loader (PT_INTERP).

    The initramfs has no libc, so a dynamically linked busybox would not start.
    """
    try:
        with path.open("rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2:
                return False
            endian = "<" if ident[5] == 1 else ">"
            phoff = struct.unpack_from(endian + "Q", ident, 32)[0]
            phentsize, phnum = struct.unpack_from(endian + "HH", ident, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        (ptype,) = struct.unpack_from(endian + "I", table, i * phentsize)
        if ptype == 3:  # PT_INTERP
            return False
    return True


def find_busybox() -> Path | None:
    """A statically linked busybox (Debian's busybox-static installs /bin/busybox)."""
    for cand in (os.environ.get("IBAL_LAB_BUSYBOX"), "/bin/busybox", "/usr/bin/busybox"):
        if cand and is_static_elf(Path(cand)):
            return Path(cand)
    return None


def find_qemu() -> str | None:
    """Path of qemu-system-x86_64 ($IBAL_LAB_QEMU overrides), or None."""
    return shutil.which(os.environ.get("IBAL_LAB_QEMU", "qemu-system-x86_64"))


def _pyverbs_importable() -> tuple[bool, str]:
    """Whether Debian's python3 imports pyverbs (the guest runs the same files)."""
    py = "/usr/bin/python3"
    if not os.access(py, os.X_OK):
        return False, "/usr/bin/python3 not found"
    code = "import sys; sys.path.append('/usr/lib/python3/dist-packages'); import pyverbs.device"
    try:
        proc = subprocess.run([py, "-c", code], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if proc.returncode == 0:
        return True, "imports in /usr/bin/python3"
    lines = proc.stderr.decode(errors="replace").strip().splitlines()
    return False, lines[-1] if lines else "import failed"


def _netns_usable() -> tuple[bool, str]:
    """Whether `ip netns` can list namespaces (needs iproute2; adding one needs root)."""
    ip = shutil.which("ip")
    if not ip:
        return False, "ip not found"
    try:
        proc = subprocess.run([ip, "netns", "list"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if proc.returncode != 0:
        return False, proc.stderr.decode(errors="replace").strip() or "ip netns list failed"
    return True, "works"


def _tool(name: str, package: str, purpose: str = PURPOSE_RUN) -> CheckItem:
    """A CheckItem for an executable on PATH (sbin dirs included: root tools live there)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    return CheckItem(name, path is not None, path or "not found", package, purpose)


def check() -> CheckReport:
    """Probe every piece the lab needs; never raises for a missing one."""
    items: list[CheckItem] = []
    qemu = find_qemu()
    items.append(
        CheckItem("qemu-system-x86_64", qemu is not None, qemu or "not found", "qemu-system-x86")
    )
    try:
        kernel = select_kernel()
    except LabUnavailable as exc:
        kernel_ok, kdetail = False, str(exc)
    else:
        kernel_ok = os.access(kernel.image, os.R_OK)
        kdetail = kernel.version if kernel_ok else f"cannot read {kernel.image} (run as root)"
    items.append(CheckItem("kernel + rdma_rxe", kernel_ok, kdetail, "linux-image-amd64"))
    bb = find_busybox()
    items.append(
        CheckItem(
            "busybox (static)", bb is not None, str(bb) if bb else "not found", "busybox-static"
        )
    )
    items.append(_tool("modprobe", "kmod"))
    items.append(_tool("rdma", "iproute2"))
    items.append(_tool("ibv_devinfo", "ibverbs-utils"))
    librxe = sorted(Path("/usr/lib").glob("*/libibverbs/librxe-rdmav*.so"))
    items.append(
        CheckItem(
            "librxe", bool(librxe), librxe[0].name if librxe else "not found", "ibverbs-providers"
        )
    )
    ok, detail = _pyverbs_importable()
    items.append(CheckItem("pyverbs", ok, detail, "python3-pyverbs", PURPOSE_PYVERBS))
    items.append(_tool("ip", "iproute2", PURPOSE_NET))
    ok, detail = _netns_usable()
    items.append(CheckItem("ip netns", ok, detail, "iproute2", PURPOSE_NET))
    tun = os.path.exists("/dev/net/tun")
    items.append(
        CheckItem(
            "/dev/net/tun",
            tun,
            "present"
            if tun
            else "missing: modprobe tun, or pass --device /dev/net/tun to the container",
            None,
            PURPOSE_NET,
        )
    )
    root = os.geteuid() == 0
    items.append(
        CheckItem(
            "root",
            root,
            "yes" if root else "network namespaces and taps need root",
            None,
            PURPOSE_NET,
        )
    )
    items.append(_tool("tshark", "tshark", PURPOSE_CAPTURE))
    items.append(_tool("ib_write_bw", "perftest", PURPOSE_PERFTEST))
    items.append(_tool("rping", "rdmacm-utils", PURPOSE_RDMACM))
    return CheckReport(tuple(items))
