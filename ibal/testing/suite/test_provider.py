"""The suite against the provider named by ``--ibal-provider`` (collected only with it)."""

from ibal.testing.suite import ProviderConformance


class TestProvider(ProviderConformance):
    """``pytest --ibal-provider NAME [--ibal-provider-option KEY=VALUE ...]``."""
