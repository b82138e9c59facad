"""The store: an embedded, crash-safe registry of runs and models."""

from .database import StoreError, StoreIntegrityError
from .recorder import RunRecorder
from .registry import ModelMap, Store, StoredModel

__all__ = ["ModelMap", "RunRecorder", "Store", "StoreError", "StoreIntegrityError",
           "StoredModel"]
