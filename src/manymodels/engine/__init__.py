"""The engine, the fourth step: the plan's tasks run on workers.

The scheduler (:mod:`.scheduling`) orders, batches and retries tasks and keeps
the error budget; the data plane (:mod:`.dataplane`) puts the table and shared
objects into shared memory once; execution (:mod:`.execution`) is what a
worker does with a batch; messages and packs are what comes back. The
backends (:mod:`.backends`: serial, threads, processes, Ray, Spark, Dask) only
run batches, behind one small interface.
"""
