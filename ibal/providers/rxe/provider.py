"""The rxe provider: creates the configured devices and announces each as a CA.

Devices come from the ``devices`` option (``"rxe0=127.0.0.2,rxe1=lo"`` or a
list of such items), else from ``IBAL_RXE_DEVICES`` or the config file
(:func:`~ibal.providers.rxe.device.startup_specs`).  Unlike kernel rxe's
``rdma link add``, nothing is created by default: without configuration the
provider registers no CA and says why (``unavailable_reason``).  Devices
added or removed later through :attr:`RxeProvider.registry` are registered
and withdrawn as they come and go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ibal.ci import CaRegistrar, Provider
from ibal.providers.rxe.settings import ENV_DEVICES, configured
from ibal.status import InvalidParameter, InvalidState

if TYPE_CHECKING:
    from ibal.providers.rxe.ca import RxeCa
    from ibal.providers.rxe.device import Device, DeviceSpec, Registry

OPTIONS = frozenset({"devices", "rx_mode"})
NOT_CONFIGURED = (
    f"no rxe device configured: set {ENV_DEVICES} (for example rxe0=lo or "
    "rxe0=127.0.0.2), write the config file, or give the provider option devices=..."
)


def _specs(options: Mapping[str, Any]) -> list[DeviceSpec] | None:
    """The devices to create, or None when nothing is configured.

    The device modules are imported only when there are devices (see ``settings``).
    """
    given = options.get("devices")
    if given is None and not configured():
        return None
    from ibal.providers.rxe.device import ConfigError, DeviceSpec, parse_devices, startup_specs

    try:
        if given is not None:
            text = ",".join(given) if isinstance(given, (list, tuple)) else str(given)
            specs = parse_devices(text)
        else:
            specs = startup_specs()
    except ConfigError as e:
        raise InvalidParameter(str(e)) from None
    mode = options.get("rx_mode")
    if mode is not None:
        if mode not in ("raw", "udp"):
            raise InvalidParameter(f"rx_mode must be raw or udp, not {mode!r}")
        specs = [DeviceSpec(s.name, s.netdev, s.address, mode, s.capture, s.port) for s in specs]
    return specs


class RxeProvider(Provider):
    """rxe devices as CAs."""

    name = "rxe"

    def __init__(self, options: Mapping[str, Any]) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise InvalidParameter(
                f"unknown option(s) {', '.join(sorted(unknown))}; rxe takes: "
                + ", ".join(sorted(OPTIONS))
            )
        self._specs = _specs(options)
        self._explicit = options.get("devices") is not None
        self._registrar: CaRegistrar | None = None
        self._cas: dict[str, RxeCa] = {}
        self.registry: Registry | None = None

    @property
    def cas(self) -> list[RxeCa]:
        return list(self._cas.values())

    def start(self, registrar: CaRegistrar) -> None:
        if self._registrar is not None:
            raise InvalidState("the rxe provider is already started")
        self._registrar = registrar
        if not self._specs:
            self.unavailable_reason = NOT_CONFIGURED
            return
        from ibal.providers.rxe.device import Registry

        self.registry = Registry(self._added, self._removed)
        errors, refused = [], []
        for spec in self._specs:
            try:
                self.registry.create(spec)
            except KeyError as e:
                refused.append(f"{spec.name}: no local interface has the address or name {e}")
            except ValueError as e:
                refused.append(f"{spec.name}: {e}")
            except OSError as e:  # the host's state (a port in use), not the option's fault
                errors.append(f"{spec.name}: {e}")
        if errors or refused:
            self.unavailable_reason = "; ".join(refused + errors)
        if refused and self._explicit:
            # devices the caller named must be possible (docs/api.md: open_al raises); ones
            # from the environment or the config file only make the provider unavailable
            raise InvalidParameter(f"rxe devices option: {'; '.join(refused)}")

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.close()
            self.registry = None
        self._registrar = None

    def _added(self, dev: Device) -> None:
        from ibal.providers.rxe.ca import RxeCa

        ca = RxeCa(dev)
        self._cas[dev.name] = ca
        if self._registrar is not None:
            self._registrar.register_ca(ca)

    def _removed(self, dev: Device) -> None:
        ca = self._cas.pop(dev.name, None)
        if ca is None:
            return
        try:
            if self._registrar is not None:
                self._registrar.deregister_ca(ca.guid)
        finally:
            ca.shutdown()
