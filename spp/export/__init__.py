"""Exporting merged sparse models (2:4 semi-structured weights for CUDA inference)."""
