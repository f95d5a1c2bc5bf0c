"""Shared fixtures of the rdma_core provider tests.

Host-side tests run anywhere (no device needed).  Lab tests (``lab`` +
``rdma_core`` markers) run inside the qemu guest through the fixtures of
``ibal.lab.pytest_plugin``, imported here rather than enabled globally.
"""

from __future__ import annotations

import pytest

from ibal.lab.pytest_plugin import (  # noqa: F401  (fixtures and the marker hook)
    ibal_lab,
    ibal_lab_session,
    pytest_configure,
)


@pytest.fixture
def pyverbs_or_skip() -> object:
    """The pyverbs package, or a skip naming the Debian package."""
    from ibal.providers.rdma_core import loader

    try:
        return loader.load()
    except loader.PyverbsUnavailable as exc:
        pytest.skip(f"needs python3-pyverbs: {exc}")
