"""``python -m pgbroker``: the ``pgbroker`` command."""

import sys

from pgbroker.cli import main

sys.exit(main())
