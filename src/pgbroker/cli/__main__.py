"""``python -m pgbroker.cli``: the ``pgbroker`` command."""

import sys

from pgbroker.cli.main import main

sys.exit(main())
