"""`python -m ampbench.cli`: how torchrun's processes and a TrainJob's nodes start ampbench."""

import sys

from ampbench.cli import main

# Guarded: a process that multiprocessing spawns imports this module again, as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
