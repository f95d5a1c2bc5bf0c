"""The mock provider: an in-process InfiniBand fabric with deterministic fault injection.

>>> from ibal.providers.mock import MockFabric
>>> fabric = MockFabric(seed=1)
>>> a, b = fabric.add_ca(), fabric.add_ca()
>>> fabric.faults.drop(nth=3)          # lose the third packet on the fabric
<PacketRule drop matched=0 fired=0>

See docs/mock-provider.md.
"""

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
