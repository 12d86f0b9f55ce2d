"""``python -m pdscale.testbed.simengine``: one simulated engine process (see the package)."""

import sys

from .cli import main

sys.exit(main())
