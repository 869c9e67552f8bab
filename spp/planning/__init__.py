"""Memory and time plans computed from a model's config alone (no weight read)."""
