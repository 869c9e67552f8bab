"""The block-wise reconstruction campaign on SmolLM2-135M: its runner's queries (``selection``) and its report."""
