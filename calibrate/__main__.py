"""`python -m calibrate ...`: see calibrate/cli.py."""

import sys

from calibrate.cli import main

sys.exit(main())
