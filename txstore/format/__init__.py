"""Pure bytes <-> objects: no I/O happens in this package."""
