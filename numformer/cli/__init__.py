"""The command-line plumbing that train.py, translate.py and the ``python -m`` tools share."""
