"""Training: the typed job config, the three phases (``phases.py``), the Lightning module, trainer and callbacks."""
