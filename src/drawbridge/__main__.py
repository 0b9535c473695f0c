"""``python -m drawbridge``: the same command line as the ``drawbridge`` script."""

import sys

from drawbridge.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
