"""One connector per broker, each implementing pgbroker.bridge.connector."""
