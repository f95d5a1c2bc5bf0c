"""Boot throwaway qemu guests with kernel rdma_rxe and run commands in them."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ibal.lab import guest
from ibal.lab.host import Kernel, LabUnavailable, find_busybox, find_qemu, select_kernel
from ibal.lab.initramfs import GUEST_SHARE, ROOT_TAG, SHARE_TAG, build_initramfs, direct_boot_kernel
from ibal.lab.link import GuestLink, LinkConfig
from ibal.lab.netns import NetConfig, NetNamespace, cleanup_stale

#: Default limit for one guest command, in seconds.
DEFAULT_TIMEOUT = 300.0
#: Default limit for booting to the agent's "ready", in seconds. TCG boots in
#: ~3-10 s here; the margin is for loaded CI machines.
DEFAULT_BOOT_TIMEOUT = 120.0
#: After a command's timeout: SIGTERM, then SIGKILL this much later, then the
#: VM is declared hung and killed if the job still has not ended.
KILL_GRACE = 2.0
HUNG_GRACE = 10.0
#: Return code reported for a command that hit its timeout (as coreutils timeout).
TIMEOUT_RETURNCODE = 124
_TMP_PREFIX = "ibal-lab-"

if TYPE_CHECKING:
    from ibal.lab.cluster import LabCluster

OutputCallback = Callable[[bytes], None]


class LabError(RuntimeError):
    """The lab machinery failed (as opposed to the command in the guest)."""


class LabBootError(LabError):
    """The guest did not reach the point where it runs commands."""


class LabVMError(LabError):
    """The guest died or stopped answering while commands were pending."""


class LabCommandError(LabError):
    """Raised by `LabResult.check_returncode()` for a failed or timed-out command."""

    def __init__(self, result: LabResult) -> None:
        what = "timed out" if result.timed_out else f"exited with {result.returncode}"
        super().__init__(
            f"guest command {result.command!r} {what}\nstderr:\n{result.stderr_text[-2000:]}"
        )
        self.result = result


@dataclass(frozen=True)
class LabResult:
    """Outcome of one guest command. stdout/stderr are the exact bytes it wrote."""

    command: Sequence[str] | str
    returncode: int
    stdout: bytes
    stderr: bytes
    boot_seconds: float
    run_seconds: float
    timed_out: bool = False
    console: str = field(default="", repr=False)

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.returncode == 0 and not self.timed_out

    def check_returncode(self) -> LabResult:
        """Return self, or raise LabCommandError if the command failed."""
        if not self.ok:
            raise LabCommandError(self)
        return self


def _tail(path: Path, limit: int = 4000) -> str:
    """Last `limit` characters of a text file, or '' if it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def _dead_owner(entry: Path) -> bool:
    """True for a lab temp dir whose creating process no longer exists."""
    parts = entry.name[len(_TMP_PREFIX) :].split("-", 1)
    if not parts[0].isdigit():
        return False
    try:
        os.kill(int(parts[0]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def cleanup_stale_tempdirs() -> list[Path]:
    """Remove temp dirs left by lab processes that were killed; return them."""
    removed = []
    for entry in Path(tempfile.gettempdir()).glob(_TMP_PREFIX + "*"):
        if entry.is_dir() and _dead_owner(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class GuestJob:
    """A command started in the guest by `LabSession.guest_start()`."""

    def __init__(
        self, session: LabSession, job_id: int, command: Sequence[str] | str, timeout: float
    ) -> None:
        self.session = session
        self.id = job_id
        self.command = command
        self.timeout = timeout
        self.dir = session.host_share / "jobs" / str(job_id)
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.finished: float | None = None
        self.returncode: int | None = None
        self.timed_out = False
        self.error: str | None = None
        # Escalation state after the timeout: 0 nothing sent, 1 TERM, 2 KILL.
        self._kill_stage = 0
        self._next_kill = 0.0
        self._event = threading.Event()
        self._offsets = {"stdout": 0, "stderr": 0}
        # Output as it was when the job ended: results stay readable after the
        # session (and its temp dir) is gone.
        self._output: dict[str, bytes] = {}
        self._console = ""

    def done(self) -> bool:
        """True once the command has ended (or the VM under it has)."""
        return self._event.is_set()

    def _finish(self, returncode: int | None, error: str | None = None) -> None:
        if self._event.is_set():
            return
        for name in ("stdout", "stderr"):
            try:
                self._output[name] = (self.dir / name).read_bytes()
            except OSError:
                self._output[name] = b""
        self._console = self.session.console_tail(20000)
        self.returncode = returncode
        self.error = error
        self.finished = time.monotonic()
        self._event.set()

    def read_new(self, stream: str) -> bytes:
        """Bytes written to `stream` ('stdout' or 'stderr') since the last call."""
        offset = self._offsets[stream]
        if self._event.is_set():
            data = self._output[stream][offset:]
        else:
            try:
                with (self.dir / stream).open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                return b""
        self._offsets[stream] += len(data)
        return data

    def connect(self, host: str, port: int, *, timeout: float = 120,
                io_timeout: float | None = None) -> socket.socket:
        """A TCP connection to the server this job starts, retried while it does not listen yet.

        Run it where the guest's link is (inside ``session.in_netns()``).  Raises
        ``LabError`` when the job ends first or ``timeout`` seconds pass; the
        socket's own timeout is ``io_timeout`` (default: ``timeout``).
        """
        deadline = time.monotonic() + timeout
        while True:  # the guest's interpreter takes a while to start and listen
            try:
                return socket.create_connection((host, port), timeout=io_timeout or timeout)
            except ConnectionRefusedError:
                if self.done() or time.monotonic() > deadline:
                    raise LabError(f"job {self.id} never listened on {host}:{port}") from None
                time.sleep(0.2)

    def kill(self) -> None:
        """Kill the command's process group in the guest (SIGKILL)."""
        self.session._send(f"kill {self.id} KILL")

    def wait(
        self,
        timeout: float | None = None,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> LabResult:
        """Wait for the command and return its result.

        `timeout` only bounds this wait (TimeoutError if exceeded); the
        command's own limit, set at start, is enforced regardless. The
        callbacks receive output as it arrives, in this thread.
        """
        limit = None if timeout is None else time.monotonic() + timeout
        streaming = on_stdout is not None or on_stderr is not None
        while not self._event.wait(0.1 if streaming else 0.5):
            if streaming:
                self._stream(on_stdout, on_stderr)
            if limit is not None and time.monotonic() >= limit:
                raise TimeoutError(f"guest job {self.id} still running after {timeout} s")
        if streaming:
            self._stream(on_stdout, on_stderr)
        return self.result()

    def _stream(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
        for name, cb in (("stdout", on_stdout), ("stderr", on_stderr)):
            if cb is not None:
                data = self.read_new(name)
                if data:
                    cb(data)

    def result(self) -> LabResult:
        """The result of a finished job; raises LabVMError if the VM died under it."""
        if not self._event.is_set():
            raise RuntimeError(f"guest job {self.id} has not finished")
        if self.error is not None and not self.timed_out:
            raise LabVMError(f"{self.error}\n--- guest console (tail) ---\n{self._console[-4000:]}")
        rc = TIMEOUT_RETURNCODE if self.timed_out else self.returncode
        return LabResult(
            command=self.command,
            returncode=rc if rc is not None else -1,
            stdout=self._output["stdout"],
            stderr=self._output["stderr"],
            boot_seconds=self.session.boot_seconds,
            run_seconds=(self.finished or time.monotonic()) - self.started,
            timed_out=self.timed_out,
            console=self._console,
        )


_LIVE: weakref.WeakSet[LabSession] = weakref.WeakSet()


@atexit.register
def _close_live_sessions() -> None:
    """Last resort: never leave a VM or namespace behind when Python exits."""
    for s in list(_LIVE):
        with contextlib.suppress(Exception):
            s.close()


class LabSession:
    """One booted guest: run several commands, and host-side processes on its link.

    Use as a context manager; leaving it (normally, by exception or Ctrl-C)
    powers the guest off, kills qemu and every host process started through the
    session, and deletes the namespace, tap and temp dirs.
    """

    def __init__(
        self,
        lab: Lab,
        *,
        net: bool = False,
        boot_timeout: float | None = None,
        link: GuestLink | None = None,
    ) -> None:
        self.lab = lab
        self.net_config: NetConfig | None = lab.net_config if net else None
        #: This guest's end of a link to other guests (`Lab.cluster`), else None.
        self.link = link
        self.boot_timeout = boot_timeout if boot_timeout is not None else lab.boot_timeout
        self.netns: NetNamespace | None = None
        self.boot_seconds = 0.0
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-"))
        self.host_share = self.tmp / "share"
        self._qemu: subprocess.Popen[bytes] | None = None
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._pump_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._setup_failed: str | None = None
        self._dead: str | None = None
        self._boot_deadline = 0.0
        self._t0 = 0.0
        self._closing = False
        self._closed = False
        self._jobs: dict[int, GuestJob] = {}
        self._next_id = 1
        self._host_procs: list[subprocess.Popen[Any]] = []
        _LIVE.add(self)

    # -- paths shared with the guest -------------------------------------------------

    @property
    def host_dir(self) -> Path:
        """A writable host directory the guest sees at `guest_dir` (scripts, data)."""
        return self.host_share / "work"

    @property
    def guest_dir(self) -> str:
        """Guest path of `host_dir`: files the host writes there after boot show in the guest."""
        return f"{GUEST_SHARE}/work"

    def guest_path(self, host_path: os.PathLike[str] | str) -> str:
        """Translate a path under `host_dir` into the guest's view of it."""
        rel = Path(host_path).resolve().relative_to(self.host_dir.resolve())
        return f"{self.guest_dir}/{rel.as_posix()}" if rel.parts else self.guest_dir

    @property
    def qemu_pid(self) -> int | None:
        """Process id of qemu (None before start)."""
        return self._qemu.pid if self._qemu is not None else None

    @property
    def netns_name(self) -> str | None:
        """Name of this session's network namespace (None without net)."""
        return self.netns.name if self.netns else None

    @property
    def alive(self) -> bool:
        """Booted, not closed, and neither qemu nor the guest's agent has gone away."""
        q = self._qemu
        return (
            self._ready.is_set() and self._setup_failed is None and self._dead is None
            and not self._closing and q is not None and q.poll() is None
        )  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LabSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Boot the guest and wait for its agent; on any failure clean up and raise."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start qemu without waiting for the guest (then `wait_ready`); cleans up on failure.

        Several sessions launched before any waits boot in parallel.
        """
        try:
            self._launch()
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """Wait for a launched guest's agent; on failure clean up and raise `LabBootError`."""
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _launch(self) -> None:
        _kernel, image, initrd = self.lab.prepare()
        (self.host_share / "jobs").mkdir(parents=True)
        self.host_dir.mkdir()
        agent = self.host_share / "agent.sh"
        agent.write_text(guest.agent_script(self.net_config, self.link))
        agent.chmod(0o755)

        sock_path = self.tmp / "ctl.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(sock_path))
        self._listener.listen(1)
        self._listener.settimeout(0.2)

        if self.net_config is not None:
            cleanup_stale()
            self.netns = NetNamespace.create(self.net_config)

        argv = self.lab.qemu_argv(
            image=image,
            initrd=initrd,
            share=self.host_share,
            control_socket=sock_path,
            console_log=self.tmp / "console.log",
            net=self.net_config,
            link=self.link,
        )
        if self.netns is not None:
            argv = self.netns.argv(argv)
        # If this process dies without cleaning up (SIGKILL), the kernel kills qemu.
        # The death signal follows the creating *thread*, so only use it from the
        # main thread, whose end is the process's end.
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            argv = [setpriv, "--pdeathsig", "KILL", *argv]
        t0 = time.monotonic()
        with (self.tmp / "qemu.log").open("wb") as qlog:
            self._qemu = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=qlog,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._t0 = t0
        self._boot_deadline = t0 + self.boot_timeout

    def _wait_ready(self) -> None:
        if self._listener is None or self._qemu is None:
            raise LabError("wait_ready() before launch()")
        deadline = self._boot_deadline
        while self._conn is None:
            self._check_boot(deadline)
            with contextlib.suppress(TimeoutError):
                self._conn, _ = self._listener.accept()
        self._conn.settimeout(0.1)
        self._pump_thread = threading.Thread(target=self._pump, name="ibal-lab-pump", daemon=True)
        self._pump_thread.start()
        while not self._ready.wait(0.2):
            self._check_boot(deadline)
        if self._setup_failed is not None:
            raise LabBootError(self._boot_failure(f"guest setup failed: {self._setup_failed}"))
        self.boot_seconds = time.monotonic() - self._t0

    def _check_boot(self, deadline: float) -> None:
        assert self._qemu is not None
        if self._qemu.poll() is not None:
            raise LabBootError(
                self._boot_failure(
                    f"qemu exited with {self._qemu.returncode} before the guest was ready"
                )
            )
        if self._dead is not None:
            raise LabBootError(self._boot_failure(self._dead))
        if time.monotonic() >= deadline:
            raise LabBootError(
                self._boot_failure(f"guest not ready after {self.boot_timeout:g} s; VM killed")
            )

    def _boot_failure(self, message: str) -> str:
        return (
            f"{message}\n--- qemu output ---\n{_tail(self.tmp / 'qemu.log')}"
            f"\n--- guest setup log ---\n{_tail(self.host_share / 'setup.log')}"
            f"\n--- guest console (tail) ---\n{self.console_tail()}"
        )

    def console_tail(self, limit: int = 4000) -> str:
        """The end of the guest's serial console (kernel messages)."""
        return _tail(self.tmp / "console.log", limit)

    def close(self) -> None:
        """Power off and clean up everything; safe to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
        try:
            self._stop_vm()
        finally:
            try:
                self._stop_host_procs()
            finally:
                try:
                    if self.netns is not None:
                        self.netns.delete()
                finally:
                    for s in (self._conn, self._listener):
                        if s is not None:
                            with contextlib.suppress(OSError):
                                s.close()
                    if (
                        self._pump_thread is not None
                        and self._pump_thread is not threading.current_thread()
                    ):
                        self._pump_thread.join(5)
                    if not os.environ.get("IBAL_LAB_KEEP"):
                        shutil.rmtree(self.tmp, ignore_errors=True)
                    _LIVE.discard(self)

    def _stop_vm(self) -> None:
        q = self._qemu
        if q is None:
            return
        # Only a guest whose agent is listening can power off by itself; one
        # still booting (or broken) is simply killed.
        agent_up = self._ready.is_set() and self._setup_failed is None and self._dead is None
        if q.poll() is None and self._conn is not None and agent_up:
            with contextlib.suppress(OSError):
                self._conn.sendall(b"halt\n")
            with contextlib.suppress(subprocess.TimeoutExpired):
                q.wait(3)
        if q.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(q.pid, signal.SIGKILL)
            q.wait()
        for job in list(self._jobs.values()):
            job._finish(None, "the lab session was closed before the command ended")

    def _stop_host_procs(self) -> None:
        for p in self._host_procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)

    def _kill_vm(self, reason: str) -> None:
        """Kill qemu now (hung guest); pending jobs end with `reason`."""
        self._dead = self._dead or reason
        if self._qemu is not None and self._qemu.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._qemu.pid, signal.SIGKILL)

    # -- the control channel -------------------------------------------------------------

    def _send(self, line: str) -> None:
        if self._dead is not None or self._conn is None:
            raise LabVMError(f"the lab VM is gone: {self._dead or 'not started'}")
        try:
            with self._send_lock:  # one whole line at a time, whichever thread sends
                self._conn.sendall(line.encode() + b"\n")
        except OSError as exc:
            raise LabVMError(f"control channel to the guest failed: {exc}") from exc

    def _pump(self) -> None:
        """Thread: read agent messages, enforce job timeouts, notice a dead VM."""
        assert self._conn is not None and self._qemu is not None
        buf = b""
        while True:
            try:
                data: bytes | None = self._conn.recv(4096)
            except TimeoutError:
                data = None
            except OSError:
                data = b""
            if data:
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._on_message(line.decode("utf-8", "replace").strip())
            self._enforce_timeouts()
            if data == b"" or self._qemu.poll() is not None:
                if not self._closing:
                    self._dead = (
                        self._dead or f"the guest went away (qemu exit status {self._qemu.poll()})"
                    )
                self._ready.set()
                for job in list(self._jobs.values()):
                    job._finish(None, self._dead or "the lab VM stopped")
                return

    def _on_message(self, line: str) -> None:
        verb, _, rest = line.partition(" ")
        if verb == "ready":
            self._ready.set()
        elif verb == "failed":
            self._setup_failed = rest or "unknown step"
            self._ready.set()
        elif verb == "done":
            job = self._jobs.get(int(rest)) if rest.isdigit() else None
            if job is not None:
                try:
                    rc = int((job.dir / "rc").read_text().strip())
                except (OSError, ValueError):
                    rc = -1
                job._finish(rc)

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.done() or now < job.deadline or now < job._next_kill:
                continue
            job.timed_out = True
            try:
                if job._kill_stage == 0:
                    self._send(f"kill {job.id} TERM")
                    job._kill_stage, job._next_kill = 1, now + self.lab.kill_grace
                elif job._kill_stage == 1:
                    self._send(f"kill {job.id} KILL")
                    job._kill_stage, job._next_kill = 2, now + self.lab.hung_grace
                else:
                    self._kill_vm(f"guest did not end job {job.id} after SIGKILL; VM killed")
            except LabVMError:
                self._kill_vm("control channel failed while killing a timed-out job")

    # -- guest commands ------------------------------------------------------------------

    def guest_start(
        self,
        command: Sequence[str] | str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: bytes | None = None,
    ) -> GuestJob:
        """Start `command` in the guest without waiting for it.

        A list runs as argv, a string under `sh -c`. `env` replaces the whole
        environment (default: this process's); `cwd` defaults to this process's
        working directory, which the guest sees through the shared root.
        stdin is `input`, or /dev/null.
        """
        if not self._ready.is_set() or self._closed:
            raise LabVMError("the lab session is not running")
        if self._dead is not None:
            raise LabVMError(f"the lab VM is gone: {self._dead}")
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
        jdir = self.host_share / "jobs" / str(job_id)
        jdir.mkdir()
        stdin_path = None
        if input is not None:
            (jdir / "stdin").write_bytes(input)
            stdin_path = f"{GUEST_SHARE}/jobs/{job_id}/stdin"
        script = guest.job_script(
            command,
            env=dict(os.environ if env is None else env),
            cwd=cwd if cwd is not None else os.getcwd(),
            stdin_path=stdin_path,
        )
        (jdir / "cmd.sh").write_text(script)
        (jdir / "cmd.sh").chmod(0o755)
        job = GuestJob(self, job_id, command, timeout)
        self._jobs[job_id] = job
        self._send(f"run {job_id}")
        return job

    def run(
        self,
        command: Sequence[str] | str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> LabResult:
        """Run `command` in the guest and wait for it (see `guest_start`)."""
        job = self.guest_start(command, timeout=timeout, env=env, cwd=cwd, input=input)
        return job.wait(on_stdout=on_stdout, on_stderr=on_stderr)

    # -- host side of the link -------------------------------------------------------------

    def _host_argv(self, argv: Sequence[str]) -> list[str]:
        return self.netns.argv(argv) if self.netns is not None else list(argv)

    def host_popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a host process inside the session's namespace (on the guest's link).

        It gets its own process group and is killed when the session closes.
        Without net it runs in the host's own network.
        """
        kwargs.setdefault("start_new_session", True)
        p: subprocess.Popen[Any] = subprocess.Popen(self._host_argv(argv), **kwargs)
        self._host_procs.append(p)
        return p

    def host_run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        input: bytes | None = None,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """Run a host process inside the namespace and wait; output is captured by default.

        On timeout its whole process group is killed and TimeoutExpired raised.
        """
        if "stdout" not in kwargs and "stderr" not in kwargs:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        if input is not None:
            kwargs["stdin"] = subprocess.PIPE
        p = self.host_popen(argv, **kwargs)
        try:
            out, err = p.communicate(input, timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    @contextlib.contextmanager
    def in_netns(self) -> Iterator[None]:
        """Run the `with` body's calling thread inside the namespace (sockets stay there)."""
        if self.netns is None:
            raise LabError("this session has no network namespace (start it with net=True)")
        with self.netns.entered():
            yield


class Lab:
    """Configuration for booting lab guests; cheap to create, reusable, thread-safe.

    `prepare()` (called on first use) checks the host and builds or reuses the
    cached initramfs; each `session()` or `run()` boots a fresh guest.

    kernel: a version in /lib/modules or a /boot/vmlinuz-* path (default:
    $IBAL_LAB_KERNEL, else the newest kernel that has rdma_rxe).
    memory_mb, cpus, machine, cpu: the qemu guest.
    cache_dir: where images are cached (default ~/.cache/ibal/lab).
    net_config: addresses of the --net link.
    boot_timeout: seconds from starting qemu to the agent's "ready".
    kill_grace, hung_grace: after a command's timeout, seconds from SIGTERM to
    SIGKILL, then from SIGKILL to declaring the VM hung and killing it.
    debug: keep the kernel's console verbose (see LabResult.console).
    """

    def __init__(
        self,
        *,
        kernel: str | None = None,
        memory_mb: int = 1024,
        cpus: int = 1,
        cache_dir: Path | None = None,
        net_config: NetConfig | None = None,
        boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
        machine: str = "q35",
        cpu: str = "max",
        kill_grace: float = KILL_GRACE,
        hung_grace: float = HUNG_GRACE,
        debug: bool = False,
    ) -> None:
        self.kernel_spec = kernel
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.cache_dir = cache_dir
        self.net_config = net_config or NetConfig()
        self.boot_timeout = boot_timeout
        # q35 boots ~1 s faster than pc under TCG (no ACPI PCI link setup per
        # device); "max" runs whatever the host's binaries were built for.
        self.machine = machine
        self.cpu = cpu
        self.kill_grace = kill_grace
        self.hung_grace = hung_grace
        self.debug = debug
        self._prepared: tuple[Kernel, Path, Path] | None = None
        self._prep_lock = threading.Lock()

    def prepare(self) -> tuple[Kernel, Path, Path]:
        """Find the kernel, its boot image and the cached initramfs; raise LabUnavailable.

        The boot image is the cached uncompressed vmlinux when the kernel
        supports PVH entry, else the bzImage itself.
        """
        with self._prep_lock:
            if self._prepared is None:
                if find_qemu() is None:
                    raise LabUnavailable(
                        "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
                    )
                busybox = find_busybox()
                if busybox is None:
                    raise LabUnavailable("no static busybox (apt-get install busybox-static)")
                kernel = select_kernel(self.kernel_spec)
                if not os.environ.get("IBAL_LAB_KEEP"):
                    cleanup_stale_tempdirs()
                initrd = build_initramfs(kernel, busybox, self.cache_dir)
                image = direct_boot_kernel(kernel, self.cache_dir) or kernel.image
                self._prepared = (kernel, image, initrd)
            return self._prepared

    def qemu_argv(
        self,
        *,
        image: Path,
        initrd: Path,
        share: Path,
        control_socket: Path,
        console_log: Path,
        net: NetConfig | None,
        link: GuestLink | None = None,
    ) -> list[str]:
        """The qemu command line for one guest (`link`: its NIC on a link to other guests)."""
        qemu = find_qemu()
        if qemu is None:
            raise LabUnavailable("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
        # quiet: every console byte is a trapped UART write under TCG.
        cmdline = [
            "console=ttyS0",
            "panic=-1",
            f"ibal_lab.net={1 if net or link else 0}",
            "cryptomgr.notests",  # the crypto self-tests cost ~0.3 s under TCG
        ]
        if not self.debug:
            cmdline.append("quiet")
        argv = [
            qemu,
            "-accel", "tcg",  # KVM guests hang on the hosts this was built on
            "-M", self.machine,
            "-cpu", self.cpu,
            "-m", str(self.memory_mb),
            "-smp", str(self.cpus),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(image),
            "-initrd", str(initrd),
            "-append", " ".join(cmdline),
            "-serial", f"file:{console_log}",
            "-virtfs",
            f"local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,multidevs=remap",
            "-virtfs",
            f"local,path={share},mount_tag={SHARE_TAG},security_model=none,multidevs=remap",
            "-device", "virtio-serial-pci,id=vser0",
            "-chardev", f"socket,id=ctl,path={control_socket}",
            "-device", f"virtserialport,bus=vser0.0,chardev=ctl,name={guest.CONTROL_PORT}",
        ]  # fmt: skip
        if net is not None:
            argv += [
                "-netdev", f"tap,id=n0,ifname={net.tap},script=no,downscript=no",
                # romfile=: the kernel is booted directly, a PXE ROM is never used.
                "-device", f"virtio-net-pci,netdev=n0,mac={net.guest_mac},romfile=",
            ]  # fmt: skip
        if link is not None:
            argv += link.qemu_args()
        return argv

    def session(self, *, net: bool = False, boot_timeout: float | None = None) -> LabSession:
        """A guest to use as `with lab.session(net=True) as s: ...` (boots on enter)."""
        return LabSession(self, net=net, boot_timeout=boot_timeout)

    def cluster(
        self,
        count: int,
        *,
        link: LinkConfig | None = None,
        net: bool = False,
        boot_timeout: float | None = None,
    ) -> LabCluster:
        """`count` guests booted in parallel on one link: ``with lab.cluster(2) as (a, b):``.

        See `ibal.lab.cluster.LabCluster`.
        """
        from ibal.lab.cluster import LabCluster  # cluster.py builds on this module

        return LabCluster(self, count, link=link, net=net, boot_timeout=boot_timeout)

    def run(
        self,
        command: Sequence[str] | str,
        *,
        net: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> LabResult:
        """Boot a guest, run one command in it, power it off, return the result."""
        with self.session(net=net) as s:
            return s.run(
                command,
                timeout=timeout,
                env=env,
                cwd=cwd,
                input=input,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )


def stream_to(fileobj: IO[bytes]) -> OutputCallback:
    """An output callback that writes to a binary file and flushes."""

    def write(data: bytes) -> None:
        fileobj.write(data)
        fileobj.flush()

    return write
