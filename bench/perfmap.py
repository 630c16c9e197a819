"""Name streamdp's Numba kernels in a Linux ``perf`` profile of a streamdp command.

    perf record -k CLOCK_MONOTONIC -F 999 -o perf.data python bench/perfmap.py train STORE --epsilon 1 --out M
    perf report -i perf.data --no-children --sort symbol --time START,END

``perf`` names code compiled at run time from ``/tmp/perf-<pid>.map`` (one line per function: start address,
size, name); Numba writes none, so a profile of a streamdp command shows its kernels as bare addresses. This script
runs the command (any ``streamdp`` command line) twice in one process and then writes that map for every function
compiled into streamdp's kernels, the callees each kernel linked into itself included:

* the first run compiles every kernel afresh: ``NUMBA_CACHE_DIR`` is set to an empty temporary directory unless
  the environment sets it (a kernel loaded from Numba's cache carries no list of the functions in it, only its own
  entry point, so its callees and inlined helpers would go unnamed);
* the second is the one to read: its start and end (``CLOCK_MONOTONIC`` seconds, the clock ``perf record -k
  CLOCK_MONOTONIC`` stamps samples with) are printed for ``perf report --time START,END``, which leaves the
  compilation out of the report. The command's ``--out`` (when it has one that did not exist before) is removed
  between the runs.

``--dump DIR`` (before the command) also writes each function's machine code as ``DIR/<address>.bin`` with an index
``DIR/index.txt`` (address, size, name): ``objdump -D -b binary -mi386:x86-64 --adjust-vma=0x<address> FILE``
disassembles it, and ``perf script -F ip,sym`` gives the sampled addresses to find in it. That is how the
selection's Gramian loop was seen to wait on ``Q``'s rows (docs/design-notes.md, ``selection_losses``).

The process holds some 470 MB of compiler state once everything is compiled: a ``--memory-limit`` near 512MB is
refused by the second run (profile with 1GB; the kernels and blocks are the same). Linux with ``perf`` only.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import shutil
import sys
import tempfile
import time

#: The packages whose Numba functions the map names (their modules are imported to find them).
PACKAGES = ("streamdp.kernels", "streamdp.privacy", "streamdp.storage", "streamdp.methods")


def compiled_functions(modules) -> list[tuple[int, str]]:
    """``(address, name)`` of every function compiled into the Numba dispatchers of ``modules``, sorted by address;
    the name is the function's qualified Python name (``_entry@dispatcher`` for a dispatcher's own entry point)."""
    from numba.core.registry import CPUDispatcher

    found: dict[int, str] = {}
    for mod in modules:
        for attr, obj in vars(mod).items():
            if not isinstance(obj, CPUDispatcher):
                continue
            for cres in list(obj.overloads.values()):
                lib = cres.library
                names = [f.name for f in lib._final_module.functions if not f.is_declaration]
                entry = cres.fndesc.llvm_func_name
                for fn in names or [entry]:
                    try:
                        addr = lib.get_pointer_to_function(fn)
                    except Exception:  # noqa: BLE001 - a symbol the library does not export
                        continue
                    if addr and addr not in found:
                        found[addr] = _readable(fn) + (f"@{attr}" if fn == entry else "")
    return sorted(found.items())


def _readable(symbol: str) -> str:
    """``streamdp.kernels.linalg._solve_users_rows`` of a Numba symbol (the name parts of its Itanium-mangled
    nested name, ``_ZN<len><part>...``; ``cpython.`` leads a dispatcher's Python wrapper); else the symbol."""
    at = symbol.find("_ZN")
    if at < 0:
        return symbol
    i, words = at + 3, []
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while j < len(symbol) and symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        words.append(symbol[j:j + n])
        i = j + n
    return ".".join(words) or symbol


def write_map(functions, path: str | None = None, dump: str | None = None) -> str:
    """Write ``functions`` (:func:`compiled_functions`) as ``perf``'s map of this process; each function's size is
    the distance to the next, at most 64 KiB and never past the end of its memory mapping. With ``dump``, each one's
    machine code and an index too."""
    import ctypes

    path = path or f"/tmp/perf-{os.getpid()}.map"
    ends = _mapping_ends()
    rows = []
    for i, (addr, name) in enumerate(functions):
        size = functions[i + 1][0] - addr if i + 1 < len(functions) else 1 << 16
        end = next((e for s, e in ends if s <= addr < e), addr + 1)  # never past the memory mapping it is in
        rows.append((addr, max(1, min(size, 1 << 16, end - addr)), name))
    with open(path, "w") as fh:
        fh.writelines(f"{a:x} {s:x} {n}\n" for a, s, n in rows)
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, "index.txt"), "w") as idx:
            for a, s, n in rows:
                with open(os.path.join(dump, f"{a:x}.bin"), "wb") as fh:
                    fh.write(ctypes.string_at(a, s))
                idx.write(f"{a:x} {s} {n}\n")
    return path


def _mapping_ends() -> list[tuple[int, int]]:
    """``(start, end)`` of this process's memory mappings (``/proc/self/maps``; none elsewhere)."""
    try:
        with open("/proc/self/maps") as fh:
            return [tuple(int(x, 16) for x in line.split(None, 1)[0].split("-")) for line in fh]
    except OSError:
        return []


def streamdp_modules() -> list:
    """Every importable module of :data:`PACKAGES`."""
    mods = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            try:
                mods.append(importlib.import_module(f"{pkg_name}.{info.name}"))
            except Exception:  # noqa: BLE001 - a module with an optional dependency that is absent
                continue
    return mods


def _out_of(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--out="):
            return a.split("=", 1)[1]
    return None


def main(argv: list[str]) -> int:
    dump = None
    if argv[:1] == ["--dump"]:
        dump, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    os.environ.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="streamdp-perfmap-"))
    from streamdp.cli import main as cli

    out = _out_of(argv)
    fresh = out is not None and not os.path.exists(out)
    for run in ("compiling", "profiled"):
        if fresh and os.path.exists(out):
            shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
        start = time.monotonic()
        try:
            cli(list(argv), standalone_mode=False)
        except SystemExit:
            pass
        print(f"perfmap: {run} run: --time {start:.3f},{time.monotonic():.3f}", file=sys.stderr)
    path = write_map(compiled_functions(streamdp_modules()), dump=dump)
    print(f"perfmap: wrote {path}" + (f" and the machine code to {dump}" if dump else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
