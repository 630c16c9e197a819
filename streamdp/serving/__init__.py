"""The models layer: a released model and what serves it.

Its format and loading (``model.py``), each user's local solve (``local.py``), ranking
metrics (``ranking.py``), every user's list streamed block by block (``batch.py``), the
evaluation on a store's test split (``evaluate.py``), and the model's serving calls
(``serve.py``). Above the stream engine, below the methods that write a model
(``tests/test_structure.py``: ``LAYERS``; ``docs/architecture.md``).
"""
