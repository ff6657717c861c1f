"""Migration scripts, one per schema change."""
