"""Planned: see docs/architecture.md (the mad layer builds on the access layer's public API)."""
