"""`python -m minitrain.bench`: see `minitrain.bench.cli`."""

import sys

from minitrain.bench.cli import main

sys.exit(main())
