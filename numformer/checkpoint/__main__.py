"""``python -m numformer.checkpoint average|export|import ...``: the command of :mod:`numformer.checkpoint_command`.

A program's entry point, which nothing imports: the one module of this package that imports from above it
(the command reaches other libraries' formats through :mod:`numformer.interop`, which reads and writes model
files through this package)."""
import sys

from numformer.checkpoint_command import main

if __name__ == "__main__":  # not when a tool walks the package's modules
    sys.exit(main())
