"""Private: database plumbing (connection strings, LISTEN, liveness, install, back-off, API keys)."""
