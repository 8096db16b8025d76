"""Plain helper modules the tests import: no fixtures, no hooks (those are in tests/plugins)."""
