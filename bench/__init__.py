"""streamdp's benchmarks: runnable scripts (``python bench/<name>.py``) and one entry point, ``python -m bench``."""
