from ibal.testing import ProviderConformance


class TestMock(ProviderConformance):
    provider_name = "mock"
