import sys

from targ_mlx.calibration.cli import main

if __name__ == "__main__":
    sys.exit(main())
