"""The distribution's version, in one low module: the package root and the backend registry read it."""

__version__ = "0.1.0"
