"""`python -m ampbench.cli`: the `ampbench` command, run as a module (under torchrun too)."""

import sys

from ampbench.cli import main

# Guarded: a process that multiprocessing spawns imports this module again, as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
