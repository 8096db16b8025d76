"""Streams: the stream clients (AsyncStream, and Stream generated from it) and their queries."""
