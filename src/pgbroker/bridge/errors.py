"""The bridge's typed errors: what went wrong with RabbitMQ, and how to fix it.

They subclass PgbrokerError, so the CLI reports them like every other error (message, hint,
exit code). Each names the broker as ``host:port/vhost`` and never the password.
"""

from __future__ import annotations

from pgbroker.errors import PgbrokerError


class BridgeError(PgbrokerError):
    """Base class of the RabbitMQ bridge's errors."""


class AmqpUnreachable(BridgeError):
    """No AMQP connection could be made: nothing listens there, or the network drops it."""


class AmqpAccessRefused(BridgeError):
    """RabbitMQ refused the login: wrong user or password, or no access to the vhost."""


class AmqpNotFound(BridgeError):
    """An exchange or queue the bridge needs does not exist (and --declare was not given)."""


class AmqpConnectionLost(BridgeError):
    """An established connection or channel closed; the bridge reconnects with back-off."""


class Unpublishable(BridgeError):
    """A message's headers cannot be turned into an AMQP publish (bad routing or properties)."""
