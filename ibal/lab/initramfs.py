"""Build (and cache) the lab's busybox initramfs.

The initramfs only gets the guest as far as the host's root filesystem: it
loads the virtio, 9p and overlay modules, mounts the host root read-only over
9p under a tmpfs overlay, mounts the lab's shared directory, and switch_roots
into the guest agent that lives in that shared directory. Everything after that
comes from the host's own userspace, so the image is small and stable: it is
cached per kernel version and rebuilt only when its inputs change.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ibal.lab.host import Kernel, LabUnavailable

#: Bumped when the image layout changes in a way the hash below cannot see.
FORMAT_VERSION = "1"

#: Modules loaded on every boot, then for --net only. virtio_console carries
#: the control channel between host and guest agent.
BASE_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_console")
NET_MODULES = ("virtio_net",)

#: 9p mount tags and the guest path of the shared (writable) lab directory.
ROOT_TAG = "hostroot"
SHARE_TAG = "ibal_share"
GUEST_SHARE = "/run/ibal-lab"
MSIZE = 512000

#: Busybox applets stage 1 calls by name.
_APPLETS = (
    "sh",
    "mount",
    "umount",
    "insmod",
    "mkdir",
    "switch_root",
    "cat",
    "echo",
    "reboot",
    "sleep",
)

# Stage 1: runs as PID 1 from the initramfs. Kernel arguments select the
# variant (ibal_lab.net=1 loads the NIC driver) so that one cached image
# serves every kind of run. A failure prints a marker line the host looks
# for on the console, then powers off instead of hanging until a timeout.
INIT_SCRIPT = f"""#!/bin/sh
# ibal lab initramfs, stage 1: reach the host root, then hand over to the agent.
export PATH=/bin
fail() {{
    echo "IBAL-LAB-STAGE1-FAILED: $*"
    reboot -f
    sleep 5
}}
mkdir -p /proc /sys /dev /lower /rw /newroot
mount -t proc proc /proc || fail "mount /proc"
mount -t devtmpfs devtmpfs /dev 2>/dev/null
load() {{
    while read -r path args; do
        [ -n "$path" ] || continue
        insmod "$path" $args || fail "insmod $path"
    done < "$1"
}}
load /modules/base.list
case " $(cat /proc/cmdline) " in
    *" ibal_lab.net=1 "*) load /modules/net.list ;;
esac
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize={MSIZE},cache=loose {ROOT_TAG} /lower \\
    || fail "mount 9p {ROOT_TAG}"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \\
    || fail "mount overlay"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run || fail "mount /run"
mkdir -p /newroot{GUEST_SHARE}
mount -t 9p -o trans=virtio,version=9p2000.L,msize={MSIZE},cache=none \\
    {SHARE_TAG} /newroot{GUEST_SHARE} || fail "mount 9p {SHARE_TAG}"
[ -x /newroot{GUEST_SHARE}/agent.sh ] || fail "no agent.sh in the shared directory"
umount /dev 2>/dev/null
umount /proc
exec switch_root /newroot /bin/sh {GUEST_SHARE}/agent.sh
fail "switch_root"
"""


@dataclass(frozen=True)
class ModuleFile:
    """A kernel module to insmod, with the options modprobe.d gives it."""

    path: Path
    args: str


def resolve_modules(
    kernel: Kernel, names: Iterable[str], skip: Sequence[Path] = ()
) -> list[ModuleFile]:
    """The insmod list for `names`, dependencies first, as `modprobe --show-depends` orders it."""
    seen = set(skip)
    out: list[ModuleFile] = []
    for name in names:
        try:
            proc = subprocess.run(
                ["modprobe", "-S", kernel.version, "--show-depends", name],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except FileNotFoundError as exc:
            raise LabUnavailable("modprobe not found (apt-get install kmod)") from exc
        if proc.returncode != 0:
            raise LabUnavailable(f"modprobe --show-depends {name} failed: {proc.stderr.strip()}")
        for line in proc.stdout.splitlines():
            words = line.split(None, 2)
            # "builtin NAME" lines need nothing; only "insmod PATH [ARGS]" do.
            if len(words) < 2 or words[0] != "insmod":
                continue
            path = Path(words[1])
            if path not in seen:
                seen.add(path)
                out.append(ModuleFile(path, words[2].strip() if len(words) > 2 else ""))
    return out


def _module_bytes(path: Path) -> bytes:
    """A module's ELF bytes; busybox insmod cannot decompress, so we do it here."""
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        zstd = shutil.which("zstd")
        if not zstd:
            raise LabUnavailable(
                f"{path} is zstd-compressed and zstd is not installed (apt-get install zstd)"
            )
        return subprocess.run([zstd, "-dc", str(path)], capture_output=True, check=True).stdout
    return data


class CpioWriter:
    """Minimal writer of the 'newc' cpio format the kernel unpacks as initramfs."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._ino = 1

    def _entry(
        self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        encoded = name.encode() + b"\0"
        fields = (
            self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0,
        )  # fmt: skip
        self._ino += 1
        header = b"070701" + b"".join(b"%08X" % v for v in fields)
        self._buf.write(header + encoded)
        self._pad()
        self._buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self._buf.write(b"\0" * (-self._buf.tell() % 4))

    def directory(self, name: str) -> None:
        """Add a directory (parents must be added first)."""
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """Add a regular file."""
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name: str, target: str) -> None:
        """Add a symbolic link."""
        self._entry(name, 0o120777, target.encode())

    def chardev(self, name: str, major: int, minor: int) -> None:
        """Add a character device node."""
        self._entry(name, 0o020600, rdev=(major, minor))

    def finish(self) -> bytes:
        """Append the trailer and return the archive."""
        self._entry("TRAILER!!!", 0)
        return self._buf.getvalue()


def _inputs_digest(kernel: Kernel, busybox: Path, modules: Sequence[ModuleFile]) -> str:
    """Hash of everything that goes into the image, so a change in any forces a rebuild."""
    h = hashlib.sha256()
    h.update(f"format={FORMAT_VERSION}\n{INIT_SCRIPT}\nkernel={kernel.version}\n".encode())
    for path in (busybox, *(m.path for m in modules)):
        st = path.stat()
        h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for m in modules:
        h.update(f"args {m.path} {m.args}\n".encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    """$IBAL_LAB_CACHE, else $XDG_CACHE_HOME/ibal/lab, else ~/.cache/ibal/lab."""
    env = os.environ.get("IBAL_LAB_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ibal" / "lab"


def _atomic_write(cache_dir: Path, target: Path, data: bytes) -> None:
    """Write-then-rename: concurrent builders never see (or leave) a half file."""
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_initramfs(kernel: Kernel, busybox: Path, cache_dir: Path | None = None) -> Path:
    """Path of an up-to-date initramfs for `kernel`, building it if needed."""
    cache_dir = cache_dir or default_cache_dir()
    base = resolve_modules(kernel, BASE_MODULES)
    net = resolve_modules(kernel, NET_MODULES, skip=[m.path for m in base])
    digest = _inputs_digest(kernel, busybox, [*base, *net])
    target = cache_dir / f"initramfs-{kernel.version}-{digest}.cpio"
    if target.is_file():
        return target

    cpio = CpioWriter()
    for d in ("bin", "dev", "modules", "proc", "sys", "lower", "rw", "newroot"):
        cpio.directory(d)
    # The kernel opens /dev/console for PID 1 before anything is mounted.
    cpio.chardev("dev/console", 5, 1)
    cpio.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in _APPLETS:
        cpio.symlink(f"bin/{applet}", "busybox")
    cpio.file("init", INIT_SCRIPT.encode(), 0o755)
    for listname, mods in (("base", base), ("net", net)):
        lines = []
        for idx, mod in enumerate(mods):
            stem = mod.path.name.split(".ko")[0]
            name = f"modules/{listname}-{idx:02d}-{stem}.ko"
            cpio.file(name, _module_bytes(mod.path))
            lines.append(f"/{name} {mod.args}".rstrip())
        cpio.file(f"modules/{listname}.list", ("\n".join(lines) + "\n").encode())
    data = cpio.finish()

    cache_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(cache_dir, target, data)
    # Older images for the same kernel are stale now.
    for old in cache_dir.glob(f"initramfs-{kernel.version}-*.cpio"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


# -- direct (PVH) boot of the uncompressed kernel -----------------------------------------

_XEN_ELFNOTE_PHYS32_ENTRY = 18
_COMPRESSED_MAGICS = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x1f\x8b\x08", "gzip"),
)


def has_pvh_entry(elf: bytes) -> bool:
    """True when an ELF kernel has the PVH entry note qemu needs to boot it directly."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    phoff = struct.unpack_from("<Q", elf, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", elf, 54)
    for i in range(phnum):
        ptype, _flags, offset, _va, _pa, filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize
        )
        if ptype != 4:  # PT_NOTE
            continue
        pos, end = offset, offset + filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def _decompress_vmlinux(image: bytes) -> bytes | None:
    """The ELF inside a bzImage, found by its compression magic, or None."""
    for magic, kind in _COMPRESSED_MAGICS:
        start = image.find(magic)
        while start >= 0:
            try:
                if kind == "xz":
                    out = lzma.LZMADecompressor().decompress(image[start:])
                elif kind == "gzip":
                    out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(image[start:])
                else:
                    zstd = shutil.which("zstd")
                    if not zstd:
                        break
                    out = subprocess.run(
                        [zstd, "-dc"], input=image[start:], capture_output=True, check=False
                    ).stdout
            except (lzma.LZMAError, zlib.error):
                out = b""
            if out[:4] == b"\x7fELF":
                return out
            start = image.find(magic, start + 1)
    return None


def direct_boot_kernel(kernel: Kernel, cache_dir: Path | None = None) -> Path | None:
    """A cached uncompressed vmlinux that qemu can boot via PVH, or None.

    Under TCG the bzImage's own decompressor and real-mode setup cost ~3 s
    per boot; decompressing once here and booting the ELF skips both.
    """
    if os.environ.get("IBAL_LAB_NO_PVH"):
        return None
    cache_dir = cache_dir or default_cache_dir()
    st = kernel.image.stat()
    key = hashlib.sha256(f"{kernel.image}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir / f"vmlinux-{kernel.version}-{key}.elf"
    marker = cache_dir / f"vmlinux-{kernel.version}-{key}.unusable"
    if target.is_file():
        return target
    if marker.is_file():
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    elf = _decompress_vmlinux(kernel.image.read_bytes())
    if elf is None or not has_pvh_entry(elf):
        marker.touch()
        return None
    _atomic_write(cache_dir, target, elf)
    for old in cache_dir.glob(f"vmlinux-{kernel.version}-*"):
        if old not in (target, marker):
            old.unlink(missing_ok=True)
    return target
