"""``python -m rota.cli``: the ``rota`` command."""

from . import main

main()
