"""Dialect plugins, found by the core through the lorien.dialects entry points."""
