"""The package version (a leaf: the file format writes it)."""

__version__ = "0.1.0"
