import sys

from cairnqd.cli.main import main

sys.exit(main())
