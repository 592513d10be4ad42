import sys

from targ_mlx.cli import main

if __name__ == "__main__":
    sys.exit(main())
