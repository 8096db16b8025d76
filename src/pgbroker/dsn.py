"""Where pgbroker connects: an explicit DSN, else DATABASE_URL, else the embedded cluster."""

from __future__ import annotations

import os

__all__ = ["resolve_dsn"]


def resolve_dsn(dsn: str | None = None) -> str:
    """Return ``dsn`` if given, else ``$DATABASE_URL``, else the default embedded cluster's DSN.

    An empty string counts as not given, as an empty DATABASE_URL does: neither names a server.
    The embedded cluster is started (and created on first use) only when it is needed.
    """
    if dsn:
        return dsn
    env = os.environ.get("DATABASE_URL")
    if env:
        return env
    # Imported here: most callers have a DSN and never need the subprocess machinery.
    from pgbroker.embedded import EmbeddedPostgres

    return EmbeddedPostgres().start()
