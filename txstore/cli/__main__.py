"""``python -m txstore.cli``."""

import sys

from . import main

sys.exit(main())
