"""The store: an embedded, crash-safe registry of runs and models."""

from .database import StoreError, StoreIntegrityError
from .lazymodels import ModelMap, StoredModel
from .recorder import RunRecorder
from .registry import Store

__all__ = ["ModelMap", "RunRecorder", "Store", "StoreError", "StoreIntegrityError",
           "StoredModel"]
