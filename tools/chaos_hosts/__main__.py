"""``python -m tools.chaos_hosts``: see :mod:`tools.chaos_hosts`."""

import sys

from .main import main

sys.exit(main())
