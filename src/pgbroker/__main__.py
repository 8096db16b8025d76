"""``python -m pgbroker``: the ``pgbroker`` command."""

import sys

from pgbroker.cli.entry import main

sys.exit(main())
