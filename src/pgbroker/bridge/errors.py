"""The bridge's typed errors: what went wrong with a broker, and how to fix it.

They subclass PgbrokerError, so the CLI reports them like every other error (message, hint,
exit code 6). Each names the broker as host:port and the name used there, never a password.
The Amqp* classes are the RabbitMQ connector's (and the names the bridge had before it had
other connectors): each is also its broker-neutral class.
"""

from __future__ import annotations

from pgbroker.errors import PgbrokerError


class BridgeError(PgbrokerError):
    """Base class of the bridge's errors."""


class BrokerUnreachable(BridgeError):
    """No connection could be made: nothing listens there, or the network drops it."""


class BrokerAccessRefused(BridgeError):
    """The broker refused the login or the access (user, password, vhost, permissions)."""


class BrokerNotFound(BridgeError):
    """A queue, exchange, stream or consumer the bridge needs does not exist (and declare is off)."""


class BrokerConnectionLost(BridgeError):
    """An established connection closed; the bridge reconnects with back-off."""


class AmqpUnreachable(BrokerUnreachable):
    """No AMQP connection could be made: nothing listens there, or the network drops it."""


class AmqpAccessRefused(BrokerAccessRefused):
    """RabbitMQ refused the login: wrong user or password, or no access to the vhost."""


class AmqpNotFound(BrokerNotFound):
    """An exchange or queue the bridge needs does not exist (and --declare was not given)."""


class AmqpConnectionLost(BrokerConnectionLost):
    """An established connection or channel closed; the bridge reconnects with back-off."""


class Unpublishable(BridgeError):
    """A message's headers cannot be turned into a publish (bad routing or properties)."""
