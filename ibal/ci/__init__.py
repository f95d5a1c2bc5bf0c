"""The provider contract (`ib_ci.h`): what a provider implements and how it is found."""

from ibal.ci.hookspecs import ENTRY_POINT_GROUP, hookimpl, hookspec
from ibal.ci.interface import (
    KNOWN_DEVIATIONS,
    MANDATORY_VERBS,
    AsyncEventCallback,
    Capabilities,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
    Handle,
    MwCreated,
    QpCreated,
    SrqCreated,
)
from ibal.ci.manager import DISABLED_ENV, ProviderLoadError, ProviderManager
from ibal.ci.provider import CaRegistrar, Provider, ProviderFactory, ProviderRegistry, ProviderSpec

__all__ = [
    "DISABLED_ENV",
    "ENTRY_POINT_GROUP",
    "KNOWN_DEVIATIONS",
    "MANDATORY_VERBS",
    "AsyncEventCallback",
    "CaRegistrar",
    "Capabilities",
    "ChannelInterface",
    "CompletionCallback",
    "CqCreated",
    "Handle",
    "MwCreated",
    "Provider",
    "ProviderFactory",
    "ProviderLoadError",
    "ProviderManager",
    "ProviderRegistry",
    "ProviderSpec",
    "QpCreated",
    "SrqCreated",
    "hookimpl",
    "hookspec",
]
