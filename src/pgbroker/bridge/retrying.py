"""Which failures a bridge rides out (reconnect, back off, carry on) and which end it.

A database restart or a dropped connection is transient: the pool reconnects, and messages a
bridge held come back when their leases run out. A missing queue, a missing schema or an
invalid setting is not: retrying cannot fix it, so the bridge stops and says what is wrong.
"""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

from pgbroker.errors import DatabaseError

# SQLSTATE classes and codes of failures that pass: connection exceptions, the server shutting
# down or starting, serialization failures and deadlocks.
_TRANSIENT_CLASSES = ("08", "57")
_TRANSIENT_CODES = ("40001", "40P01")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return True
    if isinstance(exc, DatabaseError):
        code = exc.sqlstate or ""
        return not code or code.startswith(_TRANSIENT_CLASSES) or code in _TRANSIENT_CODES
    return False
