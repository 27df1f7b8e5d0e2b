"""``wd-chaos mutate``: mutants derived mechanically from a store's own statements (SQL constants)
and scripts (Lua), carried to every process of a check in ``WD_MUTANT_EDIT`` (``patch``), judged by
the store's tests and short wd-chaos runs (``runner``). See the docs' "The mutant gate" (docs/guides/mutants.md)."""
