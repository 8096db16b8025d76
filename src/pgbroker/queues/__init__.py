"""Queues: the clients (AsyncBroker, and Broker generated from it) and their query layer."""
