"""pluggy hook specifications: how provider plugins make themselves known.

A provider package declares an entry point in the ``ibal.providers`` group
pointing at a module (or object) with an ``ibal_register_providers`` hook
implementation::

    [project.entry-points."ibal.providers"]
    acme = "acme_ibal.plugin"

    # acme_ibal/plugin.py
    from ibal.ci import hookimpl

    @hookimpl
    def ibal_register_providers(registry):
        registry.add("acme", AcmeProvider, "ACME HCAs")

pluggy is used for discovery only.  Verbs, async events and PnP never travel
through hook calls: pluggy calls plugins LIFO and stops at the first exception,
while those paths need per-CA dispatch, FIFO order and per-client isolation.
"""

from __future__ import annotations

import pluggy

from ibal.ci.provider import ProviderRegistry

PROJECT = "ibal"
ENTRY_POINT_GROUP = "ibal.providers"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ProviderHookSpecs:
    @hookspec
    def ibal_register_providers(self, registry: ProviderRegistry) -> None:
        """Add this plugin's providers to ``registry`` with ``registry.add``.

        Called once, in the loading thread, when the plugin is loaded; it must
        not open devices (that happens in ``Provider.start``).
        """
