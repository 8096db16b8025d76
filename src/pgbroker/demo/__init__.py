"""The guided tour that `make demo` runs (``python -m pgbroker.demo``): a queue with fenced acks,
a Worker with a dead-letter queue, a stream read by two groups and a queue with priorities and
dedup keys, and Spark reading the archive.

The modules: ``stage`` (the Demo every stage gets: the broker, output, the verdict), one module
per stage (``orders``, ``workers``, ``streams_jobs``, ``spark``), and ``tour``, which runs the
stages in order. A new part of pgbroker joins the tour with a module of its own and a line in
tour.STAGES.
"""
