"""``python -m pgbroker.spark.jobs JOB ...``: the pipeline jobs without the pgbroker CLI."""

import sys

from pgbroker.spark.jobs import main

sys.exit(main(prog="python -m pgbroker.spark.jobs"))
