"""Block-wise reconstruction of a pruned model against its dense model (``reconstruct=blockwise``)."""
