"""Benchmark harness (not tests): SPP vs peft LoRA, layer level and model level."""
