"""ibal: an InfiniBand access layer for Python (IBAL's ``ib_al.h`` over ``ib_ci.h`` providers)."""

from ibal import status, types
from ibal.status import IbError, Status

__version__ = "0.1.0"

__all__ = ["IbError", "Status", "__version__", "status", "types"]
