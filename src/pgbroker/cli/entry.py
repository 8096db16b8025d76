"""The ``pgbroker`` command's first step (the console script, ``python -m pgbroker``, ``python -m
pgbroker.cli``): SIGTERM and SIGINT blocked before anything else is imported, then the command.

Imports, the parser and the logging take most of a command's start (half a second on an idle
machine, seconds on a loaded one), and a SIGTERM then met the default action: a supervisor killed
with exit 143, its worker processes left behind. Blocked, a signal waits in the kernel until
pgbroker.cli.support.running.execute unblocks it: a long-running command once it holds the stop
signals (runtime._signals.hold_stop_signals: the stop it asked for is then a clean one, exit 0),
any other at once (Ctrl-C interrupts it as before). Only ``signal`` is imported here, and
``import pgbroker`` imports nothing until a name is used: what is left unheld is the interpreter's
own start.
"""

import signal

__all__ = ["main"]


def main() -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))
    from pgbroker.cli.main import main as command  # after the block: the slow part

    return command()
