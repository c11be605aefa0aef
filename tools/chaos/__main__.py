"""``python -m tools.chaos``: see :mod:`tools.chaos`."""

import sys

from .main import main

sys.exit(main())
