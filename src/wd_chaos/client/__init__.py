"""What runs inside the workload's processes: the worker loop (``workload``, started as
``python -m wd_chaos.client.workload``), the test workflow (``testflow``), the recorder that writes
each call's invoke and complete lines, the careless clients, and the locust storms with their probes.

Nothing here imports ``wd_chaos.control`` (``tests/test_layers.py`` holds it to that): a worker
process knows its config file and its store, never the controller that started it.
"""
