"""Faces of the store for other engines and formats (Ray Data)."""
