"""`python -m flashgen`: the same command line as the `flashgen` console script."""

from __future__ import annotations

from flashgen.cli import main

if __name__ == "__main__":
    main()
