"""pytest plugins the root conftest registers for the whole suite: shared fixtures, by service,
and the hooks that give each test the markers of the services it needs."""
