"""Timeouts, hangs, crashes, interrupts: the result says what happened, nothing is left."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from ibal.lab import TIMEOUT_RETURNCODE, Lab, LabBootError, LabSession, LabVMError

pytestmark = pytest.mark.lab

Cleaned = Callable[[LabSession], None]

# The guest's live processes running `sleep` (procps is not needed: /proc suffices). A
# zombie is dead (init reaps the orphan a moment later) and a killed member of the group
# may still be on its way out when the leader's exit ends the job: look again, for at
# most 5 s, until none is left alive.
_SLEEPERS = (
    'for i in $(seq 50); do live=; for p in /proc/[0-9]*; do '
    '[ "$(cat $p/comm 2>/dev/null)" = sleep ] && ! grep -q "^State:.Z" $p/status 2>/dev/null '
    '&& live="$live ${p#/proc/}"; done; [ -z "$live" ] && break; sleep 0.1; done; '
    '[ -n "$live" ] && echo $live; true'
)


def test_timeout_kills_the_process_group_and_the_guest_goes_on(
    ibal_lab_session: LabSession,
) -> None:
    s = ibal_lab_session
    # A command that ignores SIGTERM, with a child in its process group.
    r = s.run("trap '' TERM; sleep 600 & sleep 600; echo unreachable", timeout=2)
    assert r.timed_out
    assert r.returncode == TIMEOUT_RETURNCODE
    assert r.stdout == b""
    assert s.run(_SLEEPERS).stdout == b""  # the background child died too
    assert s.run(["echo", "alive"]).stdout == b"alive\n"


def test_timeout_with_net_leaves_nothing(
    ibal_lab: Lab, assert_cleaned: Cleaned, assert_no_lab_state: Callable[[], None]
) -> None:
    with ibal_lab.session(net=True) as s:
        helper = s.host_popen(["sleep", "600"])
        r = s.run(["sleep", "600"], timeout=1)
        assert r.timed_out and r.returncode == TIMEOUT_RETURNCODE
        assert s.netns_name is not None
        assert s.alive  # a timed-out command leaves the guest up
    assert not s.alive
    assert helper.poll() is not None  # host-side helpers are killed with the session
    assert_cleaned(s)
    # Lab.run: the same through the one-shot API.
    r = ibal_lab.run("sleep 600", net=True, timeout=1)
    assert r.timed_out
    assert_no_lab_state()


def test_hung_guest_is_killed_at_the_deadline(ibal_lab: Lab, assert_cleaned: Cleaned) -> None:
    lab = Lab(kill_grace=0.5, hung_grace=1.0)
    with lab.session() as s:
        assert s.qemu_pid is not None
        os.kill(s.qemu_pid, signal.SIGSTOP)  # the whole VM stops answering
        r = s.guest_start(["true"], timeout=1).wait(timeout=120)
        assert r.timed_out and r.returncode == TIMEOUT_RETURNCODE
        with pytest.raises(LabVMError):
            s.run(["true"])
        assert not s.alive
    assert_cleaned(s)


def test_boot_timeout_raises_and_cleans_up(ibal_lab: Lab, assert_cleaned: Cleaned) -> None:
    s = Lab(boot_timeout=0.5).session(net=True)
    with pytest.raises(LabBootError, match="not ready after"):
        s.start()
    assert s.netns_name is not None
    assert_cleaned(s)


def test_keyboard_interrupt_mid_command_cleans_up(ibal_lab: Lab, assert_cleaned: Cleaned) -> None:
    def interrupt(data: bytes) -> None:
        raise KeyboardInterrupt

    s = ibal_lab.session(net=True)
    with pytest.raises(KeyboardInterrupt), s:
        s.run("echo started; sleep 600", on_stdout=interrupt, timeout=600)
    assert_cleaned(s)


def test_guest_kernel_crash_is_an_error_not_a_result(ibal_lab_session: LabSession) -> None:
    assert ibal_lab_session.alive
    with pytest.raises(LabVMError, match="Kernel panic"):
        ibal_lab_session.run("echo c > /proc/sysrq-trigger", timeout=60)
    assert not ibal_lab_session.alive  # what the module-shared guests check before each test


def test_failed_guest_setup_is_reported(
    ibal_lab: Lab, assert_cleaned: Cleaned, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ibal.lab import guest

    original = guest.agent_script

    def broken(net: object, link: object = None) -> str:
        script = original(None)
        return script.replace("step modprobe rdma_rxe", "step modprobe ibal_lab_no_such_module")

    monkeypatch.setattr(guest, "agent_script", broken)
    s = ibal_lab.session()
    with pytest.raises(LabBootError) as info:
        s.start()
    message = str(info.value)
    assert "guest setup failed: modprobe ibal_lab_no_such_module" in message
    assert "FAILED: modprobe ibal_lab_no_such_module" in message  # the setup log is included
    assert_cleaned(s)
