"""``python -m bench``: every benchmark in one run (see :mod:`bench.run`)."""

from bench.run import main

raise SystemExit(main())
