"""ibsim's SM flag for a port of this process, so QP0/QP1 requests reach it under umad2sim.

ibsim hands a QP0/QP1 *request* (an SA Report, a CM or DM request) only to
the client holding the SM flag at the destination port (``find_client`` in
ibsim's ibsim.c: "zero qp - only issm clients may get requests"); umad2sim
sets that flag when its issm device is opened, as ``opensm`` does.
:func:`hold_sm_flag` takes it for a port of an ``ibsim0`` CA opened by this
process (which runs under umad2sim: :meth:`ibal.testing.ibsim.Fabric.env_for`).

Side effects, all handled here (read in ibsim 0.10-0.12's ibsim.c and umad2sim.c):

- the port's PortInfo gets the IsSM capability bit, so OpenSM sends it
  SubnGet(SMInfo) in its sweeps and, with no MAD time-outs under umad2sim,
  would wait for the answer for ever, its sweeps stalled.  The flag's agents
  (classes 0x01 and 0x81 on the port's QP0 alias) answer as a NOT_ACTIVE SM
  with SM_Key 0 (IBA 14.4.1: the key is shown only to a requester that gave
  it; OpenSM's Get gives none): OpenSM logs "ERR 2F18 ... doesn't match our
  local sm_key. Ignoring SMInfo" and goes on, its sweep complete;
- umad2sim dereferences a NULL queue (the process dies) when a request of a
  class nobody in the process registered arrives: those agents are
  registered *before* the flag is taken, and requests of any other class
  sent to the port need an agent in this process for the same reason;
- Python's ``os.open`` calls ``open64``, which umad2sim does not wrap: the
  device is opened through libc's ``open`` (ctypes), and closed through its
  ``close`` (which clears the flag).

The flag is a :class:`~ibal.al.Dependent` of the CA: closing the CA or the
AL gives it back before its agents go, so OpenSM is not left polling a port
whose SMInfo nobody answers (a poll already on its way then can still stall
one sweep: release the flag before ending the fabric's clients).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

from ibal.al import Ca, Dependent
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.status import IbError, InvalidPort
from ibal.types import QpType
from ibal.wire.mad import header, smp
from ibal.wire.mad.consts import MAD_SIZE, Method, MgmtClass, SmpAttr

__all__ = ["ISSM_DEVICE", "SmFlag", "hold_sm_flag"]

ISSM_DEVICE = "/dev/infiniband/issm0"
"""umad2sim's SM-flag device of its CA ``ibsim0``."""


class SmFlag(Dependent):
    """ibsim's SM flag held for one port (module docstring)."""

    _kind = "ibsim SM flag"

    def __init__(self, ca: Ca, port_num: int) -> None:
        self.port_guid = ca.query_port(port_num).port_guid
        self.answered = 0
        """SubnGet(SMInfo) requests answered (OpenSM polls a port with IsSM set)."""
        self.services: list[MadService] = []
        self._fd: int | None = None
        self._libc: Any = None
        super().__init__(ca)

    def _register(self, ca: Ca) -> None:
        alias = ca.alloc_pd().get_spl_qp(self.port_guid, QpType.QP0_ALIAS)
        for cls in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR):
            self.services.append(reg_mad_svc(alias, MadSvc(
                cls, 1, self._on_smp, put_mad, methods=frozenset({Method.GET}),
                support_unsol=True,
            )))  # fmt: skip

    def _take(self, device: str) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.open(device.encode(), os.O_RDWR)
        if fd < 0:
            raise InvalidPort(f"cannot open {device} (not under umad2sim?): "
                              f"{os.strerror(ctypes.get_errno())}")  # fmt: skip
        self._fd = fd

    def _on_smp(self, e: MadElement) -> None:
        """A QP0 request to the port (misc queue): SMInfo Get gets a NOT_ACTIVE SM's answer."""
        mad = bytes(e.mad[:MAD_SIZE])
        h = header.header(mad)
        svc = next((s for s in self.services if s.svc.mgmt_class == h.mgmt_class), None)
        if h.method != Method.GET or h.attr_id != SmpAttr.SM_INFO or svc is None:
            put_mad(e)
            return
        data = smp.SM_INFO.encode(guid=self.port_guid, sm_state=smp.SmState.NOT_ACTIVE)
        e.mad[:MAD_SIZE] = header.respond(mad, data=data)
        e.resp_expected = False
        try:
            svc.send(e)
        except IbError:
            put_mad(e)
            return
        self.answered += 1

    def release(self) -> None:
        """Give the flag back now (umad2sim clears IsSM); its agents go after it."""
        self.destroy()

    def on_destroying(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._libc.close(fd)
        services, self.services = self.services, []
        for s in services:
            with contextlib.suppress(IbError):
                s.deregister()

    def __enter__(self) -> SmFlag:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive:
            self.release()


def hold_sm_flag(ca: Ca, port_num: int = 1, *, device: str = ISSM_DEVICE) -> SmFlag:
    """Take ibsim's SM flag for ``ca``'s port ``port_num`` (module docstring).

    ``InvalidPort`` when the device cannot be opened (not under umad2sim).
    """
    flag = SmFlag(ca, port_num)
    try:
        flag._register(ca)
        flag._take(device)
    except BaseException:
        flag.destroy()
        raise
    return flag
