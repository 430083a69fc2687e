"""The package's version: the single place it is written (pyproject.toml and
CMakeLists.txt read it from here)."""

__version__ = "0.2.0"
