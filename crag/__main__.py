"""``python -m crag``: the command line."""

from .cli import main

raise SystemExit(main())
