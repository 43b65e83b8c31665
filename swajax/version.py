"""The package's version (also `swajax.__version__`; pyproject.toml holds the same, a test
checks)."""

__version__ = "0.1.0"
