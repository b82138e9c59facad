"""Identity, the second step: what makes a task the same task again.

Hashes of a task's code (the user's ``fit`` and what it reads, followed
through their modules), its parameters, and its data (a group's rows, a
file's content, the shared objects). The store compares them to reuse a
finished model; and one digest of all a run's identities are made from
(:mod:`.inputdigest`), by which an unchanged re-run knows the earlier run
without making them. They depend only on :mod:`manymodels.machine` (the
hashing of a table's rows runs on its usable cores) and on the inputs'
group labels.
"""
