"""Command-line tools on the access layer's public API (``ibal pingpong``, ``perftest``)."""
