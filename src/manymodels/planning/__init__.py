"""Planning, the third step: a source becomes a plan of tasks.

Each task is a key, a cheap reference to its data (an offset and a length in
the table sorted by key, a file, an item) and a cost estimate; the table is
read and sorted once. The plan is columns, not a million objects.
"""
