"""Fixtures of the MAD service tests (the helpers live in mad_world.py)."""

from mad_world import mock_net, net

__all__ = ["mock_net", "net"]
