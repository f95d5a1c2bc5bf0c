"""The rxe provider: a userspace RoCEv2 HCA that speaks Linux ``rdma_rxe``'s wire protocol.

``packet`` holds the opcode table and the parsed-packet record shared by the
codec and the sans-IO transport core (requester, responder, completer); the
socket layer that drives them is thin.  See ``docs/rxe-provider.md``.
"""
