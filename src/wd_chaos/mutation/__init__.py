"""What every kind of mutant run shares: the catalogue gate (``wd-chaos mutants``), generated
statement and script mutants (``wd-chaos mutate``) and Python mutants (``wd-chaos mutate --python``)
each start pytest through ``session``, read its JUnit file through ``junit`` and write their
``.html`` through ``page``. Below every process of a run, which opens its store with what is
here too: the catalogue as a run loads it (``catalogue``) and a generated mutant put in place
(``patch``)."""
