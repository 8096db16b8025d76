"""Compatibility suite: the official pgmq client against pgbroker, and pgbroker against the reference SQL."""
