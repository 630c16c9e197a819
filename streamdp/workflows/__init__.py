"""The entry points: what a command or a Python API call runs, on top of every other layer.

Training runs (``training.py``), the Python API (``api.py``), private tuning (``tune.py``),
sweeps (``sweep.py``), the rehearsal (``rehearse.py``), the demo (``demo.py``), the methods
listing (``catalog.py``) and per-method help (``train_help.py``). ``streamdp/cli.py`` (same
layer) stays at the package root; no layer below imports this one
(``tests/test_structure.py``: ``LAYERS``; ``docs/architecture.md``).
"""
