"""The version of manymodels: a leaf module that imports nothing, so that any
module (a Ray worker, the command line) can read it without importing the rest."""

__version__ = "0.1.0"
