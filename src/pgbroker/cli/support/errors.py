"""What went wrong, as the CLI reports it: the exit codes and the error a command raises.

Exit codes (a shell script may rely on them):

  0   success; also nothing to do: an empty read prints nothing, and a purge, ``dlq purge`` or
      ``dlq replay`` with nothing to act on, a create, pause or resume already done, ``db start``
      of a running cluster and ``db stop`` of a stopped one, say so
  1   nothing done: archive/delete/``dlq show``/``dlq replay``/``dlq purge`` of msg_ids that are
      not there, send with no input, ``db url`` when the cluster is not running, and
      ``db status`` when it is not running
  2   usage error or invalid input: bad option, bad JSON, malformed receipt, invalid queue name;
      also a command whose optional extra is not installed (``serve``: http, ``bridge``: bridge)
  3   stale receipt: the lease ran out or the message was redelivered, so the ack changed nothing
  4   not found: the named queue, stream, consumer group, schedule, API key or grant does not
      exist (``drop``, ``stream drop``, ``schedule remove``, ``keys revoke``, ``revoke`` ... of it)
  5   database unreachable, refused the operation, or pgbroker not installed (``pgbroker install``)
  6   a broker (``bridge``: RabbitMQ, Redis, NATS, MQTT, SQS): unreachable, login refused, or an
      exchange, queue or stream missing
  70  unexpected error (a bug: please report it with the output of ``-v``)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """The exit codes, as listed above and in the help's epilog (parsers.EPILOG)."""

    OK = 0
    NOTHING_DONE = 1
    USAGE = 2
    STALE_RECEIPT = 3
    NOT_FOUND = 4
    DATABASE = 5
    AMQP = 6
    UNEXPECTED = 70
    INTERRUPTED = 130


class CliError(Exception):
    """A failure the CLI reports as one message, a hint and an exit code."""

    def __init__(self, message: str, *, code: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"
