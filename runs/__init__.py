# The one place the version is written: the distribution's metadata reads it (pyproject.toml).
__version__ = "0.1.0"
