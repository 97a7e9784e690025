"""``python -m selbench``: the same command line as ``selbench``."""

import sys

from selbench.cli import main

if __name__ == "__main__":  # pragma: no branch
    sys.exit(main())
