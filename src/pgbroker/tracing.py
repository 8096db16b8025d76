"""OpenTelemetry traces of pgbroker's messages: the ``otel`` extra (opentelemetry-api).

Off until instrument() is called, once, at start-up (in a worker, where the app module is
imported)::

    from pgbroker import tracing

    tracing.instrument()  # the global tracer provider, or instrument(tracer_provider=...)

Then, following OpenTelemetry's messaging conventions (``messaging.system`` = "pgbroker", the
queue as ``messaging.destination.name``, ``messaging.operation.name`` and ``.type``):

- ``send``/``send_many``: a PRODUCER span ``send <queue>``. Its context is the creation context
  of the messages: the global propagator (W3C ``traceparent`` and ``tracestate``, and
  ``baggage`` when there is any, unless OTEL_PROPAGATORS says otherwise) writes it into each
  message's headers, except into a message whose headers already carry a ``traceparent``;
- ``read``/``read_many``: a CONSUMER span ``receive <queue>``, linked to each message's creation
  context;
- ``ack``/``nack`` (and their ``_many`` forms): a CLIENT span ``ack <queue>`` or ``nack <queue>``
  (operation type ``settle``);
- a worker's handler: a CONSUMER span ``process <queue>`` per message, child of (and linked to)
  the creation context its headers carry, current while the handler runs (a sync handler's
  thread included), so that the handler's own spans continue the producer's trace; and its round
  trips that read messages (``receive <queue>``) or only record outcomes (``settle <queue>``);
- a stream's ``send``/``send_many`` and a stream worker's handler: the same, on the stream.

Headers travel through the bridges as the broker carries them (pgbroker.bridge). Until
instrument() is called, each of those calls costs one test of a module global: nothing is
imported from opentelemetry, no span is made and no header added. uninstrument() turns it off.
"""

from pgbroker._tracing import instrument, uninstrument

__all__ = ["instrument", "uninstrument"]
