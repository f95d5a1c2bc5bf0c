"""MAD agents over libibumad (ctypes): the kernel owns QP0/QP1 of rdma-core devices.

The Linux MAD layer (``ib_umad``, ``/dev/infiniband/umadN``) sends and
receives MADs for user space per registered agent: requests of a class,
version and methods reach the agent that registered them, responses the
agent whose request carried the TID (the kernel writes its own agent id in
the TID's high 32 bits) while that request waits (``timeout_ms > 0``).
This module binds ``libibumad.so.3`` (Debian ``libibumad3``) with ctypes and
runs one receive thread per CA over the port descriptors.

The ``ib_user_mad`` header layout is declared below and checked against the
library's ``umad_size()`` once a port is open (libibumad enables the P_Key
index field there, growing the header from 56 to 64 bytes); a mismatch
refuses the port rather than corrupt memory.

Under umad2sim (ibsim's ``LD_PRELOAD`` library) three of its behaviours shape
this module (read in ibsim 0.10-0.12's ``umad2sim.c``): its own receive thread
hands every MAD to the descriptor registered for the MAD's *class* and
dereferences a NULL queue (SIGSEGV) when that class has no registration, so
unregistering a class, or closing its port, while an answer may still come
kills the process; unregistering one of two agents of a class drops the class
for both; and its ``poll()`` waits on the first simulated descriptor alone,
ignoring every other one (our wake pipe).  So under umad2sim one
:class:`UmadAgents` per CA lives for the process: its ports stay open, a
"closed" agent's kernel registration is parked and reused by the next agent
of the same class, and MADs for a parked one are dropped and counted
(``unknown_agent``); a reused one may see a late answer of its predecessor,
which the MAD layers above drop by TID.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ibal.records import record
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidHandle,
    InvalidParameter,
    InvalidPermission,
    InvalidPort,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    MAD_HEADER_SIZE,
    MAD_SIZE,
    OPENIB_OUI,
    QP1_WELL_KNOWN_QKEY,
    Gid,
    Grh,
    MadAddr,
    MadAgentSpec,
    MadRecv,
    MadSend,
    MadSendDone,
    WcStatus,
    mad_is_response,
)

log = logging.getLogger("ibal.rdma_core.umad")

LIBRARY = "libibumad.so.3"
DEBIAN_PACKAGE = "libibumad3"
SMP_CLASSES = (0x01, 0x81)
_CA_NAME_LEN = 20  # UMAD_CA_NAME_LEN
_MAX_CAS = 32  # UMAD_MAX_DEVICES
_POLL_MS = 250
_BATCH = 64  # MADs read per wake before the upcalls run


class _MadAddr(ctypes.Structure):
    """``struct ib_mad_addr`` (umad.h); big-endian fields are swapped by hand."""

    _fields_ = [
        ("qpn", ctypes.c_uint32),  # __be32
        ("qkey", ctypes.c_uint32),  # __be32
        ("lid", ctypes.c_uint16),  # __be16
        ("sl", ctypes.c_uint8),
        ("path_bits", ctypes.c_uint8),
        ("grh_present", ctypes.c_uint8),
        ("gid_index", ctypes.c_uint8),
        ("hop_limit", ctypes.c_uint8),
        ("traffic_class", ctypes.c_uint8),
        ("gid", ctypes.c_uint8 * 16),
        ("flow_label", ctypes.c_uint32),  # __be32
        ("pkey_index", ctypes.c_uint16),  # host order
        ("reserved", ctypes.c_uint8 * 6),
    ]


class _UserMad(ctypes.Structure):
    """``struct ib_user_mad`` without its flexible ``data`` array."""

    _fields_ = [
        ("agent_id", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_uint32),
        ("retries", ctypes.c_uint32),
        ("length", ctypes.c_uint32),
        ("addr", _MadAddr),
    ]


class _Buffer(ctypes.Structure):
    _fields_ = [("hdr", _UserMad), ("data", ctypes.c_uint8 * MAD_SIZE)]


def _buffer(size: int) -> Any:
    """An ``ib_user_mad`` with ``size`` data bytes (an RMPP message is longer than a MAD)."""
    if size <= MAD_SIZE:
        return _Buffer()

    class _Long(ctypes.Structure):
        _fields_ = [("hdr", _UserMad), ("data", ctypes.c_uint8 * size)]

    return _Long()


MAX_RMPP_MESSAGE = 1 << 20
"""Largest reassembled message the receive thread accepts from the kernel."""


_MAX_PORTS = 10  # UMAD_CA_MAX_PORTS


class _UmadPort(ctypes.Structure):
    """``umad_port_t`` (umad.h)."""

    _fields_ = [
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("portnum", ctypes.c_int),
        ("base_lid", ctypes.c_uint),
        ("lmc", ctypes.c_uint),
        ("sm_lid", ctypes.c_uint),
        ("sm_sl", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("phys_state", ctypes.c_uint),
        ("rate", ctypes.c_uint),
        ("capmask", ctypes.c_uint32),  # __be32
        ("gid_prefix", ctypes.c_uint64),  # __be64
        ("port_guid", ctypes.c_uint64),  # __be64
        ("pkeys_size", ctypes.c_uint),
        ("pkeys", ctypes.POINTER(ctypes.c_uint16)),
        ("link_layer", ctypes.c_char * _CA_NAME_LEN),
    ]


class _UmadCa(ctypes.Structure):
    """``umad_ca_t`` (umad.h)."""

    _fields_ = [
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("node_type", ctypes.c_uint),
        ("numports", ctypes.c_int),
        ("fw_ver", ctypes.c_char * 20),
        ("ca_type", ctypes.c_char * 40),
        ("hw_ver", ctypes.c_char * 20),
        ("node_guid", ctypes.c_uint64),  # __be64
        ("system_guid", ctypes.c_uint64),  # __be64
        ("ports", ctypes.POINTER(_UmadPort) * _MAX_PORTS),
    ]


@record(frozen=True)
class UmadPortInfo:
    """One port as libibumad reports it (sysfs; under umad2sim a snapshot taken at start)."""

    port_num: int
    port_guid: int
    gid_prefix: int
    lid: int
    lmc: int
    sm_lid: int
    sm_sl: int
    state: int
    """IBA PortState: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE."""
    phys_state: int
    rate: int
    capmask: int
    pkeys: tuple[int, ...]
    link_layer: str


@record(frozen=True)
class UmadCaInfo:
    """A CA as ``umad_get_ca`` reports it."""

    name: str
    node_type: int
    node_guid: int
    system_guid: int
    fw_ver: str
    ca_type: str
    hw_ver: str
    ports: tuple[UmadPortInfo, ...]


class UmadUnavailable(Exception):
    """libibumad or the kernel's umad devices are missing; the message says which."""


class Lib:
    """The libibumad functions this backend calls, with their C types."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(LIBRARY, use_errno=True)
        except OSError as exc:
            raise UmadUnavailable(
                f"{LIBRARY} not found (apt-get install {DEBIAN_PACKAGE})"
            ) from exc
        i, c, p, v = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
        sig: dict[str, tuple[Any, list[Any]]] = {
            "umad_init": (i, []),
            "umad_get_cas_names": (i, [p, i]),
            "umad_size": (v, []),
            "umad_open_port": (i, [c, i]),
            "umad_close_port": (i, [i]),
            "umad_get_fd": (i, [i]),
            "umad_register": (i, [i, i, i, ctypes.c_uint8, ctypes.POINTER(ctypes.c_long)]),
            "umad_register_oui": (
                i, [i, i, ctypes.c_uint8, ctypes.POINTER(ctypes.c_uint8),
                    ctypes.POINTER(ctypes.c_long)],
            ),
            "umad_unregister": (i, [i, i]),
            "umad_send": (i, [i, i, p, i, i, i]),
            "umad_recv": (i, [i, p, ctypes.POINTER(i), i]),
            "umad_get_ca": (i, [c, ctypes.POINTER(_UmadCa)]),
            "umad_release_ca": (i, [ctypes.POINTER(_UmadCa)]),
        }
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib
        # umad_send and umad_recv (after poll() said readable) never wait: called with
        # the GIL held, so a sender and the receive thread do not hand the GIL to each
        # other around every MAD (each hand-back can cost a thread switch).
        fast = ctypes.PyDLL(LIBRARY)
        self.send = fast.umad_send
        self.send.restype, self.send.argtypes = sig["umad_send"]
        self.recv = fast.umad_recv
        self.recv.restype, self.recv.argtypes = sig["umad_recv"]
        if lib.umad_init() < 0:
            raise UmadUnavailable("umad_init failed (no ib_umad kernel module?)")


_lib: Lib | None = None
_lib_lock = threading.Lock()


def under_umad2sim() -> bool:
    """True when ibsim's umad2sim is preloaded (its ``sim_client_init`` is visible)."""
    return hasattr(ctypes.CDLL(None), "sim_client_init")


def load() -> Lib:
    """libibumad, loaded once; ``UmadUnavailable`` says why not."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            _lib = Lib()
        return _lib


def umad_cas() -> list[str]:
    """The CAs libibumad serves (kernel ``ib_umad`` devices, or ``ibsim0`` under umad2sim)."""
    lib = load().lib
    names = (ctypes.c_char * _CA_NAME_LEN * _MAX_CAS)()
    n = lib.umad_get_cas_names(names, _MAX_CAS)
    return [bytes(names[i]).split(b"\0")[0].decode() for i in range(max(n, 0))]


def _text(raw: bytes) -> str:
    return raw.split(b"\0")[0].decode(errors="replace").strip()


def ca_info(ca_name: str) -> UmadCaInfo:
    """``umad_get_ca``: the CA's identity and its ports (``InvalidParameter`` if unknown)."""
    lib = load().lib
    ca = _UmadCa()
    rc = lib.umad_get_ca(ca_name.encode(), ctypes.byref(ca))
    if rc < 0:
        raise _errno_error(rc, f"umad_get_ca {ca_name}")
    try:
        ports = []
        for i in range(_MAX_PORTS):
            ptr = ca.ports[i]
            if not ptr:
                continue
            p = ptr.contents
            pkeys = tuple(p.pkeys[k] for k in range(p.pkeys_size)) if p.pkeys else ()
            ports.append(UmadPortInfo(
                port_num=p.portnum, port_guid=_be64(p.port_guid),
                gid_prefix=_be64(p.gid_prefix), lid=p.base_lid, lmc=p.lmc, sm_lid=p.sm_lid,
                sm_sl=p.sm_sl, state=p.state, phys_state=p.phys_state, rate=p.rate,
                capmask=_be32(p.capmask), pkeys=pkeys, link_layer=_text(p.link_layer),
            ))  # fmt: skip
        return UmadCaInfo(
            name=_text(ca.ca_name), node_type=ca.node_type, node_guid=_be64(ca.node_guid),
            system_guid=_be64(ca.system_guid), fw_ver=_text(ca.fw_ver),
            ca_type=_text(ca.ca_type), hw_ver=_text(ca.hw_ver), ports=tuple(ports),
        )  # fmt: skip
    finally:
        lib.umad_release_ca(ctypes.byref(ca))


def _be64(v: int) -> int:
    return int.from_bytes(v.to_bytes(8, "little"), "big")


def _be32(v: int) -> int:
    """``htonl``/``ntohl`` on this (little-endian) host, without importing ``socket``."""
    return int.from_bytes(v.to_bytes(4, "little"), "big")


def _be16(v: int) -> int:
    return int.from_bytes(v.to_bytes(2, "little"), "big")


def availability(ca_name: str, port_num: int = 1) -> str | None:
    """``None`` if MAD agents work for ``ca_name``, else the reason they do not.

    libibumad lists verbs devices whether or not the kernel's ``ib_umad`` serves
    them, so the test is opening (and closing) a port's umad descriptor.
    """
    try:
        cas = umad_cas()
    except UmadUnavailable as exc:
        return str(exc)
    if ca_name not in cas:
        return f"libibumad does not list {ca_name}"
    lib = load().lib
    portid = lib.umad_open_port(ca_name.encode(), port_num)
    if portid < 0:
        return (
            f"umad_open_port {ca_name} {port_num}: {os.strerror(-portid)} "
            "(is the ib_umad kernel module loaded? modprobe ib_umad)"
        )
    lib.umad_close_port(portid)
    return None


def _errno_error(rc: int, what: str) -> IbError:
    code = -rc if rc < 0 else ctypes.get_errno()
    text = f"{what}: {os.strerror(code)}"
    if code in (errno.EACCES, errno.EPERM):
        return InvalidPermission(text)
    if code == errno.EBUSY:
        return ResourceBusy(text)
    if code in (errno.ENOMEM, errno.ENOSPC, errno.EAGAIN):
        return InsufficientResources(text)
    if code == errno.ENODEV:
        return InvalidPort(text)
    return InvalidParameter(text)


@dataclass(eq=False)
class UmadAgent:
    """A registered agent: the contract's MAD-agent handle for this provider."""

    port: _Port
    agent_id: int
    spec: MadAgentSpec
    pending: dict[int, Any] = field(default_factory=dict)  # TID low 32 -> context
    alive: bool = True
    # Held while an upcall of this agent runs; unregister takes it after marking the
    # agent dead, so no upcall runs once it returns.
    upcall: threading.RLock = field(default_factory=threading.RLock)


@dataclass(eq=False)
class _Port:
    num: int
    portid: int
    fd: int
    agents: dict[int, UmadAgent] = field(default_factory=dict)
    ready: Any = None  # select.poll of this descriptor alone

    def __post_init__(self) -> None:
        self.ready = select.poll()
        self.ready.register(self.fd, select.POLLIN)


def _method_mask(methods: frozenset[int]) -> Any:
    mask = (ctypes.c_long * 2)()
    bits = 8 * ctypes.sizeof(ctypes.c_long)
    for m in methods:
        mask[m // bits] |= 1 << (m % bits)
    return mask


_shared: dict[str, UmadAgents] = {}
_shared_lock = threading.Lock()


def agents_for(ca_name: str) -> UmadAgents:
    """The agent table for a CA being opened: a new one, or under umad2sim the process's one.

    See the module docstring for why umad2sim needs one that never closes its ports.
    """
    if not under_umad2sim():
        return UmadAgents(ca_name)
    with _shared_lock:
        agents = _shared.get(ca_name)
        if agents is None:
            agents = _shared[ca_name] = UmadAgents(ca_name, keep_open=True)
        return agents


class UmadAgents:
    """The MAD agents of one CA: ports opened on first use, one receive thread.

    ``keep_open`` (umad2sim): :meth:`close` unregisters the agents but parks
    their kernel registrations and keeps the ports and the thread.
    """

    def __init__(self, ca_name: str, *, keep_open: bool = False) -> None:
        self.ca_name = ca_name
        self.keep_open = keep_open
        # (port, class, version, rmpp, OUI) -> umad agent ids registered but unused (keep_open)
        self._parked: dict[tuple[int, int, int, int, int], list[int]] = {}
        # The tables (ports, agents, pending TIDs): held briefly, never across an upcall
        # or a umad_send, so senders do not wait for the receive thread's dispatch.
        self._lock = threading.RLock()
        self._ports: dict[int, _Port] = {}
        # select.poll, not epoll: umad2sim (ibsim) intercepts poll() for its fake fds.
        self._poll = select.poll()
        self._by_fd: dict[int, _Port] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._poll.register(self._wake_r, select.POLLIN)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._rx = _Buffer()
        self._rx_at = ctypes.addressof(self._rx)
        self.dropped: dict[str, int] = {}
        self._tick: Callable[[], None] | None = None
        self._tick_every = 0.0
        self._next_tick = 0.0

    def set_tick(self, every: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the receive thread every ``every`` seconds, first at once.

        The thread runs while a port is open; ``fn`` runs without the agents'
        lock held and must not block (it may send: answers come on this thread).
        """
        with self._lock:
            self._tick, self._tick_every = fn, every
            self._next_tick = time.monotonic()
        os.write(self._wake_w, b"t")

    # ------------------------------------------------------------------ verbs
    def register(self, spec: MadAgentSpec) -> UmadAgent:
        smp = spec.mgmt_class in SMP_CLASSES
        if (spec.qp_num == 0) != smp:
            raise InvalidParameter(
                f"the kernel puts class 0x{spec.mgmt_class:02x} on QP{0 if smp else 1}"
            )
        lib = load().lib
        oui = spec.vendor_oui
        if oui not in (0, OPENIB_OUI) and spec.class_version != 1:
            # umad_register_oui has no version: libibumad registers version 1
            raise Unsupported(
                f"libibumad registers another vendor's class 0x{spec.mgmt_class:02x} "
                "at class version 1 only"
            )
        key = (spec.port_num, spec.mgmt_class, spec.class_version, spec.rmpp_version, oui)
        with self._lock:
            port = self._port(spec.port_num)
            # libibumad reports every refusal of the kernel as EPERM: a method another
            # agent of this process serves is told apart here, as the contract asks.
            for a in port.agents.values():
                other = a.spec
                if (other.qp_num, other.mgmt_class, other.class_version, other.vendor_oui) == (
                    spec.qp_num, spec.mgmt_class, spec.class_version, oui
                ) and other.methods & spec.methods:
                    raise ResourceBusy(
                        f"class 0x{spec.mgmt_class:02x} version {spec.class_version} methods "
                        f"{sorted(other.methods & spec.methods)} have an agent on this port"
                    )
            parked = self._parked.get(key)
            if parked:  # umad2sim: no new registration (it has 32 per device)
                rc = parked.pop()
            elif oui not in (0, OPENIB_OUI):  # umad_register uses OpenIB's OUI
                rc = lib.umad_register_oui(
                    port.portid, spec.mgmt_class, spec.rmpp_version,
                    (ctypes.c_uint8 * 3)(*oui.to_bytes(3, "big")), _method_mask(spec.methods),
                )
            else:
                rc = lib.umad_register(
                    port.portid, spec.mgmt_class, spec.class_version, spec.rmpp_version,
                    _method_mask(spec.methods),
                )
            if rc < 0:
                raise _errno_error(rc, f"umad_register class 0x{spec.mgmt_class:02x}")
            agent = UmadAgent(port, rc, spec)
            port.agents[rc] = agent
            return agent

    def send(self, agent: UmadAgent, send: MadSend) -> None:
        """Any thread; ``umad_send`` runs outside the agents' lock (the table is read under it)."""
        if not isinstance(agent, UmadAgent) or not agent.alive:
            raise InvalidHandle("MAD agent is not registered")
        mad = send.mad
        size = len(mad)  # > MAD_SIZE only for an RMPP agent's message (the AL checked)
        # umad_send writes agent, time-out, retries and length into the header itself:
        # the rest is the address, built once per address.
        buf = ctypes.create_string_buffer(_header(send.addr) + bytes(mad))
        waits = send.timeout_ms > 0 and not mad_is_response(mad)
        if waits:
            tid_low = int.from_bytes(mad[12:16], "big")
            with self._lock:
                if not agent.alive:
                    raise InvalidHandle("MAD agent is not registered")
                if tid_low in agent.pending:
                    raise InvalidParameter(f"a request with TID low 0x{tid_low:08x} is outstanding")
                agent.pending[tid_low] = send.context
            rc = load().send(agent.port.portid, agent.agent_id, buf, size, send.timeout_ms,
                             send.retries)  # fmt: skip
        else:
            rc = load().send(agent.port.portid, agent.agent_id, buf, size, 0, 0)
        if rc < 0:
            if waits:
                with self._lock:
                    if agent.pending.get(tid_low) is send.context:
                        del agent.pending[tid_low]
            raise _errno_error(rc, "umad_send")
        # On the sender's thread, without the upcall lock (two agents' upcalls sending
        # through each other could deadlock): only a send racing unregister sees it after.
        if not waits and agent.spec.send_cb is not None and agent.alive:
            agent.spec.send_cb(MadSendDone(send.context, WcStatus.SUCCESS))

    def send_many(self, agent: UmadAgent, sends: Sequence[MadSend]) -> int:
        """:meth:`send` for each in order: how many were sent (stops at the first failure,
        which raises only when it is the first)."""
        if not isinstance(agent, UmadAgent) or not agent.alive:
            raise InvalidHandle("MAD agent is not registered")
        umad_send = load().send
        portid, agent_id = agent.port.portid, agent.agent_id
        send_cb = agent.spec.send_cb
        buf = ctypes.create_string_buffer(_HDR_SIZE + MAD_SIZE)  # umad_send copies it
        last_addr, hdr = None, b""  # a window's MADs mostly share an address
        for n, send in enumerate(sends):
            mad = send.mad
            if send_cb is not None or (send.timeout_ms > 0 and not mad_is_response(mad)):
                try:  # a completion or a wait to record: the one-MAD path
                    self.send(agent, send)
                except IbError:
                    if n == 0:
                        raise
                    return n
                continue
            size = len(mad)
            if size > MAD_SIZE:  # an RMPP agent's message: a buffer of its own
                buf = ctypes.create_string_buffer(_HDR_SIZE + size)
            addr = send.addr
            if addr is not last_addr:
                hdr, last_addr = _header(addr), addr
            buf.raw = hdr + bytes(mad)
            rc = umad_send(portid, agent_id, buf, size, 0, 0)
            if rc < 0:
                if n == 0:
                    raise _errno_error(rc, "umad_send")
                return n
        return len(sends)

    def abandon(self, agent: UmadAgent, tid_low: int) -> None:
        """Stop waiting for the answer to a request (no completion follows).

        For callers that gave a request up themselves: under umad2sim there is
        no kernel MAD layer, so an unanswered request never times out.
        """
        with self._lock:
            agent.pending.pop(tid_low, None)

    def unregister(self, agent: UmadAgent) -> None:
        """Any thread, also the agent's own upcall; no upcall of it runs once this returns."""
        if not isinstance(agent, UmadAgent):
            raise InvalidHandle("not a MAD agent of this provider")
        lib = load().lib
        with self._lock:
            if not agent.alive:
                raise InvalidHandle("MAD agent is not registered")
            agent.alive = False
            agent.port.agents.pop(agent.agent_id, None)
            rc = 0
            if self.keep_open:
                self._park(agent)
            else:
                rc = lib.umad_unregister(agent.port.portid, agent.agent_id)
            canceled, agent.pending = list(agent.pending.values()), {}
        with agent.upcall:  # waits for an upcall under way on another thread
            if agent.spec.send_cb is not None:
                for ctx in canceled:
                    agent.spec.send_cb(MadSendDone(ctx, WcStatus.CANCELED))
        if rc < 0:
            log.warning("umad_unregister of agent %d failed: %s", agent.agent_id, -rc)

    def _park(self, agent: UmadAgent) -> None:
        s = agent.spec
        key = (s.port_num, s.mgmt_class, s.class_version, s.rmpp_version, s.vendor_oui)
        self._parked.setdefault(key, []).append(agent.agent_id)

    def close(self) -> None:
        """Stop the receive thread and close every port (CA closing).

        ``keep_open``: unregister (park) the agents, drop the periodic task,
        keep ports and thread for the next open.
        """
        if self.keep_open:
            with self._lock:
                self._tick = None
                live = [a for p in self._ports.values() for a in p.agents.values()]
            for a in live:
                self.unregister(a)
            return
        with self._lock:
            self._stopping = True
            ports, self._ports = list(self._ports.values()), {}
        os.write(self._wake_w, b"x")
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        lib = load().lib if ports else None
        for p in ports:
            for a in p.agents.values():
                a.alive = False
            if lib is not None:
                lib.umad_close_port(p.portid)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------------ ports
    def _port(self, num: int) -> _Port:
        port = self._ports.get(num)
        if port is not None:
            return port
        if self._stopping:
            raise InvalidHandle(f"{self.ca_name} is closing")
        lib = load().lib
        portid = lib.umad_open_port(self.ca_name.encode(), num)
        if portid < 0:
            raise _errno_error(portid, f"umad_open_port {self.ca_name} {num}")
        size = lib.umad_size()
        if size != ctypes.sizeof(_UserMad):
            lib.umad_close_port(portid)
            raise Unsupported(
                f"the kernel's umad header is {size} bytes, not {ctypes.sizeof(_UserMad)} "
                "(no P_Key index support: kernel too old)"
            )
        fd = lib.umad_get_fd(portid)
        port = _Port(num, portid, fd)
        self._ports[num] = port
        self._by_fd[fd] = port
        self._poll.register(fd, select.POLLIN)
        os.write(self._wake_w, b"p")  # a running poll() picks the new fd up
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"ibal-umad-{self.ca_name}", daemon=True
            )
            self._thread.start()
        return port

    # ------------------------------------------------------------------ receive
    def _run(self) -> None:
        while not self._stopping:
            # A timeout as well as the wake pipe: under umad2sim a pipe in the set does
            # not always end the wait.
            wait = _POLL_MS
            if self._tick is not None:
                due = int((self._next_tick - time.monotonic()) * 1000)
                wait = max(0, min(wait, due))
            for fd, _events in self._poll.poll(wait):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                    continue
                port = self._by_fd.get(fd)
                if port is not None:
                    self._read_one(port)
            tick = self._tick
            if tick is not None and time.monotonic() >= self._next_tick and not self._stopping:
                self._next_tick = time.monotonic() + self._tick_every
                try:
                    tick()
                except Exception:  # the watch must not end the receive thread
                    log.exception("umad %s: periodic task failed", self.ca_name)

    def _read_one(self, port: _Port) -> None:
        """The MADs waiting on ``port`` (poll() said readable): read them all, then upcall.

        Reading and the table look-ups run under the agents' lock, the upcalls
        after it, each under its agent's upcall lock, in arrival order.
        """
        recv_mad = load().recv
        length = ctypes.c_int(MAD_SIZE)
        rx0, rx0_ref, length_ref = self._rx, ctypes.byref(self._rx), ctypes.byref(length)
        batch: list[tuple[UmadAgent, MadSendDone | None, MadRecv | None]] = []
        with self._lock:
            for n in range(_BATCH):
                if self._stopping or self._ports.get(port.num) is not port:
                    break
                # umad_recv with no time-out read()s at once, and a kernel umad
                # descriptor blocks: after the first MAD, read only what poll() shows.
                if n and not port.ready.poll(0):
                    break
                length.value = MAD_SIZE
                rx = rx0
                rc = recv_mad(port.portid, rx0_ref, length_ref, 0)
                if rc == -errno.ENOSPC and MAD_SIZE < length.value <= MAX_RMPP_MESSAGE:
                    # A message the kernel reassembled (RMPP agent): it stays queued;
                    # read it again into a buffer of the length the kernel reported.
                    rx = _buffer(length.value)
                    rc = recv_mad(port.portid, ctypes.byref(rx), length_ref, 0)
                if rc < 0:
                    if -rc not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ETIMEDOUT):
                        self._count(f"recv_error_{-rc}")
                    break
                item = self._dispatch(port, rc, length.value, rx)
                if item is not None:
                    batch.append(item)
        run: list[MadRecv] = []  # consecutive MADs of one batch-taking agent
        for i, (agent, done, recv) in enumerate(batch):
            if done is None and recv is not None and agent.spec.recv_batch_cb is not None:
                run.append(recv)
                if i + 1 < len(batch) and batch[i + 1][0] is agent and batch[i + 1][1] is None:
                    continue
                with agent.upcall:
                    if agent.alive:
                        agent.spec.recv_batch_cb(run)
                run = []
                continue
            with agent.upcall:
                if not agent.alive:
                    continue
                if done is not None and agent.spec.send_cb is not None:
                    agent.spec.send_cb(done)
                if recv is not None:
                    agent.spec.recv_cb(recv)

    def _count(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _dispatch(
        self, port: _Port, agent_id: int, length: int, rx: Any
    ) -> tuple[UmadAgent, MadSendDone | None, MadRecv | None] | None:
        """One MAD from the kernel (under the lock): what to hand its agent, or None."""
        agent = port.agents.get(agent_id)
        if agent is None or not agent.alive:
            self._count("unknown_agent")
            return None
        if length < MAD_HEADER_SIZE:
            self._count("short")
            return None
        # The kernel always hands over 256 bytes; umad2sim hands over what the sender
        # wrote (OpenSM writes an SA Get response without its zero tail): pad it.
        # A reassembled RMPP message (an agent with rmpp_version) is longer: kept whole.
        keep = length if length > MAD_SIZE and agent.spec.rmpp_version else MAD_SIZE
        raw = ctypes.string_at(
            self._rx_at if rx is self._rx else ctypes.addressof(rx), _HDR_SIZE + min(length, keep)
        )
        mad = raw[_HDR_SIZE:]
        if len(mad) < MAD_SIZE and not (agent.spec.rmpp_version and _rmpp_active(mad)):
            mad = mad.ljust(MAD_SIZE, b"\0")
        # else: a whole RMPP transfer in one short MAD (umad2sim: OpenSM leaves the RMPP
        # header to the kernel, so its length is the only sign the transfer is complete)
        if raw[_STATUS_OFF:_STATUS_END] != _NO_STATUS:  # our request came back unanswered
            ctx = agent.pending.pop(int.from_bytes(mad[12:16], "big"), None)
            return agent, MadSendDone(ctx, WcStatus.TIMEOUT_RETRY_ERR), None
        qpn = 0 if mad[1] in SMP_CLASSES else 1
        # The kernel leaves the Q_Key out; a MAD to QP1 always carries the GSI one.
        recv = MadRecv(mad, _recv_addr(raw[_ADDR_OFF:_ADDR_END], qpn), port.num, qpn)
        done = None
        pending = agent.pending
        if pending and mad_is_response(mad):  # an answer to a waiting request: send first
            tid_low = int.from_bytes(mad[12:16], "big")
            if tid_low in pending:
                done = MadSendDone(pending.pop(tid_low), WcStatus.SUCCESS)
        return agent, done, recv


def _rmpp_active(mad: bytes) -> bool:
    """The RMPP Active flag (byte 26 bit 0) of a MAD long enough to have the header."""
    return len(mad) > 36 and bool(mad[26] & 1)


# by identity (the entry holds the frozen MadAddr, so its id is not reused)
_headers: dict[int, tuple[MadAddr, bytes]] = {}
_HDR_SIZE = ctypes.sizeof(_UserMad)
_ADDR_OFF = _UserMad.addr.offset
_ADDR_END = _ADDR_OFF + ctypes.sizeof(_MadAddr)
_STATUS_OFF = _UserMad.status.offset
_STATUS_END = _STATUS_OFF + 4
_NO_STATUS = bytes(4)


def _header(addr: MadAddr) -> bytes:
    """An ``ib_user_mad`` header addressed to ``addr`` (cached: a sweep sends thousands
    of MADs to one address object)."""
    got = _headers.get(id(addr))
    if got is not None and got[0] is addr:
        return got[1]
    hdr = _UserMad()
    _fill_addr(hdr.addr, addr)
    if len(_headers) >= 1024:
        _headers.clear()
    raw = bytes(hdr)
    _headers[id(addr)] = (addr, raw)
    return raw


_addrs: tuple[dict[bytes, MadAddr], dict[bytes, MadAddr]] = ({}, {})  # by QP


def _recv_addr(raw: bytes, qpn: int) -> MadAddr:
    """The sender's address from a received header's ``ib_mad_addr`` bytes (cached);
    ``qpn`` says which Q_Key it carries (the kernel leaves it out)."""
    cache = _addrs[qpn]
    addr = cache.get(raw)
    if addr is None:
        a = _MadAddr.from_buffer_copy(raw)
        addr = replace(_read_addr(a), remote_qkey=QP1_WELL_KNOWN_QKEY if qpn else 0)
        if len(cache) >= 4096:
            cache.clear()
        cache[raw] = addr
    return addr


def _fill_addr(a: _MadAddr, addr: MadAddr) -> None:
    a.qpn = _be32(addr.remote_qp)
    a.qkey = _be32(addr.remote_qkey)
    a.lid = _be16(addr.dlid)
    a.sl = addr.sl
    a.path_bits = addr.path_bits
    a.pkey_index = addr.pkey_index
    grh = addr.grh
    if grh is not None:
        a.grh_present = 1
        a.gid_index = grh.sgid_index
        a.hop_limit = grh.hop_limit
        a.traffic_class = grh.traffic_class
        a.flow_label = _be32(grh.flow_label)
        ctypes.memmove(a.gid, grh.dgid.packed, 16)


def _read_addr(a: _MadAddr) -> MadAddr:
    grh = None
    if a.grh_present:
        grh = Grh(
            dgid=Gid(bytes(a.gid)),
            sgid_index=a.gid_index,
            flow_label=_be32(a.flow_label) & 0xFFFFF,
            hop_limit=a.hop_limit,
            traffic_class=a.traffic_class,
        )
    return MadAddr(
        remote_qp=_be32(a.qpn) & 0xFFFFFF,
        remote_qkey=_be32(a.qkey),
        dlid=_be16(a.lid),
        sl=a.sl,
        path_bits=a.path_bits,
        pkey_index=a.pkey_index,
        grh=grh,
    )


class AgentVerbs:
    """``send_mad``, ``send_mad_many`` and ``unregister_mad_agent`` of both CA kinds
    (verbs and MAD-only), over the CA's agent table (``None``: none, or closed)."""

    def _agent_table(self) -> UmadAgents | None:
        raise NotImplementedError

    def send_mad(self, h_agent: object, send: MadSend) -> None:
        agents, agent = agent_of(self._agent_table(), h_agent)
        agents.send(agent, send)

    def send_mad_many(self, h_agent: object, sends: Sequence[MadSend]) -> int:
        agents, agent = agent_of(self._agent_table(), h_agent)
        return agents.send_many(agent, sends)

    def unregister_mad_agent(self, h_agent: object) -> None:
        agents, agent = agent_of(self._agent_table(), h_agent)
        agents.unregister(agent)


def agent_of(agents: UmadAgents | None, h_agent: object) -> tuple[UmadAgents, UmadAgent]:
    """``h_agent`` with the agent table of the CA it must belong to.

    Both CA kinds (verbs and MAD-only) answer ``send_mad`` and
    ``unregister_mad_agent`` through this; raises ``InvalidHandle`` when the
    CA has no agents or ``h_agent`` is not one.
    """
    if agents is None or not isinstance(h_agent, UmadAgent):
        raise InvalidHandle("not a MAD agent of this CA")
    return agents, h_agent


__all__ = [
    "AgentVerbs",
    "UmadAgent",
    "UmadAgents",
    "UmadCaInfo",
    "UmadPortInfo",
    "UmadUnavailable",
    "agent_of",
    "agents_for",
    "availability",
    "ca_info",
    "load",
    "umad_cas",
    "under_umad2sim",
]
