"""`python3 -m fmcluster.health ...`: the same as the installed `fmcluster-health` program (an executable zip)."""

import sys

from fmcluster.health.cli import main

sys.exit(main())
