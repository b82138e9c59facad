"""``python -m manymodels.engine.backends._spawn_main ...``: a spawned worker's entry
point, a module of its own so that running it imports nothing twice."""

import sys

from ._process_worker import main

# (guarded: a fit's multiprocessing pool started with "spawn" or "forkserver"
# runs this module again as its children's __main__, which must not start a
# second worker loop)
if __name__ == "__main__":
    sys.exit(main(sys.argv))
