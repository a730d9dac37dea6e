"""The node agent runtime (L2): `python -m minitrain.agent`. Never imports torch."""
