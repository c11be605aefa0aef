"""``python -m rota_demo``: the ``rota-demo`` command."""

import sys

try:
    from .cli import main
except ModuleNotFoundError as exc:  # the demo's own dependencies are an extra
    if exc.name != "httpx":
        raise
    sys.exit("rota-demo needs the demo extra: pip install 'rota[demo]'")

if __name__ == "__main__":
    main()
