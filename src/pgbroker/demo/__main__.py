"""``python -m pgbroker.demo``: the guided tour."""

import sys

from pgbroker.demo.tour import main

sys.exit(main())
