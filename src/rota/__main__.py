"""``python -m rota``: the ``rota`` command (as ``python -m rota.cli`` and the ``rota``
console script)."""

from .cli import main

main()
