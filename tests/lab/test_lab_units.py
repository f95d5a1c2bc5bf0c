"""Parts of the lab that need no VM: scripts, cpio, ELF probes, check report, skip logic."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.lab import guest, initramfs
from ibal.lab.host import (
    PURPOSE_CAPTURE,
    PURPOSE_NET,
    PURPOSE_RUN,
    CheckItem,
    CheckReport,
    is_static_elf,
)
from ibal.lab.netns import NetConfig
from ibal.lab.pytest_plugin import lab_requires


def parse_newc(data: bytes) -> dict[str, tuple[int, bytes]]:
    """Entries of a newc cpio archive: name -> (mode, data)."""
    entries: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701", pos
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        pos += 110 + namesize
        pos += -pos % 4
        body = data[pos : pos + size]
        pos += size
        pos += -pos % 4
        if name == "TRAILER!!!":
            assert pos == len(data)
            return entries
        entries[name] = (mode, body)


def test_cpio_writer_round_trip() -> None:
    w = initramfs.CpioWriter()
    w.directory("bin")
    w.file("bin/x", b"abc", 0o755)
    w.file("odd", b"12345")
    w.symlink("bin/sh", "busybox")
    w.chardev("console", 5, 1)
    entries = parse_newc(w.finish())
    assert entries["bin"][0] == 0o040755
    assert entries["bin/x"] == (0o100755, b"abc")
    assert entries["odd"] == (0o100644, b"12345")
    assert entries["bin/sh"] == (0o120777, b"busybox")
    assert entries["console"][0] == 0o020600


def _run_job(tmp_path: Path, script: str) -> subprocess.CompletedProcess[bytes]:
    path = tmp_path / "cmd.sh"
    path.write_text(script)
    return subprocess.run(["sh", str(path)], capture_output=True, check=False)


def test_job_script_quotes_argv_env_and_cwd(tmp_path: Path) -> None:
    args = ["a b", "it's", '"q"', "$HOME", "`id`", "*", "", "new\nline", "-n"]
    script = guest.job_script(["printf", "[%s]", *args], env={}, cwd=str(tmp_path), stdin_path=None)
    out = _run_job(tmp_path, script)
    assert out.stdout.decode() == "".join(f"[{a}]" for a in args)

    env = {"PATH": "/usr/bin:/bin", "X": "va lue $'\"\n", "E": ""}
    out = _run_job(tmp_path, guest.job_script(["env"], env=env, cwd="/", stdin_path=None))
    assert (
        out.stdout == b"PATH=/usr/bin:/bin\nX=va lue $'\"\n\nE=\n"
    )  # exactly env, nothing inherited

    out = _run_job(
        tmp_path, guest.job_script("pwd; exit 9", env={}, cwd=str(tmp_path), stdin_path=None)
    )
    assert (out.returncode, out.stdout.decode()) == (9, f"{tmp_path}\n")

    out = _run_job(
        tmp_path, guest.job_script(["true"], env={}, cwd="/no/such/dir", stdin_path=None)
    )
    assert out.returncode == 125

    (tmp_path / "in").write_bytes(b"fed\n")
    script = guest.job_script(["cat"], env={}, cwd="/", stdin_path=str(tmp_path / "in"))
    assert _run_job(tmp_path, script).stdout == b"fed\n"


def test_job_script_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        guest.job_script([], env={}, cwd="/", stdin_path=None)
    with pytest.raises(ValueError):
        guest.job_script(["true"], env={"A=B": "x"}, cwd="/", stdin_path=None)


@pytest.mark.parametrize(
    "net", [None, NetConfig(host_address="10.98.7.1/24", guest_address="10.98.7.9/24")]
)
def test_agent_and_init_scripts_are_valid_shell(net: NetConfig | None, tmp_path: Path) -> None:
    agent = guest.agent_script(net)
    (tmp_path / "agent.sh").write_text(agent)
    (tmp_path / "init").write_text(initramfs.INIT_SCRIPT)
    for name in ("agent.sh", "init"):
        check = subprocess.run(["sh", "-n", str(tmp_path / name)], capture_output=True, check=False)
        assert check.returncode == 0, check.stderr
    dev = "lo" if net is None else "eth0"
    if net is None:
        assert "eth0" not in agent
    else:
        assert "ip addr add 10.98.7.9/24 dev eth0" in agent
    assert f"rdma link add rxe0 type rxe netdev {dev}" in agent
    # what RoCE multicast needs on the rxe netdev (checked in the guest by test_lab_run)
    assert f"ip link set {dev} multicast on" in agent
    assert f"ip route replace 224.0.0.0/4 dev {dev}" in agent
    assert f"ip -6 route replace multicast ff00::/8 dev {dev} table local" in agent
    assert f"/newroot{initramfs.GUEST_SHARE}" in initramfs.INIT_SCRIPT


def test_net_config_validation() -> None:
    cfg = NetConfig()
    assert (cfg.host_ip, cfg.guest_ip) == ("10.99.0.1", "10.99.0.2")
    with pytest.raises(ValueError):
        NetConfig(host_address="10.99.0.1/24", guest_address="10.98.0.2/24")
    with pytest.raises(ValueError):
        NetConfig(host_address="10.99.0.1/24", guest_address="10.99.0.1/24")
    with pytest.raises(ValueError):
        NetConfig(host_address="fd00::1/64", guest_address="fd00::2/64")


def _elf(*segments: tuple[int, bytes]) -> bytes:
    """A minimal little-endian ELF64 with the given (p_type, payload) segments."""
    phoff, phentsize = 64, 56
    data_off = phoff + phentsize * len(segments)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 32, phoff)
    struct.pack_into("<HH", header, 54, phentsize, len(segments))
    table, blob = b"", b""
    for ptype, payload in segments:
        table += struct.pack(
            "<IIQQQQQQ", ptype, 0, data_off + len(blob), 0, 0, len(payload), len(payload), 0
        )
        blob += payload
    return bytes(header) + table + blob


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _note(name: bytes, ntype: int, desc: bytes) -> bytes:
    return struct.pack("<III", len(name), len(desc), ntype) + _pad4(name) + _pad4(desc)


def test_elf_probes(tmp_path: Path) -> None:
    pvh = _elf((4, _note(b"GNU\0", 3, b"x" * 20) + _note(b"Xen\0", 18, b"\0" * 8)))
    assert initramfs.has_pvh_entry(pvh)
    assert not initramfs.has_pvh_entry(_elf((4, _note(b"Xen\0", 5, b"xen-3.0\0"))))
    assert not initramfs.has_pvh_entry(b"MZ not an elf")
    static = tmp_path / "static"
    static.write_bytes(_elf((1, b"")))
    dynamic = tmp_path / "dynamic"
    dynamic.write_bytes(_elf((3, b"/lib64/ld-linux-x86-64.so.2\0"), (1, b"")))
    assert is_static_elf(static)
    assert not is_static_elf(dynamic)
    assert not is_static_elf(Path(sys.executable).resolve()) or "static" in sys.executable


def _report() -> CheckReport:
    return CheckReport(
        (
            CheckItem("qemu-system-x86_64", False, "not found", "qemu-system-x86"),
            CheckItem("busybox (static)", False, "not found", "busybox-static"),
            CheckItem("modprobe", True, "/sbin/modprobe", "kmod"),
            CheckItem("root", False, "network namespaces and taps need root", None, PURPOSE_NET),
            CheckItem("tshark", False, "not found", "tshark", PURPOSE_CAPTURE),
        )
    )


def test_check_report_names_packages() -> None:
    report = _report()
    assert not report.ok
    assert not report.ok_for(PURPOSE_RUN)
    assert report.apt_command(PURPOSE_RUN) == "apt-get install -y qemu-system-x86 busybox-static"
    assert report.apt_command() == "apt-get install -y qemu-system-x86 busybox-static tshark"
    reason = report.skip_reason(PURPOSE_RUN, PURPOSE_NET)
    assert reason is not None
    assert "qemu-system-x86_64 (qemu-system-x86)" in reason
    assert "busybox-static" in reason and "need root" in reason
    assert report.skip_reason(PURPOSE_CAPTURE) is not None
    assert CheckReport((CheckItem("x", True, "", "kmod"),)).apt_command() is None


def test_lab_requires_skips_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from ibal.lab import pytest_plugin

    monkeypatch.setattr(pytest_plugin, "lab_report", _report)
    monkeypatch.delenv("IBAL_LAB_REQUIRED", raising=False)
    monkeypatch.delenv("IBAL_LAB", raising=False)
    with pytest.raises(pytest.skip.Exception, match="qemu-system-x86"):
        lab_requires(PURPOSE_RUN)
    with pytest.raises(pytest.skip.Exception, match="tshark"):
        lab_requires(PURPOSE_CAPTURE)
    # In CI a missing piece must fail loudly instead of skipping.
    monkeypatch.setenv("IBAL_LAB_REQUIRED", "1")
    with pytest.raises(pytest.fail.Exception, match="busybox-static"):
        lab_requires(PURPOSE_RUN)
    monkeypatch.setenv("IBAL_LAB", "0")
    with pytest.raises(pytest.skip.Exception, match="IBAL_LAB=0"):
        lab_requires(PURPOSE_RUN)


@pytest.mark.lab
def test_initramfs_is_cached_and_loads_modules_in_dependency_order(tmp_path: Path) -> None:
    lab_requires(PURPOSE_RUN)
    from ibal.lab.host import find_busybox, select_kernel

    kernel, busybox = select_kernel(), find_busybox()
    assert busybox is not None
    first = initramfs.build_initramfs(kernel, busybox, tmp_path)
    mtime = first.stat().st_mtime_ns
    assert initramfs.build_initramfs(kernel, busybox, tmp_path) == first
    assert first.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert first.name.startswith(f"initramfs-{kernel.version}-")

    entries = parse_newc(first.read_bytes())
    assert entries["init"][1] == initramfs.INIT_SCRIPT.encode()
    assert entries["bin/busybox"][1] == busybox.read_bytes()
    order = [
        line.split()[0].rsplit("-", 1)[-1]
        for line in entries["modules/base.list"][1].decode().splitlines()
    ]
    for before, after in (
        ("virtio.ko", "virtio_pci.ko"),
        ("9pnet.ko", "9pnet_virtio.ko"),
        ("9pnet.ko", "9p.ko"),
    ):
        assert order.index(before) < order.index(after), order
    assert "overlay.ko" in order and "virtio_console.ko" in order
    assert any(
        line.endswith("virtio_net.ko") for line in entries["modules/net.list"][1].decode().split()
    )
    for line in entries["modules/base.list"][1].decode().splitlines():
        assert entries[line.split()[0].lstrip("/")][1][:4] == b"\x7fELF"
