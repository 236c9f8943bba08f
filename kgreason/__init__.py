"""Shared base of every package: user-facing errors (imports nothing but the standard library)."""
