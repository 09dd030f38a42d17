"""``python -m numformer.checkpoint average|export ...``: see :mod:`numformer.checkpoint.command`."""
import sys

from .command import main

if __name__ == "__main__":  # not when a tool walks the package's modules
    sys.exit(main())
