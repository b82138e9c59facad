"""The store: an embedded, crash-safe registry of runs and models."""

from .database import StoreError, StoreIntegrityError, check_existing_index
from .lazymodels import ModelMap, StoredModel
from .recorder import RunRecorder
from .registry import Store
from .remote import remote_store_exists

__all__ = ["ModelMap", "RunRecorder", "Store", "StoreError", "StoreIntegrityError",
           "check_existing_index",
           "StoredModel", "remote_store_exists"]
