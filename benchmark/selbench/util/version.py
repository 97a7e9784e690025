"""selbench's version (the distribution's, in pyproject.toml)."""

__version__ = "0.1.0"
