"""The command line: `python -m minitrain.launch` (see `minitrain.launch.cli`)."""
