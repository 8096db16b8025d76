"""A private PostgreSQL cluster that pgbroker initialises, starts and reuses when no DSN is given.

The modules, one job each: ``cluster`` (EmbeddedPostgres: init, start, stop, status, under a
lock file), ``binaries`` (finding initdb/pg_ctl/postgres: PGBROKER_PG_BIN, the system's, the
pgserver wheel), ``server_user`` (running the server as an unprivileged user when root),
``processes`` (postmaster.pid and /proc) and ``errors``.
"""

from pgbroker.embedded.binaries import ENV_PG_BIN, find_bin_dir, server_version
from pgbroker.embedded.cluster import ENV_HOME, PORT_RANGE, EmbeddedPostgres, EmbeddedStatus, default_data_dir
from pgbroker.embedded.errors import EmbeddedError

__all__ = [
    "ENV_HOME",
    "ENV_PG_BIN",
    "PORT_RANGE",
    "EmbeddedError",
    "EmbeddedPostgres",
    "EmbeddedStatus",
    "default_data_dir",
    "find_bin_dir",
    "server_version",
]
