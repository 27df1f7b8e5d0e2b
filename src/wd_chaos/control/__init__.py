"""The controller: plans a run, provisions its servers (``services``, ``toxi``, ``lazyfs``), starts
and supervises the workload's processes (``cluster``, ``lifeline``), drives the faults, and collects
the store's final state (``runner``); ``kits`` says which store kits a run may use.

Of ``wd_chaos.client`` it imports only ``recorder`` (the final read is recorded as the workers'
calls are); it starts worker and storm processes by module path, never by importing them
(``tests/test_layers.py`` holds it to that).
"""
