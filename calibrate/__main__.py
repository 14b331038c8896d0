"""`python -m calibrate ...`: see calibrate/harness/cli.py."""

import sys

from calibrate.harness.cli import main

sys.exit(main())
