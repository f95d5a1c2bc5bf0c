"""The conformance suite against the sample: every check its capabilities cover."""

from ibal.testing import ProviderConformance


class TestSampleConformance(ProviderConformance):
    provider_name = "sample"
