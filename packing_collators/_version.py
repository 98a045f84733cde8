"""The package's version, in a module of its own: the folders read it without importing the package."""

__version__ = "0.1.0"
