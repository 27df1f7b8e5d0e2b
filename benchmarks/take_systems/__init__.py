"""The systems ``benchmarks.take`` measures, one module per system or family: ``postgres`` (ours,
naive FOR UPDATE, batched, psycopg alone), ``pgbench``, ``pgqueuer_bench``, ``redis_bench`` (ours,
redis-benchmark, redis-py alone) and ``sqlite``; ``drain`` holds what they share. None of them
edits the store's SQL text: statements come from the store's attributes and functions, or are
written out in full where a variant is wanted."""
