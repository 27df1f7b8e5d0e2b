"""The ``wd-chaos`` subcommands, one module per group of commands: ``run`` (run scenarios),
``listing`` (list, show), ``stored`` (analyze, shrink, clean a stored run), and ``common`` (exit
codes, output, what several commands share). ``wd_chaos.cli`` is the entry point: it defines the
group and registers each command with one ``main.add_command(...)`` line."""
