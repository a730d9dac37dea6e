"""`python -m minitrain.launch ...`: see `minitrain.launch.cli`."""

import sys

from minitrain.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
