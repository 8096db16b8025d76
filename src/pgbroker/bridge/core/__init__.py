"""The bridge's core: inbound and outbound loops, whatever the broker."""
