"""The ``rdma_core`` provider: one CA per rdma-core device, through pyverbs.

Options (``mgr.start_provider("rdma_core", {...})``):

* ``devices``: a list of device names to use (default: every device);
* ``mad_only``: register a MAD-only CA (:mod:`.umad_ca`) for each libibumad
  CA without a verbs device, e.g. ``ibsim0`` under umad2sim (default true);
* ``watch_interval``: seconds between two looks of a MAD-only CA at its
  ports' PortInfo (default 1.0).

``start()`` imports pyverbs lazily.  Without pyverbs or without a device it
registers no verbs CA; with no CA at all it sets ``unavailable_reason``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibal.ci.provider import CaRegistrar, Provider
from ibal.providers.rdma_core import loader, umad
from ibal.providers.rdma_core.umad_ca import WATCH_INTERVAL, UmadCa
from ibal.status import IbError, NotFound

if TYPE_CHECKING:  # the verbs CA is imported where sysfs shows a verbs device (~6 ms)
    from ibal.providers.rdma_core.ca import RdmaCoreCa

log = logging.getLogger("ibal.providers.rdma_core")


_MODULES = ("device", "pd", "cq", "qp", "srq", "mr", "wr", "addr", "base", "enums", "pyverbs_error")


class _Pyverbs:
    """The pyverbs modules the CA uses, as attributes (``pv.qp.QP``, ...)."""

    device: Any
    pd: Any
    cq: Any
    qp: Any
    srq: Any
    mr: Any
    wr: Any
    addr: Any
    base: Any
    enums: Any
    pyverbs_error: Any

    def __init__(self, root: Any) -> None:
        for sub in _MODULES:
            setattr(self, sub, importlib.import_module(f"pyverbs.{sub}"))
        self.root = root


class RdmaCoreProvider(Provider):
    """Real HCAs and kernel soft-RoCE (rdma_rxe) through Debian's pyverbs."""

    name = "rdma_core"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        unknown = set(self.options) - {"devices", "mad_only", "watch_interval"}
        if unknown:
            raise ValueError(f"unknown rdma_core options: {', '.join(sorted(unknown))}")
        self.cas: list[RdmaCoreCa] = []
        self.mad_only_cas: list[UmadCa] = []
        self.skipped: dict[str, str] = {}
        self._registrar: CaRegistrar | None = None
        self._registered: list[int] = []

    def start(self, registrar: CaRegistrar) -> None:
        self._registrar = registrar
        self.unavailable_reason = None
        # No uverbs device in sysfs (ibsim, a host without RDMA): pyverbs (~0.15 s to
        # import) is asked only if no MAD-only CA turns up either, for the reason.
        sysfs = _sysfs_verbs_devices()
        verbs_names, why_not = self._start_verbs(registrar) if sysfs else (set(), None)
        if self.options.get("mad_only", True):
            # sysfs too: without pyverbs a verbs device must not become a MAD-only CA.
            self._start_mad_only(registrar, verbs_names | sysfs)
        if not self.cas and not self.mad_only_cas:
            if not sysfs:
                _, why_not = self._start_verbs(registrar)
            self.unavailable_reason = why_not

    def _start_verbs(self, registrar: CaRegistrar) -> tuple[set[str], str | None]:
        """The verbs devices: their names, and why none was registered (if none was)."""
        try:
            root = loader.load()
        except ImportError as exc:
            return set(), f"pyverbs not importable: {exc}"
        from ibal.providers.rdma_core import peek
        from ibal.providers.rdma_core.ca import RdmaCoreCa
        from ibal.providers.rdma_core.fastpath import OpsUnavailable

        pv = _Pyverbs(root)
        errs = pv.pyverbs_error
        try:
            devices = pv.device.get_device_list()
        except errs.PyverbsError as exc:
            return set(), f"no RDMA device ({exc})"
        wanted = self.options.get("devices")
        names = [(_name(d), int(d.guid)) for d in devices]
        all_names = {n for n, _ in names}
        if wanted is not None:
            names = [(n, g) for n, g in names if n in set(wanted)]
        if not names:
            return all_names, (
                "no RDMA device (ibv_get_device_list returned none"
                + (f" of {', '.join(wanted)}" if wanted else "")
                + ")"
            )
        try:
            layout: peek.Layout | None = peek.Layout(pv.base)
        except peek.PeekError as exc:
            log.warning("rdma_core: pyverbs layout not recognised (%s); events disabled", exc)
            layout = None
        for name, guid in names:
            if not guid:
                self.skipped[name] = "node GUID is zero"
                continue
            try:
                ci = RdmaCoreCa(pv, name, guid, layout=layout)
            except (errs.PyverbsError, OpsUnavailable) as exc:
                self.skipped[name] = f"cannot open: {exc}"
                continue
            try:
                registrar.register_ca(ci)
            except IbError as exc:
                self.skipped[name] = f"not registered: {exc}"
                ci.release()
                continue
            self.cas.append(ci)
            self._registered.append(guid)
        if self.cas:
            return all_names, None
        return all_names, (
            "no usable RDMA device ("
            + "; ".join(f"{n}: {why}" for n, why in self.skipped.items())
            + ")"
        )

    def _start_mad_only(self, registrar: CaRegistrar, verbs_names: set[str]) -> None:
        """A MAD-only CA for each libibumad CA that is not a verbs device."""
        try:
            names = umad.umad_cas()
        except umad.UmadUnavailable as exc:
            log.debug("rdma_core: no MAD-only CAs: %s", exc)
            return
        wanted = self.options.get("devices")
        interval = float(self.options.get("watch_interval", WATCH_INTERVAL))
        for name in names:
            if name in verbs_names or (wanted is not None and name not in set(wanted)):
                continue
            try:
                info = umad.ca_info(name)
            except IbError as exc:
                self.skipped[name] = f"umad_get_ca: {exc}"
                continue
            if not info.node_guid or not info.ports:
                self.skipped[name] = "no node GUID or no port (umad)"
                continue
            ci = UmadCa(info, watch_interval=interval)
            try:
                registrar.register_ca(ci)
            except IbError as exc:
                self.skipped[name] = f"not registered: {exc}"
                continue
            self.mad_only_cas.append(ci)
            self._registered.append(ci.guid)

    def stop(self) -> None:
        registrar = self._registrar
        for guid in reversed(self._registered):
            if registrar is not None:
                try:
                    registrar.deregister_ca(guid)
                except NotFound:
                    pass
                except IbError as exc:
                    log.warning("rdma_core: deregistering %016x failed: %s", guid, exc)
        self._registered.clear()
        for ci in self.cas:
            ci.release()
        self.cas.clear()
        self.mad_only_cas.clear()


def _sysfs_verbs_devices(root: Path = Path("/sys/class/infiniband_verbs")) -> set[str]:
    """The devices the kernel serves through uverbs (``uverbsN/ibdev``)."""
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            with contextlib.suppress(OSError):
                names.add((entry / "ibdev").read_text().strip())
    return names


def _name(device: Any) -> str:
    n = device.name
    return n.decode() if isinstance(n, bytes) else str(n)
