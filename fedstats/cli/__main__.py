"""``python -m fedstats.cli``."""

import sys

from . import main

sys.exit(main())
