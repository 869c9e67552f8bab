"""Benchmark harness (not tests): SPP vs peft LoRA, layer level and model level (issues 2 and 7)."""
