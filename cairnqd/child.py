"""Compatibility entry point: `python -m cairnqd.child`.

A parent of the previous release spawns its children under this name; after an
upgrade in place it must still find them until it is restarted. New parents spawn
`python -m cairnqd.daemon.child`. Kept for one release.
"""

import sys

from cairnqd.daemon.child import main

if __name__ == "__main__":
    sys.exit(main())
