"""Fast paths split from the plain math of the layers (host threads, fused passes, in-place updates)."""
