"""The mock provider: an in-process InfiniBand fabric with deterministic fault injection.

>>> from ibal.providers.mock import MockFabric
>>> fabric = MockFabric(seed=1)
>>> a, b = fabric.add_ca(), fabric.add_ca()
>>> fabric.faults.drop(nth=3)          # lose the third packet on the fabric
<PacketRule drop matched=0 fired=0>

See docs/mock-provider.md.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.providers.mock.ca import CaLimits, MockCa
    from ibal.providers.mock.engine import FabricCounters
    from ibal.providers.mock.fabric import MockFabric
    from ibal.providers.mock.faults import FaultPlan, PacketRule, VerbFault
    from ibal.providers.mock.objects import (
        MockAv,
        MockCq,
        MockMcast,
        MockMr,
        MockMw,
        MockPd,
        MockQp,
        MockSrq,
        OpenCa,
    )
    from ibal.providers.mock.packets import NakCode, Packet, PacketOp
    from ibal.providers.mock.provider import MockProvider
    from ibal.providers.mock.topology import Link, MockPort, Switch

# Imported on first use: the plugin module (``ibal.providers.mock.plugin``) lives in
# this package, and the provider manager imports it to read the provider's spec
# (``simulated``) whenever the default providers start (~15 ms for the whole mock).
_EXPORTS = {
    "CaLimits": "ibal.providers.mock.ca",
    "FabricCounters": "ibal.providers.mock.engine",
    "FaultPlan": "ibal.providers.mock.faults",
    "Link": "ibal.providers.mock.topology",
    "MockAv": "ibal.providers.mock.objects",
    "MockCa": "ibal.providers.mock.ca",
    "MockCq": "ibal.providers.mock.objects",
    "MockFabric": "ibal.providers.mock.fabric",
    "MockMcast": "ibal.providers.mock.objects",
    "MockMr": "ibal.providers.mock.objects",
    "MockMw": "ibal.providers.mock.objects",
    "MockPd": "ibal.providers.mock.objects",
    "MockPort": "ibal.providers.mock.topology",
    "MockProvider": "ibal.providers.mock.provider",
    "MockQp": "ibal.providers.mock.objects",
    "MockSrq": "ibal.providers.mock.objects",
    "NakCode": "ibal.providers.mock.packets",
    "OpenCa": "ibal.providers.mock.objects",
    "Packet": "ibal.providers.mock.packets",
    "PacketOp": "ibal.providers.mock.packets",
    "PacketRule": "ibal.providers.mock.faults",
    "Switch": "ibal.providers.mock.topology",
    "VerbFault": "ibal.providers.mock.faults",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CaLimits",
    "FabricCounters",
    "FaultPlan",
    "Link",
    "MockAv",
    "MockCa",
    "MockCq",
    "MockFabric",
    "MockMcast",
    "MockMr",
    "MockMw",
    "MockPd",
    "MockPort",
    "MockProvider",
    "MockQp",
    "MockSrq",
    "NakCode",
    "OpenCa",
    "Packet",
    "PacketOp",
    "PacketRule",
    "Switch",
    "VerbFault",
]
