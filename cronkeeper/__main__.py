"""``python -m cronkeeper``: the same as the ``cronkeeper`` command."""

from cronkeeper.cli.main import main

main()
