"""``MockProvider``: the mock fabric as a provider plugin."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci.provider import CaRegistrar, Provider
from ibal.providers.mock.fabric import MockFabric
from ibal.status import InvalidParameter


class MockProvider(Provider):
    """Registers the CAs of a :class:`MockFabric`.

    ``options`` build the fabric (``{"cas": 2, "ports": 1, "seed": 0, ...}``,
    see docs/mock-provider.md) or hand one in: ``{"fabric": fabric}``.  A
    fabric the provider built is closed by ``stop``; one handed in is not.
    """

    name = "mock"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        fabric = opts.pop("fabric", None)
        if fabric is not None:
            if not isinstance(fabric, MockFabric):
                raise InvalidParameter(f"'fabric' must be a MockFabric, not {fabric!r}")
            if opts:
                raise InvalidParameter(f"options {sorted(opts)} conflict with 'fabric'")
            self._own = False
        else:
            fabric = MockFabric.from_options(opts)
            self._own = True
        self.fabric: MockFabric = fabric
        self.unavailable_reason = None

    def start(self, registrar: CaRegistrar) -> None:
        self.fabric.attach(registrar)

    def stop(self) -> None:
        self.fabric.detach()
        if self._own:
            self.fabric.close()
