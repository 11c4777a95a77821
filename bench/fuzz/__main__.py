"""`python -m bench.fuzz`: run the fuzz targets and print their table (see the package's docstring)."""

import sys

from bench.fuzz import main

if __name__ == "__main__":
    sys.exit(main())
