"""Management datagrams: field tables, dumps (docs/mad.md); builds on the access layer's public API.

The wire layer (consts, header, smp, sa, perf, dump) imports nothing from ``ibal.al``.
"""
