"""Lightning callbacks that run during training (one module each), imported from their modules."""
