"""The suite's plugins: shared fixtures by service (tests/plugins/*), and the markers of the
external services each test needs (tests/plugins/services.py; tests/README.md says how to run
with Postgres alone). Helpers the tests import are plain modules under tests/support/."""

pytest_plugins = [
    "tests.plugins.services",
    "tests.plugins.scheduling",
    "tests.plugins.postgres",
    "tests.plugins.rabbitmq",
    "tests.plugins.bridge_brokers",
    "tests.plugins.pgbouncer",
    "tests.plugins.browser",
    "tests.plugins.spark_jvm",
]
