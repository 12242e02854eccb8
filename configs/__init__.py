"""Experiment configs: `get_config(arg)` files, loaded by path (`--config=configs/spade.py:local`)."""
