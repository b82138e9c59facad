"""The store, the fifth step of the flow: an embedded, crash-safe registry
of runs and models.

Below it are inputs, identity, planning and the engine: a run's tasks come
to it with their identities (to find what it can reuse) and leave the
engine's workers as finished results (to be written). The layers above
(evaluation, models, observe, run) may use it; it imports none of them.

- Files: the SQLite index in WAL mode (:mod:`.database`, :mod:`.newstore`,
  :mod:`.opening`; its connections, safe to close from another thread,
  :mod:`.connections`; the store's errors, :mod:`.storeerrors`) beside
  the models' artifacts (:mod:`.artifacts`) and
  packs of many small ones (:mod:`.packs`); a store on an object store
  works on a local copy (:mod:`.remote`, :mod:`.localcopy`; the copy read as
  files, :mod:`.indexfiles`).
- Writing a run: its start with what it reuses (:mod:`.runstart`,
  :mod:`.reuse`), its tasks recorded in batched transactions
  (:mod:`.recorder`) by a thread of their own (:mod:`.writer`) as
  columnar blocks (:mod:`.taskblocks`); who writes it (:mod:`.drivers`);
  its checkpoints (:mod:`.checkpoints`).
- Reading: :class:`Store` (:mod:`.registry`), a task found by its key
  (:mod:`.keylookups`), models loaded when first asked for
  (:mod:`.lazymodels`), why a task was not reused (:mod:`.explain`),
  why a group has no model, failed or never trained (:mod:`.nomodel`),
  exports written whole (:mod:`.wholefiles`).
- Upkeep: checking artifacts (:mod:`.verify`), deleting runs
  (:mod:`.deletion`) and collecting what no run names (:mod:`.collect`).
"""

from .database import StoreError, StoreIntegrityError, check_existing_index
from .lazymodels import ModelMap, StoredModel
from .recorder import RunRecorder
from .registry import Store
from .remote import remote_store_exists

__all__ = ["ModelMap", "RunRecorder", "Store", "StoreError", "StoreIntegrityError",
           "check_existing_index",
           "StoredModel", "remote_store_exists"]
