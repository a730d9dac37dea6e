"""The worker runtime (L2): `python -m minitrain.worker`, one process per rank. The only runtime that imports torch."""
