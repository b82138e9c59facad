"""``python -m manymodels.backends._spawn_main ...``: a spawned worker's entry
point, a module of its own so that running it imports nothing twice."""

import sys

from manymodels.backends._process_worker import main

sys.exit(main(sys.argv))
