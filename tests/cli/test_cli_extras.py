"""The ``pgbroker`` command without its optional extras (``pip install pgbroker``): every command is
there, and one that needs a missing extra says which to install instead of failing on an import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.running import needs_extra

# Run in a fresh interpreter whose imports of the extras' packages fail, as in a bare install.
BARE_INSTALL = textwrap.dedent(
    """
    import importlib.abc
    import sys

    EXTRAS = {"starlette", "uvicorn", "prometheus_client", "pika", "redis", "nats", "paho", "boto3",
              "botocore", "pyspark", "pyarrow", "numpy"}

    class NoExtras(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] in EXTRAS:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoExtras())

    from pgbroker.cli.support.errors import CliError
    from pgbroker.cli.main import build_parser

    parser = build_parser()
    print(parser.format_help())
    for argv in (["serve"], ["bridge", "out", "--queue", "q", "--amqp", "amqp://localhost"]):
        args = parser.parse_args(argv)
        try:
            args.handler(args, None)  # the import comes before any use of the broker
        except CliError as exc:
            print(f"{argv[0]}: {exc.code} {exc.message} / {exc.hint}")
    """
)


def test_every_command_is_there_without_the_extras_and_says_which_extra_it_needs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BARE_INSTALL], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    for command in ("install", "send", "read", "keys", "serve", "bridge", "worker", "pipeline", "db"):
        assert f"\n    {command} " in done.stdout, command
    assert (
        "serve: 2 this command needs pgbroker's http extra (uvicorn is not installed)"
        " / Install it: pip install 'pgbroker[http]'"
    ) in done.stdout
    assert (
        "bridge: 2 this command needs pgbroker's bridge extra (pika is not installed)"
        " / Install it: pip install 'pgbroker[bridge]'"
    ) in done.stdout


def test_a_missing_extra_becomes_a_usage_error_with_the_install_command() -> None:
    with pytest.raises(CliError) as caught, needs_extra("http"):
        raise ModuleNotFoundError("No module named 'starlette'", name="starlette")
    assert (caught.value.code, caught.value.hint) == (Exit.USAGE, "Install it: pip install 'pgbroker[http]'")


def test_a_missing_pgbroker_module_is_not_taken_for_a_missing_extra() -> None:
    with pytest.raises(ModuleNotFoundError), needs_extra("http"):
        raise ModuleNotFoundError("No module named 'pgbroker.nothing'", name="pgbroker.nothing")
