"""The ``pgbroker`` command: manage queues, send, read and acknowledge messages, run workers, the
bridge, the HTTP API and the embedded PostgreSQL, all from a shell.

Commands that print data print it plainly, one item per line (msg_ids, JSON lines, a DSN), so
that they compose with pipes; commands that change things print one sentence. Errors go to
stderr as ``pgbroker: error: <message>`` and usually a ``hint:`` line; ``-v`` adds the traceback.
The exit codes are listed in pgbroker.cli.support.errors.

The packages: ``support`` (what every command shares), ``commands`` (one module per group of
commands), and ``main``, which assembles them (``pgbroker.cli.main:main`` is the console script).
Nothing is imported here, so that importing ``support`` does not load every command.
"""
