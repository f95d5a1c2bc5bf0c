"""Finding providers: entry points read without importing, plugins loaded on demand.

A provider module is imported only when it is asked for, so a missing
``pyverbs`` cannot break the mock provider.  ``IBAL_DISABLED_PROVIDERS``
(comma-separated names) blocks providers, as pytest's ``-p no:`` does.
"""

from __future__ import annotations

import os
from typing import Any

import pluggy

from ibal.ci import entrypoints
from ibal.ci.hookspecs import ENTRY_POINT_GROUP, PROJECT, ProviderHookSpecs
from ibal.ci.provider import Provider, ProviderRegistry, ProviderSpec
from ibal.status import NotFound, Unsupported

DISABLED_ENV = "IBAL_DISABLED_PROVIDERS"


class ProviderLoadError(Unsupported):
    """A provider's plugin could not be imported or did not register itself."""


class ProviderManager:
    """Discovers provider plugins and makes :class:`Provider` instances."""

    def __init__(self, *, use_entry_points: bool = True, blocked: set[str] | None = None) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(ProviderHookSpecs)
        self._registry = ProviderRegistry()
        self._use_entry_points = use_entry_points
        env = os.environ.get(DISABLED_ENV, "")
        self.blocked = {n.strip() for n in env.split(",") if n.strip()} | (blocked or set())
        self._loaded_eps: set[str] = set()
        self._eps: dict[str, entrypoints.EntryPoint] | None = None

    def _entry_points(self) -> dict[str, entrypoints.EntryPoint]:
        # Read once per manager: entry_points() scans every installed distribution's
        # metadata (~30 ms each time here), and starting the defaults asks per provider.
        if not self._use_entry_points:
            return {}
        if self._eps is None:
            self._eps = {ep.name: ep for ep in entrypoints.group(ENTRY_POINT_GROUP)}
        return self._eps

    def names(self) -> list[str]:
        """Every provider name known, without importing any plugin."""
        names = set(self._entry_points()) | {s.name for s in self._registry.specs()}
        return sorted(names - self.blocked)

    def add_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register an in-process plugin (an object or module with the hook)."""
        self._pm.register(plugin, name=name)  # validates the hookimpl's signature
        _call_one(plugin, self._registry)

    def spec(self, name: str) -> ProviderSpec:
        """The spec of provider ``name``, importing its plugin if needed."""
        if name in self.blocked:
            raise NotFound(f"provider {name!r} is disabled by {DISABLED_ENV}")
        found = self._registry.get(name)
        if found is not None:
            return found
        ep = self._entry_points().get(name)
        if ep is None:
            raise NotFound(f"no provider called {name!r} (known: {', '.join(self.names())})")
        if name not in self._loaded_eps:
            try:
                plugin = ep.load()
            except Exception as exc:  # an optional dependency missing, typically
                raise ProviderLoadError(f"provider {name!r} failed to load: {exc}") from exc
            self._loaded_eps.add(name)
            if not self._pm.is_registered(plugin):
                self.add_plugin(plugin, name=f"ep:{name}")
        found = self._registry.get(name)
        if found is None:
            raise ProviderLoadError(f"entry point {name!r} did not register a provider {name!r}")
        return found

    def create(self, name: str, options: dict[str, Any] | None = None) -> Provider:
        """A new instance of provider ``name``."""
        provider = self.spec(name).factory(options or {})
        if not provider.name:
            provider.name = name
        return provider


def _call_one(plugin: object, registry: ProviderRegistry) -> None:
    """Call one plugin's hook, not the whole chain: each plugin registers once."""
    impl = getattr(plugin, "ibal_register_providers", None)
    if impl is None:
        raise ProviderLoadError(f"{plugin!r} has no ibal_register_providers hook")
    impl(registry=registry)
