"""Cross-validation of the KvaLean statements against the Python implementation (see README.md)."""
