"""The stream engine: every pass of every method is a map over user blocks plus a reduction.

:class:`Engine` (``map_reduce``, ``imap``, ``foreach``) owns the decisions that no
method should make on its own:

* **scheduling**: every pass runs on Dask; locally (the default) as one task graph on
  Dask's threaded scheduler in this process (:func:`pass_graph`; the Numba kernels release
  the GIL); with ``scheduler=`` (``"dask"``, ``"processes"``, an address or a
  :class:`distributed.Client`) on Dask distributed, one task per block, each reading its
  own block from the store's URL; both paths bound the blocks in flight and combine in
  block order, bit-identical;
* **memory**: at most :attr:`Engine.in_flight` blocks are read-but-not-combined, from
  ``memory_limit`` minus what the process uses (RSS or baseline, declared item-side state,
  Numba's code), over the largest block; locally ``workers`` further blocks are prefetched
  (into reused arrays for a pass whose results keep nothing of them: :class:`_ReadBuffers`);
* **progress**: a bar of each pass's blocks on a terminal (:mod:`streamdp.progress`);
* **determinism**: partials are combined strictly in block order, so the result is the
  same for 1 or N workers and on a cluster; randomness comes from per-block generators;
* **threads**: workers x Numba threads x BLAS threads <= cores
  (:mod:`streamdp.stream.threads`), set for a pass and restored after;
* **why not one distributed client for everything** (issue 30, measured): in-process
  distributed cost 6.9 ms of CPU per block against 0.14 ms for the threaded-scheduler
  graph, so the distributed client runs only where needed (several processes or a cluster).

Design notes (the memory rule, the schedulers, the issue 30 measurements):
docs/design-notes.md#streamdpstreamenginepy.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import functools
import inspect
import os
import queue
import sys
import threading
import weakref
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from streamdp.errors import ParameterError, StoreError
from streamdp.outputs import deferred_interrupts
from streamdp.progress import progress
from streamdp.storage.segments import SegmentedStore
from streamdp.storage.store import Block, RatingStore, open_store
from streamdp.memory import (KERNEL_CODE_BYTES, current_rss, format_size, frozen_collector, kernel_code_loaded,
                             kernels_compiled_here, release_freed_memory, resolve_memory_limit, unmap_large_frees)
from streamdp.stream.state import UserState  # noqa: F401  (re-exported: part of the engine API)
from streamdp.stream.threads import available_cores, numba_threads, thread_budget, thread_limits

#: Bytes of working memory per rating of a block in flight: the int32 item and float32
#: rating as read, a float64 value per rating for kernels, and decompression buffers.
BYTES_PER_RATING = 32

#: The stop events of the local passes still open (a generator read in part and kept, e.g. in a global).
_OPEN_PASSES: "weakref.WeakSet[threading.Event]" = weakref.WeakSet()


def _stop_open_passes() -> None:
    """At interpreter exit, before its worker threads are joined: stop every pass still open.

    A pass's hand-over task waits, on a pool thread, for the caller to take its block; a generator of
    ``Model.recommend_all`` read in part and kept alive never takes it, and the interpreter waited for that thread
    forever. Registered with ``threading._register_atexit``, which runs before non-daemon threads are joined (as
    ``concurrent.futures`` registers its own); ``atexit`` runs after, too late. A dropped generator is closed by
    the garbage collector (its ``finally`` stops the pass) and needs none of this.
    """
    for ev in list(_OPEN_PASSES):
        ev.set()


try:
    threading._register_atexit(_stop_open_passes)
except (AttributeError, RuntimeError):  # pragma: no cover - not CPython, or imported while the interpreter exits
    pass
#: Upper bound on blocks in flight per worker (beyond that, prefetching gains nothing).
MAX_IN_FLIGHT_PER_WORKER = 3
#: Blocks in flight beyond one per worker when the memory limit bounds the window (``Engine.blocks_in_flight``).
TIGHT_LOOKAHEAD = 1
#: ``scheduler=`` value of Dask in this process (``distributed.Client(processes=False)``).
IN_PROCESS = "dask"
#: ``scheduler=`` value of a Dask ``LocalCluster`` of ``workers`` single-threaded processes started for the run.
PROCESSES = "processes"

_store_cache: dict[tuple, RatingStore] = {}
#: The block readers of a store itself, which a worker opening it by path has too (a view adds its own).
_PLAIN_READS = (RatingStore.read_block, SegmentedStore.read_block)
_store_lock = threading.Lock()


def _cached_store(path: str, generation: str | None = None, spec=None) -> RatingStore:
    """One opened store per process, path and write of the store (used by tasks on cluster workers).

    ``generation``: the write the run opened (its ``generation`` attribute); a worker that opens another (the store
    replaced, or a segment appended or compacted since: ``ingest --append``) refuses, so that no pass reads blocks
    of two segment lists. ``spec``: the view of it the run reads (:meth:`RatingStore.remote_view`), made once per
    process too.
    """
    if spec is not None:
        base = _cached_store(path, generation)
        with _store_lock:
            s = _store_cache.get((path, generation, spec.key))
            if s is None:
                s = _store_cache[(path, generation, spec.key)] = spec.view(base)
            return s
    with _store_lock:
        s = _store_cache.get((path, generation))
        if s is None:
            s = open_store(path)
            if generation is not None and s.attrs.get("generation") != generation:
                raise StoreError(f"{path}: the store changed while this run read it (now generation "
                                 f"{s.attrs.get('generation')}, opened as generation {generation}): its results would "
                                 f"mix two stores' ratings; nothing was released, run again")
            _store_cache[(path, generation)] = s
        return s


def _remote_block(path: str, b: int, split: str, fn: Callable, inner: int, generation: str | None = None,
                  spec=None):
    """A task on a distributed worker: read block ``b`` there (through the run's view ``spec``) and apply ``fn``."""
    blk = None if split is None else _cached_store(path, generation, spec).read_block(b, split)
    with numba_threads(inner):
        return fn(blk, b)


def _remote_spec(store):
    """``store.remote_view()``; a view that cannot be made on a worker is refused (its tasks would read other blocks)."""
    spec = store.remote_view() if isinstance(store, RatingStore) else None
    if spec is None and isinstance(store, RatingStore) and type(store).read_block not in _PLAIN_READS:
        raise NotImplementedError(f"{type(store).__name__} has no remote_view(): cluster workers cannot read it")
    return spec


def add_into(acc, part):
    """``acc += part``, returned: the in-place sum that most passes use as :meth:`Engine.map_reduce`'s ``combine``."""
    acc += part
    return acc


class _ReadBuffers:
    """A local pass's blocks read into item and rating arrays reused from one block to the next.

    Under :func:`~streamdp.memory.unmap_large_frees` (a run whose window the memory limit
    bounds) each block's arrays are fresh mappings, paid in page faults as they are decoded
    into and unmapped when freed: measured on 1M-rating blocks of the 100M store, one thread
    (busy machine), ``read_block`` took 11-12 ns of CPU per rating so, 7.5-8 ns into reused
    arrays, 3.5 ns without the per-block mappings. A pass holds at most as many pairs as
    blocks in flight, each of the largest block's size (what the budget counts per block).
    A pair goes back to the pool once ``fn`` returned, only if nothing refers to it that did
    not when it was read (a view of the block's arrays kept in the result: that pair is
    dropped, never overwritten).
    """

    def __init__(self, size: int):
        self.size = size
        self.free: list = []
        self.lent: dict = {}  # id of a lent item array -> the references counted when its block was read
        self.lock = threading.Lock()

    @classmethod
    def of(cls, engine, split: str):
        """The pool of a pass over ``split``, or ``None`` when the store reads no blocks into given arrays."""
        if "into" not in inspect.signature(engine.store.read_block).parameters:
            return None
        return cls(engine.store.read_into_size(split))

    def read(self, read, b: int, split: str):
        with self.lock:
            pair = self.free.pop() if self.free else None
        if pair is None:
            pair = (np.empty(self.size, np.int32), np.empty(self.size, np.float32))
        blk = read(b, split, into=lambda indptr: pair)
        del pair
        if self._ours(blk):
            refs = _references(blk)  # counted as release counts them: the same code, whatever the interpreter
            with self.lock:
                self.lent[id(blk.items.base)] = refs
        return blk

    def release(self, blk) -> None:
        """Take back the arrays of ``blk`` (a block :meth:`read` returned) when nothing refers to them that did
        not when it was read (a view of them kept in ``fn``'s result: the pair is dropped)."""
        if blk is None or not self._ours(blk):
            return
        with self.lock:
            refs = self.lent.pop(id(blk.items.base), None)
        if refs is not None and _references(blk) == refs:
            with self.lock:
                self.free.append((blk.items.base, blk.ratings.base))

    def _ours(self, blk) -> bool:
        items, ratings = blk.items.base, blk.ratings.base
        return items is not None and ratings is not None and len(items) == self.size and len(ratings) == self.size


def _references(blk) -> tuple:
    """The reference counts of a block's item and rating arrays and of the arrays they are views of."""
    return (sys.getrefcount(blk.items.base), sys.getrefcount(blk.ratings.base), sys.getrefcount(blk.items),
            sys.getrefcount(blk.ratings))


class Engine:
    """Runs passes over a rating store's user blocks.

    Parameters
    ----------
    store : RatingStore or str
        The store (or its path/URL).
    workers : int, optional
        Worker threads (default: all cores). With ``workers=1`` blocks are processed
        strictly in order.
    scheduler : str or distributed.Client, optional
        ``None``: Dask's threaded scheduler in this process. ``"dask"``: Dask distributed in this process
        (``Client(processes=False)``, ``workers`` threads). ``"processes"``: a Dask
        ``LocalCluster`` of ``workers`` single-threaded processes, started for the
        engine and closed with it. Else the address of a Dask distributed scheduler
        (``tcp://host:port``) or a client. ``map_reduce`` then runs on Dask;
        ``foreach`` (shared in-memory item state) always runs in local threads.
    memory_limit : str or int, optional
        Peak memory budget (``"512MB"``); default half of the available RAM.
    state_bytes : int
        Bytes the caller holds in item-side state for the whole run (e.g. V and its
        per-worker partial sums); subtracted from the budget before sizing blocks.
    state : str, optional
        ``--state URL``: where methods put their per-user state (temporary run
        directories, :class:`~streamdp.stream.driver.Run`); default beside the store.
        On a cluster it must be reachable by the workers under the same name.

    Examples
    --------
    >>> import os, tempfile
    >>> from streamdp.storage.generate import generate_store
    >>> d = tempfile.mkdtemp()
    >>> s = generate_store(os.path.join(d, "s.zarr"), n_users=200, n_items=30, ratings_per_user=5,
    ...                    rank=2, seed=0, block_users=50)
    >>> with Engine(s, workers=2, memory_limit="4GB") as eng:
    ...     eng.map_reduce(lambda blk, b: blk.nnz, lambda a, x: a + x, 0) == s.n_ratings
    True
    """

    def __init__(self, store, *, workers: int | None = None, scheduler=None, memory_limit=None,
                 state_bytes: int = 0, state: str | None = None):
        self.store: RatingStore = store if isinstance(store, RatingStore) else open_store(store)
        self.cores = available_cores()
        self.memory_limit = resolve_memory_limit(memory_limit)
        self._client = None
        self._own_client = False
        self._cluster = None
        self.in_process = False
        self.state = state
        if scheduler is not None:
            if scheduler == IN_PROCESS:
                self._client, self._own_client = _in_process_client(thread_budget(workers, self.cores)[0]), True
            elif scheduler == PROCESSES:
                self._cluster = _local_cluster(thread_budget(workers, self.cores)[0])
                self._client, self._own_client = _connect(self._cluster.scheduler_address)
            else:
                self._client, self._own_client = _connect(scheduler)
            info = self._client.scheduler_info()["workers"]
            self.in_process = bool(info) and all(str(a).startswith("inproc://") for a in info)
            if self.in_process:
                # Dask in this process: the cluster's code path on local threads (no pickling of blocks)
                self.workers, self.inner_threads = thread_budget(workers, self.cores)
            else:
                n = sum(w.get("nthreads", 1) for w in info.values())
                self.workers = int(workers or max(1, n))
                self.inner_threads = 1
            self.scheduler_name = "dask" if self.in_process else "distributed"
        else:
            self.workers, self.inner_threads = thread_budget(workers, self.cores)
            self.scheduler_name = "threads"
        self.state_bytes = int(state_bytes)
        self._nnz_cache: dict[str, np.ndarray] = {}
        release_freed_memory()  # what planning freed (the accountant's arrays) is not part of the baseline
        #: RSS of the process before this engine's item-side state and blocks: its imports, code and caches
        self.baseline = current_rss()
        self.in_flight = self.blocks_in_flight()

    # -- sizing ------------------------------------------------------------------------
    def block_bytes(self, split: str = "train", extra_per_block: int = 0) -> int:
        """Footprint of the largest block of ``split`` while it is in flight."""
        if split not in self._nnz_cache:
            self._nnz_cache[split] = self.store.block_nnz(split)
        nnz = self._nnz_cache[split]
        biggest = int(nnz.max()) if len(nnz) else 0
        # a view that copies blocks as it reads them (a time window: storage/timeline.py) says what it adds
        per = BYTES_PER_RATING + int(getattr(self.store, "extra_bytes_per_rating", 0))
        return biggest * per + (self.store.block_users + 1) * 16 + int(extra_per_block)

    def blocks_in_flight(self, split: str = "train", extra_per_block: int = 0) -> int:
        """How many blocks may be read-but-not-combined at once within the memory budget.

        Raises :class:`~streamdp.errors.ParameterError` when not even one block fits.
        """
        release_freed_memory()  # the previous pass's blocks, freed: resident no more
        used, code = self.memory_used()
        per = self.block_bytes(split, extra_per_block)
        n = int((self.memory_limit - used) // max(per, 1))
        if n < 1:
            parts = f"{format_size(self.baseline)} of interpreter and libraries, " \
                    f"{format_size(self.state_bytes)} of item-side state" + \
                    (f", {format_size(code)} for Numba's code" if code else "")
            compiled = kernels_compiled_here() if kernel_code_loaded() else 0
            rest = used - self.baseline - self.state_bytes - code
            if compiled and rest > 0:  # a cold cache: what LLVM keeps of the kernels this run compiled
                parts += (f"; the rest, {format_size(rest)}, mostly Numba's compiler after compiling {compiled} "
                          "kernel(s) in this run: they are cached now, so the same command run again holds that "
                          "much less")
            raise ParameterError(
                f"--memory-limit {format_size(self.memory_limit)} is too small: the process holds "
                f"{format_size(used)} besides its blocks ({parts}) and one block needs {format_size(per)}")
        cap = MAX_IN_FLIGHT_PER_WORKER * self.workers + 1
        if n < cap:
            # The limit, not the cap, bounds the window: from here on, large arrays get their own mapping and go
            # back to the system when freed. Otherwise glibc keeps each thread's freed blocks in its arenas (up to
            # 64 MB each), which no planning sees: at 1e9 ratings under --memory-limit 512MB the fit's RSS
            # crept to 565 MB over its 11 passes. It costs page faults on every fresh block (a 100M-rating fit
            # under 512MB: peak 492 -> 384 MB, 28.7 -> 38.0 s; under 2GB, 20.0-22.3 s unbounded against 22.9-23.9 s
            # so), so a run with room to spare does not pay it.
            unmap_large_frees()
            # And the window holds one block beyond the workers': the 100M fit under 512MB took the same wall
            # time with 3 blocks in flight on 2 workers as with the 4-5 the limit allowed (18.8 / 22.5 / 20.9 s
            # against 22.9 / 20.6 s, alternated), its peak RSS 388-393 MB against 420-422 MB.
            n = min(n, self.workers + TIGHT_LOOKAHEAD)
        return max(1, min(n, cap))

    def memory_used(self) -> tuple[int, int]:
        """``(bytes, code)``: what the process holds besides the blocks in flight, its RSS now or, when larger
        (state not yet allocated, kernels not yet loaded), the baseline plus the declared item-side state plus
        ``code``, Numba's code still to load in this process (0 once loaded, or when the kernels run on a
        cluster's workers), plus what a segmented store may keep of its small segments (``cache_bytes``)."""
        local = self._client is None or self.in_process
        code = KERNEL_CODE_BYTES if local and not kernel_code_loaded() else 0
        kept = int(getattr(self.store, "cache_bytes", 0))  # a segmented store's small segments, kept as read
        return max(current_rss(), self.baseline + self.state_bytes + code + kept), code

    @property
    def n_blocks(self) -> int:
        return self.store.n_blocks

    @property
    def distributed(self) -> bool:
        return self._client is not None

    # -- passes ------------------------------------------------------------------------
    def map_reduce(self, fn: Callable[[Block, int], Any], combine: Callable[[Any, Any], Any], init: Any, *,
                   split: str | None = "train", blocks: Iterable[int] | None = None, extra_per_block: int = 0,
                   desc: str = "pass", show: bool | None = None, keeps_blocks: bool = True) -> Any:
        """``combine(...combine(combine(init, fn(B0, 0)), fn(B1, 1))..., fn(Bn, n))`` in block order.

        ``fn(block, b)`` runs on a worker (it must not mutate shared state; on a
        cluster it and what it references are pickled); ``combine`` runs in the
        calling thread, in block order, so the result does not depend on the
        number of workers. ``extra_per_block`` is the size of one partial result in
        bytes (e.g. an ``n_items x k`` float64 matrix) to keep it inside the budget.
        ``desc`` labels the pass's progress bar (blocks combined); ``show`` forces it on or off.
        ``split=None``: the engine reads nothing and ``fn(None, b)`` reads what it needs
        itself (``streamdp verify`` reads both splits unchecked); the budget is then
        sized by the train blocks plus ``extra_per_block``.
        ``keeps_blocks=False`` promises that ``fn``'s result holds nothing of its block (no view
        of its arrays): a local pass then reads the blocks into arrays reused from block to
        block (:class:`_ReadBuffers`).
        """
        order = list(range(self.n_blocks)) if blocks is None else [int(b) for b in blocks]
        window = self.blocks_in_flight(split or "train", extra_per_block)
        acc = init
        if self._client is not None:
            run = self._run_distributed
        else:
            run = functools.partial(self._run_local, reuse=not keeps_blocks)
        # closing(): on an error or Ctrl-C in `combine` the pass stops (and its workers finish) here and
        # now, not whenever the traceback that holds the generator is freed
        with progress(total=len(order), desc=desc, unit="block", show=show) as bar, \
                contextlib.closing(run(fn, order, split, window)) as parts:
            for b, part in parts:
                acc = combine(acc, part)
                bar.update(1)
        return acc

    def imap(self, fn: Callable[[Block, int], Any], *, split: str = "train", blocks: Iterable[int] | None = None,
             extra_per_block: int = 0, desc: str = "pass"):
        """Yield ``(b, fn(block_b, b))`` in block order: :meth:`map_reduce` for a caller that consumes the partials
        one by one (e.g. writes each to a file) instead of reducing them; local threads or the cluster alike.

        Closing the generator early stops the pass (its workers finish their blocks).
        """
        order = list(range(self.n_blocks)) if blocks is None else [int(b) for b in blocks]
        window = self.blocks_in_flight(split, extra_per_block)
        run = self._run_distributed if self._client is not None else self._run_local
        with progress(total=len(order), desc=desc, unit="block") as bar, \
                contextlib.closing(run(fn, order, split, window)) as parts:
            for b, part in parts:
                yield b, part
                bar.update(1)

    def foreach(self, fn: Callable[[Block, int], Any], *, split: str = "train", order: Sequence[int] | None = None,
                extra_per_block: int = 0, desc: str = "pass") -> list:
        """Call ``fn(block, b)`` for each block on local threads (Dask's threaded scheduler); the results in ``order``.

        For Hogwild-style methods that update shared in-memory item state from
        several threads. With one worker the blocks are processed strictly in
        ``order`` (default: block order), one after the other; the next blocks are
        read ahead either way. Always local, also when a scheduler was given.
        ``desc`` labels the pass's progress bar (blocks done, in ``order``).
        """
        order = list(range(self.n_blocks)) if order is None else [int(b) for b in order]
        window = self.blocks_in_flight(split, extra_per_block)
        out = []
        with progress(total=len(order), desc=desc, unit="block") as bar, \
                contextlib.closing(self._run_local(fn, order, split, window)) as parts:  # see map_reduce
            for _, part in parts:
                out.append(part)
                bar.update(1)
        return out

    def _run_local(self, fn, order, split, window, reuse: bool = False):
        """The pass as one graph on Dask's threaded scheduler (:func:`pass_graph`); ``(b, part)`` yielded in order.

        The graph runs in a driver thread on a pool of ``2 x workers + 1`` threads (``workers`` computing and
        ``workers`` reading ahead at most, one handing over); each block's result waits for the caller to have
        consumed it (``yield`` returned) before the block ``window`` places later may be read, so at most ``window``
        blocks are read-but-not-combined. ``reuse``: the blocks are read into :class:`_ReadBuffers`.
        """
        import dask.threaded

        read = self.store.read_block if split is not None else (lambda b, split: None)
        reads = _ReadBuffers.of(self, split) if reuse and split is not None else None
        if reads is not None:
            read = functools.partial(reads.read, read)
        inner, w = self.inner_threads, self.workers
        computing, reading = threading.BoundedSemaphore(w), threading.BoundedSemaphore(w)
        handed: queue.Queue = queue.Queue()
        stop = threading.Event()
        _OPEN_PASSES.add(stop)  # set at interpreter exit if the caller still holds the pass (_stop_open_passes)

        def read_task(b, _gate):
            with reading:  # as many readers as workers: no more threads busy than the pool had
                return None if stop.is_set() else read(b, split)

        def compute_task(blk, b, _prev=None):
            with computing:
                if stop.is_set():
                    return None
                with numba_threads(inner):
                    part = fn(blk, b)
                if reads is not None:
                    reads.release(blk)
                return part

        def hand_task(i, b, part, _prev):
            if stop.is_set():
                return None
            done = threading.Event()
            handed.put((b, part, done))
            while not (done.wait(0.05) or stop.is_set()):
                pass
            return None

        graph, last = pass_graph(order, window, read_task, compute_task, hand_task, strict=w == 1)

        def drive():
            try:
                dask.threaded.get(graph, last, pool=pool, num_workers=2 * w + 1)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
                handed.put(exc)

        with thread_limits(inner), cf.ThreadPoolExecutor(max_workers=2 * w + 1,
                                                         thread_name_prefix="streamdp-work") as pool:
            driver = threading.Thread(target=drive, name="streamdp-pass", daemon=True)
            try:
                with deferred_interrupts():  # a driver started is a driver joined below
                    driver.start()
                for _ in order:
                    item = handed.get()
                    if isinstance(item, BaseException):
                        raise item
                    b, part, done = item
                    try:
                        yield b, part
                    finally:
                        done.set()
            finally:
                # the workers finish their blocks before the pass ends, also on Ctrl-C (taken after): none may
                # still write per-user state once the caller has moved on (e.g. removed its run directory)
                stop.set()
                with deferred_interrupts():
                    driver.join()
                    pool.shutdown(wait=True, cancel_futures=True)

    def _run_distributed(self, fn, order, split, window):
        client = self._client
        path = _worker_path(self.store.path)
        generation = (getattr(self.store, "attrs", None) or {}).get("generation")
        spec = _remote_spec(self.store)
        inner = self.inner_threads
        pending: collections.deque = collections.deque()
        it = iter(order)

        def submit(b):
            # one task per block; a task lost with its worker is run again by Dask on another worker (up to
            # distributed.scheduler.allowed-failures times): a pass's fn must therefore be idempotent, which
            # per-user state written to the owning block's own chunk (slot chosen by epoch) is
            return client.submit(_remote_block, path, b, split, fn, inner, generation, spec, pure=False)

        limits = thread_limits(inner) if self.in_process else contextlib.nullcontext()
        try:
            with limits:
                for b in it:
                    pending.append((b, submit(b)))
                    if len(pending) >= window:
                        break
                while pending:
                    b, fut = pending.popleft()
                    part = fut.result()
                    fut.release()
                    nxt = next(it, None)
                    if nxt is not None:
                        pending.append((nxt, submit(nxt)))
                    yield b, part
        finally:
            for _, fut in pending:
                fut.cancel()
            if pending:
                # as on local threads: no task of this pass may still write per-user state once the caller moves
                # on; cancelled tasks that already run are waited for (bounded: the window)
                with deferred_interrupts():
                    distributed_wait([f for _, f in pending])

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        if self._client is not None and self._own_client:
            self._client.close()
        self._client = None
        if self._cluster is not None:
            self._cluster.close()
        self._cluster = None

    def __enter__(self):
        # the passes' full garbage collections traverse only what the run creates (memory.frozen_collector)
        self._frozen = frozen_collector()
        self._frozen.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        finally:
            frozen, self._frozen = getattr(self, "_frozen", None), None
            if frozen is not None:
                frozen.__exit__(None, None, None)

    def describe(self) -> dict:
        """The engine's configuration, for a model's ``model.json``.

        Not the blocks in flight: under a tight ``--memory-limit`` they follow from the
        largest block's number of ratings, an exact statistic of the data.
        """
        return {"workers": self.workers, "inner_threads": self.inner_threads, "cores": self.cores,
                "scheduler": self.scheduler_name, "memory_limit": self.memory_limit}


def pass_graph(order: Sequence[int], window: int, read, compute, hand, *, strict: bool = False):
    """A pass over the blocks ``order`` as one Dask graph, and the key of its last task.

    For the ``i``-th block ``b``: ``("read", i)`` = ``read(b, gate)``, ``("part", i)`` = ``compute(block, b)``,
    ``("hand", i)`` = ``hand(i, b, part, previous hand)``. The hands form a chain (block order); a read waits for the
    hand ``window`` places earlier (the bounded window: its ``gate``). ``strict``: each compute also waits for the
    previous one (one worker processes blocks strictly in order).
    """
    g: dict = {("hand", -1): None}
    for i, b in enumerate(order):
        g[("read", i)] = (read, b, ("hand", max(i - window, -1)))
        g[("part", i)] = (compute, ("read", i), b) + ((("part", i - 1),) if strict and i else ())
        g[("hand", i)] = (hand, i, b, ("part", i), ("hand", i - 1))
    return g, ("hand", len(order) - 1)


def _worker_path(path: str) -> str:
    """The store's path as a cluster worker must open it: a local path made absolute (workers have
    their own working directory), a URL as it is."""
    return path if "://" in path else os.path.abspath(path)


@contextlib.contextmanager
def dask_session(scheduler, workers: int | None = None):
    """A scheduler value several engines in a row can share: for ``"dask"`` and ``"processes"`` the client is
    started once here (and closed at the end), anything else is passed through.

    ``streamdp train`` runs the training and the evaluation after it in one session, so a ``processes`` run
    starts its worker processes once.
    """
    if scheduler not in (IN_PROCESS, PROCESSES):
        yield scheduler
        return
    w = thread_budget(workers)[0]
    if scheduler == IN_PROCESS:
        with _in_process_client(w) as client:
            yield client
    else:
        from distributed import Client

        with _local_cluster(w) as cluster, Client(cluster, set_as_default=False) as client:
            yield client


def runs_in_this_process(scheduler) -> bool:
    """Whether ``scheduler`` (an ``Engine``'s ``scheduler=`` value, after :func:`dask_session`) runs tasks in this
    process: ``None``, ``"dask"`` or a client whose workers are all in-process."""
    if scheduler is None or scheduler == IN_PROCESS:
        return True
    if isinstance(scheduler, str):
        return False
    info = scheduler.scheduler_info().get("workers", {})
    return bool(info) and all(str(a).startswith("inproc://") for a in info)


def distributed_wait(futures) -> None:
    """Wait until ``futures`` are finished, cancelled or failed (whatever they raise is not re-raised)."""
    from distributed import wait

    try:
        wait(futures, timeout=60)
    except Exception:  # noqa: BLE001 - best effort: the pass already failed or was interrupted
        pass


def _in_process_client(workers: int):
    """A Dask distributed client whose scheduler and one worker of ``workers`` threads live in this process."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a declared extra
        raise ParameterError("--scheduler dask needs the 'distributed' package (pip install "
                             "'streamdp[distributed]')") from None
    return Client(processes=False, n_workers=1, threads_per_worker=int(workers), dashboard_address=None,
                  scheduler_kwargs={"dashboard": False}, set_as_default=False)


def _local_cluster(workers: int):
    """A Dask ``LocalCluster`` of ``workers`` single-threaded worker processes on this machine."""
    try:
        from distributed import LocalCluster
    except ImportError:  # pragma: no cover - distributed is a declared extra
        raise ParameterError("--scheduler processes needs the 'distributed' package (pip install "
                             "'streamdp[distributed]')") from None
    return LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True, dashboard_address=None,
                        scheduler_kwargs={"dashboard": False})


def _check_address(address: str) -> None:
    """Refuse an address that is no scheduler address before a ``Client`` is made.

    distributed's own parsers (scheme, then host:port), the same ``ValueError`` its ``Client`` would raise: a
    ``Client`` built on a bad address could instead fail inside its start-up (an ``AssertionError`` with no
    message was seen once in a full test run, where a previous test of the same process had used a cluster).
    """
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, location = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)
    except ValueError as exc:
        raise ParameterError(f"--scheduler {address}: not a scheduler address like tcp://host:port ({exc})") \
            from None


def _connect(scheduler):
    """A distributed client from an address (owned) or a client passed in (borrowed)."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a declared extra
        raise ParameterError("--scheduler needs the 'distributed' package (pip install 'streamdp[distributed]')") \
            from None
    if isinstance(scheduler, Client):
        return scheduler, False
    _check_address(str(scheduler))
    try:
        return Client(str(scheduler), timeout="10s", set_as_default=False), True
    except (OSError, TimeoutError) as exc:
        raise ParameterError(f"--scheduler {scheduler}: cannot connect ({exc.__class__.__name__}: {exc})") from None
    except ValueError as exc:  # distributed's address parser: "missing port number", "unknown scheme"...
        raise ParameterError(f"--scheduler {scheduler}: not a scheduler address like tcp://host:port ({exc})") \
            from None
