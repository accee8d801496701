"""`python -m cairnqd.daemon.child`: how the parent execs a worker child."""

import sys

from cairnqd.daemon.child.main import main

sys.exit(main())
