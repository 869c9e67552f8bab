"""Instruction-tuning data: the Alpaca prompt template, record loading/validation and the Lightning data module."""
