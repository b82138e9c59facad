"""``python -m manymodels.engine.backends._spawn_main ...``: a spawned worker's entry
point, a module of its own so that running it imports nothing twice."""

import sys

from ._process_worker import main

sys.exit(main(sys.argv))
