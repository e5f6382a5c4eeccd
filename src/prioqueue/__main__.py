"""``python -m prioqueue``: the ``prioqueue`` command (see :mod:`prioqueue.cli`)."""

from __future__ import annotations

import sys

from prioqueue.cli import main

if __name__ == "__main__":
    sys.exit(main())
