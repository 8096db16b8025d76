"""A private cluster that asks a role for its password (scram-sha-256), and the passfile libpq reads
it from: what a rotated password, refused while a process runs, is tested with."""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from pgbroker.embedded import EmbeddedPostgres


def with_passwords(cluster: EmbeddedPostgres, role: str, password: str) -> str:
    """Ask every role but the superuser for a password; ``role`` gets ``password`` and pgbroker's
    rights (a member of the superuser's role). Its DSN, without the password."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE postgres")
        (cluster.data_dir / "pg_hba.conf").write_text(
            "local all postgres trust\nlocal all all scram-sha-256\n"
        )  # rewritten in place: the server's user keeps owning it
        conn.execute("SELECT pg_reload_conf()")
    return make_conninfo(cluster.dsn(), user=role)


def write_passfile(passfile: Path, role: str, password: str) -> None:
    """The passfile libpq reads at every connection ($PGPASSFILE), giving ``role`` ``password``."""
    passfile.write_text(f"*:*:*:{role}:{password}\n")
    passfile.chmod(0o600)


def refuse_login(cluster: EmbeddedPostgres, role: str, password: str) -> None:
    """Change ``role``'s password (as a rotation does) and end its sessions: its next ones are refused."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
