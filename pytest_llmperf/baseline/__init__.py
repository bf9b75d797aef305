"""baseline layer."""
