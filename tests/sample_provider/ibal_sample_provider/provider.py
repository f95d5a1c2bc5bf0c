"""The provider: finds the devices and announces each as a CA.

ibal makes a :class:`SampleProvider` from options (``ibal devices -p sample -o guid=...``,
``open_al(providers={"sample": {...}})``), then calls :meth:`start` with a
registrar, the access layer's side of ``ib_register_ca``/``ib_deregister_ca``.
A real driver enumerates its adapters in ``start`` (PCI, sysfs, a vendor
library) and sets ``unavailable_reason`` when it finds none; the sample always
has its one loopback CA.

CAs may come and go while the provider runs (hot-plug): :meth:`plug` and
:meth:`unplug` are what a driver's device-arrival and device-removal handlers
would call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci import CaRegistrar, Provider
from ibal.status import InvalidParameter, InvalidState

from ibal_sample_provider.ca import SampleCa

DEFAULT_GUID = 0x0200_00FF_FE5A_0000
"""Made up; bit 0x02 of the first byte marks an EUI-64 as locally administered,
so it cannot clash with a vendor's.  A driver reads the GUID from the adapter."""

OPTIONS = frozenset({"guid"})


class SampleProvider(Provider):
    """The loopback HCA's provider: one CA, ``sample0``."""

    name = "sample"

    def __init__(self, options: Mapping[str, Any]) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise InvalidParameter(
                f"unknown option(s) {', '.join(sorted(unknown))}; the sample takes: guid"
            )
        guid = options.get("guid", DEFAULT_GUID)
        self.guid = int(guid, 0) if isinstance(guid, str) else int(guid)
        self._registrar: CaRegistrar | None = None
        self._ca: SampleCa | None = None

    @property
    def ca(self) -> SampleCa | None:
        """The CA while it is registered."""
        return self._ca

    def start(self, registrar: CaRegistrar) -> None:
        self._registrar = registrar
        self.plug()

    def stop(self) -> None:
        self.unplug()
        self._registrar = None

    def plug(self) -> None:
        """The device appears: announce a fresh CA (nothing if it is already there)."""
        if self._registrar is None:
            raise InvalidState("the provider is not started")
        if self._ca is None:
            ca = SampleCa(self.guid)
            # The access layer may open and query the CA before this returns,
            # so the CA must be ready for every verb first.
            self._registrar.register_ca(ca)
            self._ca = ca

    def unplug(self) -> None:
        """The device goes away: the access layer tears down every resource on it,
        then calls ``close_ca``, before ``deregister_ca`` returns."""
        if self._ca is not None and self._registrar is not None:
            ca, self._ca = self._ca, None
            self._registrar.deregister_ca(ca.guid)
