"""Planned: see docs/architecture.md (the cm layer builds on the access layer's public API)."""
