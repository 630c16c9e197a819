"""What a method derives from each block, kept in memory from pass to pass while it fits: :class:`BlockMemo`.

An iterative method reads and decodes every block, then derives the same arrays from it
(pairs, confidences, bounded weights), once per pass: at 20M ratings four passes per ials
iteration spent 1.2 of 7 CPU s on it (issue 44), where ``implicit`` keeps its CSR in memory.
A memo keeps those arrays when they fit beside the passes' own blocks within
``--memory-limit`` (:meth:`BlockMemo.within`), otherwise a method streams as before. Once every
block is in it, a pass runs with ``split=None``: the engine reads nothing. Local engines only
(a cluster's tasks run elsewhere); a memo holds only what a pass would derive again, the same values.
"""

from __future__ import annotations

import threading

from streamdp.stream.engine import MAX_IN_FLIGHT_PER_WORKER


class BlockMemo:
    """Per-block values (tuples of arrays) for blocks ``0 .. n_blocks - 1``, at most ``budget`` bytes in all."""

    def __init__(self, n_blocks: int, budget: int):
        self.n_blocks, self.budget = int(n_blocks), int(budget)
        self._values: dict[int, tuple] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def within(cls, engine, need: int, extra_per_block: int = 0) -> "BlockMemo | None":
        """A memo of ``need`` bytes when they fit in ``engine``'s budget beside its most blocks in flight (each
        with ``extra_per_block``); ``None`` on a cluster or without room."""
        if engine.distributed:
            return None
        used, _ = engine.memory_used()
        flight = (MAX_IN_FLIGHT_PER_WORKER * engine.workers + 1) * engine.block_bytes("train", extra_per_block)
        if used + flight + need > engine.memory_limit:
            return None
        return cls(engine.n_blocks, need)

    def get(self, b: int):
        """Block ``b``'s value, or ``None``."""
        return self._values.get(b)

    def put(self, b: int, value: tuple) -> bool:
        """Keep ``value`` (a tuple of arrays) for block ``b`` if the budget allows (an earlier one is dropped either
        way); whether it was kept."""
        size = _nbytes(value)
        with self._lock:
            old = self._values.get(b)
            size_old = _nbytes(old) if old is not None else 0
            if old is not None:  # never a stale value: a block's new value replaces it or drops it
                del self._values[b]
                self._bytes -= size_old
            if self._bytes + size > self.budget:
                return False
            self._values[b] = value
            self._bytes += size
            return True

    @property
    def complete(self) -> bool:
        """Whether every block is kept (a pass then need not read the store)."""
        return len(self._values) == self.n_blocks

    def split(self, split: str = "train"):
        """The ``split`` a pass over the memo's blocks reads: ``None`` once it is complete."""
        return None if self.complete else split


def _nbytes(value: tuple) -> int:
    return sum(int(getattr(a, "nbytes", 0)) for a in value)
