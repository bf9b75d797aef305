"""load layer."""
