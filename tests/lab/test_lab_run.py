"""Guest command semantics: exit status, exact and separate output, env, cwd, stdin, sharing.

The session tests share one guest boot (`ibal_lab_module_session`): each leaves
the guest as it found it; `Lab.run`'s own boot is the first test's subject.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ibal.lab import Lab, LabCommandError, LabSession

pytestmark = pytest.mark.lab


def test_run_reports_rxe0_active_and_boot_time(ibal_lab: Lab) -> None:
    result = ibal_lab.run(["ibv_devinfo", "-d", "rxe0"], timeout=120)
    assert result.returncode == 0, result.stderr_text
    assert "hca_id:\trxe0" in result.stdout_text
    assert "PORT_ACTIVE" in result.stdout_text
    assert "link_layer:\t\tEthernet" in result.stdout_text
    assert result.stderr == b""
    assert result.boot_seconds > 0
    assert not result.timed_out


def test_rxe_netdev_is_ready_for_multicast(ibal_lab_module_session: LabSession) -> None:
    """The lab sets up what RoCE multicast needs on rxe0's netdev (lo here)."""
    s = ibal_lab_module_session
    cmds = ["rdma link show rxe0/1", "ip -o link show lo", "ip route get 224.0.0.251",
            "ip -6 route show table local ff00::/8"]  # fmt: skip
    r = s.run(" && echo @@ && ".join(cmds))
    assert r.returncode == 0, r.stderr_text
    link, lo, v4, v6 = (part.strip() for part in r.stdout_text.split("@@"))
    assert "netdev lo" in link
    assert "MULTICAST" in lo.split(">")[0]
    assert v4.startswith("multicast 224.0.0.251 dev lo")
    assert v6.startswith("multicast ff00::/8 dev lo")


def test_exit_status_and_streams_are_exact(ibal_lab_module_session: LabSession) -> None:
    s = ibal_lab_module_session
    assert s.run(["sh", "-c", "exit 7"]).returncode == 7
    assert s.run("exit 0").returncode == 0
    # kill -9 of the command itself: the shell's 128+signal convention.
    assert s.run("kill -9 $$").returncode == 137

    r = s.run("printf 'out 1\\nout 2\\n'; printf 'err 1\\n' >&2; printf 'no newline' >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, b"out 1\nout 2\n", b"err 1\nno newline")

    # Every byte value survives, in both streams, with no console noise mixed in.
    every_byte = bytes(range(256))
    r = s.run(["/usr/bin/python3", "-c", _WRITE_BYTES])
    assert r.returncode == 0, r.stderr_text
    assert r.stdout == every_byte * 64
    assert r.stderr == every_byte[::-1]

    with pytest.raises(LabCommandError):
        s.run("exit 1").check_returncode()


_WRITE_BYTES = (
    "import sys; b = bytes(range(256)); "
    "sys.stdout.buffer.write(b * 64); sys.stderr.buffer.write(b[::-1])"
)


def test_argv_env_cwd_and_stdin(ibal_lab_module_session: LabSession) -> None:
    s = ibal_lab_module_session
    tricky = ["a b", "it's", '"q"', "$HOME", "`id`", "*", "", "new\nline", "-n"]
    r = s.run(["printf", "[%s]", *tricky])
    assert r.stdout_text == "".join(f"[{a}]" for a in tricky)

    env = {"PATH": "/usr/bin:/bin", "IBAL_X": "va lue $'\"\n", "EMPTY": ""}
    r = s.run(["env"], env=env)
    lines = r.stdout_text
    assert "IBAL_X=va lue $'\"\n" in lines and "EMPTY=\n" in lines
    assert "HOME=" not in lines  # env replaces, it does not add

    # Default env is this process's; default cwd is this process's (shared root).
    r = s.run(
        ["sh", "-c", 'printf "%s|%s" "$PWD" "$IBAL_LAB_TEST_MARK"'],
        env={**os.environ, "IBAL_LAB_TEST_MARK": "m"},
    )
    assert r.stdout_text == f"{os.getcwd()}|m"
    assert s.run(["pwd"], cwd="/usr/share").stdout_text == "/usr/share\n"
    r = s.run(["pwd"], cwd="/no/such/dir")
    assert r.returncode == 125 and b"/no/such/dir" in r.stderr

    assert s.run(["cat"], input=b"line1\n\x00\xffend").stdout == b"line1\n\x00\xffend"
    assert s.run(["cat"]).stdout == b""  # no input: /dev/null, never a hang

    missing = s.run(["/no/such/program"])
    assert missing.returncode == 127


def test_shared_dir_tmp_and_root_overlay(
    ibal_lab_module_session: LabSession, tmp_path: Path
) -> None:
    s = ibal_lab_module_session
    (s.host_dir / "from-host.txt").write_bytes(b"hello guest")
    r = s.run(["cat", f"{s.guest_dir}/from-host.txt"])
    assert r.stdout == b"hello guest"
    s.run(["sh", "-c", f"printf 'hello host' > {s.guest_dir}/from-guest.txt"]).check_returncode()
    assert (s.host_dir / "from-guest.txt").read_bytes() == b"hello host"
    assert s.guest_path(s.host_dir / "x" / "y.py") == f"{s.guest_dir}/x/y.py"

    # /tmp is the host's through the overlay (a checkout under /tmp must be
    # reachable), and guest writes there stay in the guest.
    assert "overlay" in s.run(["stat", "-f", "-c", "%T", "/tmp"]).stdout_text
    probe_tmp = tmp_path.parent / f"ibal-lab-probe-{os.getpid()}"
    s.run(["sh", "-c", f"echo guest > {probe_tmp}"]).check_returncode()
    assert not probe_tmp.exists()

    # The root is the host's, read-only underneath: guest writes stay in the guest.
    probe = Path("/etc/ibal-lab-overlay-probe")
    assert not probe.exists()
    s.run(["sh", "-c", f"echo guest > {probe} && cat {probe}"]).check_returncode()
    assert not probe.exists()


def test_concurrent_jobs_in_one_guest(ibal_lab_module_session: LabSession) -> None:
    s = ibal_lab_module_session
    fifo = "/tmp/fifo"  # the overlay's tmpfs upper layer (9p shares cannot hold fifos)
    s.run(["mkfifo", fifo]).check_returncode()
    # The reader blocks until the second job writes: both must run at once.
    reader = s.guest_start(["cat", fifo], timeout=60)
    writer = s.guest_start(["sh", "-c", f"echo through-the-fifo > {fifo}"], timeout=60)
    assert writer.wait().returncode == 0
    r = reader.wait()
    assert (r.returncode, r.stdout) == (0, b"through-the-fifo\n")


def test_output_is_streamed(ibal_lab_module_session: LabSession) -> None:
    chunks: list[bytes] = []
    errs: list[bytes] = []
    r = ibal_lab_module_session.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; done",
        on_stdout=chunks.append,
        on_stderr=errs.append,
    )
    assert b"".join(chunks) == r.stdout == b"1\n2\n3\n"
    assert b"".join(errs) == r.stderr == b"e1\ne2\ne3\n"
