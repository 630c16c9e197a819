"""The house's structure, read from the source (``ast``, nothing imported): who may import whom.

Rules checked here:

* **methods stand alone**: a method module (``streamdp/methods/<name>.py``, not ``_*``,
  ``base`` or ``options``) imports no other method module; the shared parts
  (``methods/_*.py``, ``base``, ``options``) import no method module. What two methods
  share lives in a shared part (``_centering``, ``_biases``, ``_subspace``, ...);
* **no private names across modules**: no module imports a ``_name`` from another
  module of the package;
* **no import cycles** in the package, nor among ``bench/``'s modules, counting imports
  inside functions too (they run as well, only later);
* **layers** (:data:`LAYERS`, lowest first): base (the package root: errors, outputs,
  progress, memory, jsonio, owner, manifest, model_dir) < kernels < storage < privacy <
  stream < models (``serving/``: model format, local solve, ranking, batch, evaluate) <
  methods < entry points (``workflows/``: training, api, sweep, demo; at the root: cli). A
  module imports only its own layer and those below; the exceptions are listed with their
  reason in :data:`ALLOWED_UPWARD`;
* **short functions**: no function or method in ``streamdp/`` or ``bench/`` is over
  :data:`MAX_FUNCTION_LINES` lines (``def`` line to last line, decorators not counted, a
  nested function counted in its own right and inside the one around it); split a long
  one along what it does (parse / validate / write, plan / fit / release);
* **short module docstrings**: every module docstring in ``streamdp/`` is at most
  :data:`MAX_DOCSTRING_LINES` lines (what the module does, its public names, the decisions
  a reader must know); the derivations, tables and measurements go to
  ``docs/design-notes.md``, and every ``docs/design-notes.md#anchor`` a module names is a
  heading there.

``python tests/test_structure.py [N]`` lists the functions over N lines (default 80), longest first.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "streamdp"
SHARED_METHOD_MODULES = {"streamdp.methods", "streamdp.methods.base", "streamdp.methods.options"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(target: str) -> str | None:
    """The package module ``target`` names (a module, or a name in one), ``None`` outside the package."""
    if not target.startswith("streamdp"):
        return None
    while target not in MODULES and "." in target:
        target = target.rsplit(".", 1)[0]
    return target if target in MODULES else None


@functools.lru_cache(maxsize=None)
def _parse(source: str, path: str) -> ast.Module:
    """``ast.parse``, once per text and run: the tests here walk the same ~200 files several times (only read)."""
    return ast.parse(source, path)


@functools.lru_cache(maxsize=None)
def imports_of(name: str, source: str | None = None) -> tuple[tuple[str, str, int, bool], ...]:
    """``(module imported, name imported or "", line, inside a function)`` for each import in module ``name``.

    ``source``: read that text as the module's instead of its file (to test the rules themselves).
    """
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    mod = _resolve(a.name)
                    if mod:
                        out.append((mod, "", child.lineno, inner))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    if full in MODULES:  # `from pkg import submodule`
                        out.append((full, "", child.lineno, inner))
                    elif _resolve(base):
                        out.append((_resolve(base), a.name, child.lineno, inner))
            visit(child, inner)

    visit(_parse(path.read_text() if source is None else source, str(path)), False)
    return tuple(out)


def graph(modules=None) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file)."""
    names = MODULES if modules is None else modules
    return {m: {t for t, _, _, _ in imports_of(m) if t in names and t != m} for m in names}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def is_method_module(name: str) -> bool:
    return (name.startswith("streamdp.methods.") and name not in SHARED_METHOD_MODULES
            and not name.rsplit(".", 1)[1].startswith("_"))


def test_the_walker_sees_imports_inside_functions_and_relative_ones():
    found = {(t, n) for t, n, _, _ in imports_of("streamdp.methods")}
    assert ("streamdp.methods.base", "Method") in found
    assert any(inner for *_, inner in imports_of("streamdp.cli"))
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("streamdp.methods")))
def test_a_method_module_imports_no_other_method(name):
    bad = sorted({(t, line) for t, _, line, _ in imports_of(name) if is_method_module(t) and t != name})
    assert not bad, (f"{name} imports the method module(s) {bad}: move what they share to a shared part "
                     f"(streamdp/methods/_*.py)")


def test_no_private_names_imported_across_modules():
    bad = [f"{m}:{line} imports {n} from {t}" for m in MODULES for t, n, line, _ in imports_of(m)
           if n.startswith("_") and not n.startswith("__") and t != m]
    assert not bad, "\n".join(bad)


def test_no_import_cycles_among_the_methods():
    methods = {m: p for m, p in MODULES.items() if m.startswith("streamdp.methods.")}
    assert not cycles(graph(methods))


#: The layers, lowest first: a module may import its own layer and the layers below, never one above.
#: Privacy (mechanisms, accountant, ledger, store budget) sits between storage (whose ledger files it keeps beside
#: the store) and the stream engine (whose runs draw noise); the released model (its format, the users' local
#: solve, evaluation) sits below the methods, which write it; the entry points (training orchestration, the Python
#: API, sweep, the CLI) are above everything.
LAYERS = (
    ("base", ("streamdp._version", "streamdp.errors", "streamdp.jsonio", "streamdp.owner", "streamdp.outputs",
              "streamdp.progress", "streamdp.memory", "streamdp.manifest", "streamdp.model_dir")),
    ("kernels", ("streamdp.kernels",)),
    ("storage", ("streamdp.storage",)),
    ("privacy", ("streamdp.privacy",)),
    ("stream", ("streamdp.stream",)),
    ("models", ("streamdp.serving",)),
    ("methods", ("streamdp.methods",)),
    ("entry points", ("streamdp.workflows", "streamdp.cli", "streamdp.__main__", "streamdp")),
)

#: Imports that go up a layer, each with its reason; a new one fails the test until it is moved or listed here.
#: (None today: the store writer gets the privacy-budget ledger's part in a replacement handed down by the package
#: root, see streamdp/storage/writer.py ``install_ledger_keeper``.)
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(name: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            # the package root names only itself: a module listed nowhere must fail, not fall into its layer
            if name == p or (p != "streamdp" and name.startswith(p + ".")):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    assert best is not None, f"{name} is in no layer of tests/test_structure.py::LAYERS: add it"
    return best[0]


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_the_folders_show_the_layers():
    """The package root holds the base layer and the package's front door; each folder is one layer."""
    front = {"streamdp.__main__", "streamdp.cli"}
    bad = []
    for m, path in MODULES.items():
        if path.parent == PKG and path.name != "__init__.py" and m not in front and layer_of(m) != 0:
            bad.append(f"{m} ({LAYERS[layer_of(m)][0]}) sits at the package root, which holds the base layer: "
                       f"move it to its layer's folder")
        elif path.parent != PKG:
            folder = f"streamdp.{path.relative_to(PKG).parts[0]}"
            if layer_of(m) != layer_of(folder):
                bad.append(f"{m} ({LAYERS[layer_of(m)][0]}) is not in the layer of its folder {folder}")
    assert not bad, "\n".join(bad)


def upward_imports(m: str, source: str | None = None) -> list[str]:
    """The imports of module ``m`` (or of ``source`` read as ``m``) that go up a layer and are not allowed."""
    return [f"{m}:{line} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
            for t, _, line, _ in imports_of(m, source) if layer_of(t) > layer_of(m) and (m, t) not in ALLOWED_UPWARD]


def test_no_module_imports_a_layer_above_its_own():
    bad = [b for m in MODULES for b in upward_imports(m)]
    assert not bad, "\n".join(sorted(set(bad)))


def test_an_import_up_a_layer_is_seen_also_inside_a_function():
    """The rule itself: the store writer importing the budget ledger (what it did until the ledger was handed down)."""
    up = "import os\n\ndef install():\n    from streamdp.privacy.budget import carried_over\n"
    assert upward_imports("streamdp.storage.writer", up) == [
        "streamdp.storage.writer:4 (storage) imports streamdp.privacy.budget (privacy)"]
    assert upward_imports("streamdp.storage.writer", "import streamdp.cli\n") == [
        "streamdp.storage.writer:1 (storage) imports streamdp.cli (entry points)"]
    assert upward_imports("streamdp.storage.writer", "from streamdp.storage import remote\n") == []  # its own layer
    assert upward_imports("streamdp.privacy.budget", "from streamdp.storage import remote\n") == []  # below


def test_the_allowed_upward_imports_still_exist():
    edges = {(m, t) for m in MODULES for t, _, _, _ in imports_of(m)}
    assert not set(ALLOWED_UPWARD) - edges, "an allowed upward import is gone: remove it from ALLOWED_UPWARD"


def test_no_import_cycles_in_the_package():
    found = cycles(graph())
    assert not found, f"import cycles (imports inside functions included): {found}"


def test_every_method_module_is_loaded_without_being_listed_anywhere():
    """A new method is one new module: the registry finds the modules the rules above call method modules."""
    import sys

    from streamdp.methods import METHODS, load_builtin, method_modules

    on_disk = sorted(m for m in MODULES if is_method_module(m))
    assert method_modules() == on_disk
    load_builtin()
    assert all(m in sys.modules for m in on_disk)
    registered_from = {cls.__module__ for cls in METHODS.values()}
    assert registered_from <= set(on_disk)
    assert set(on_disk) - registered_from == {"streamdp.methods.lowrank"}  # its own command, not a --method


def bench_graph() -> dict[str, set[str]]:
    """``bench`` module -> the ``bench`` modules it imports (anywhere in the file)."""
    names = {p.stem: p for p in sorted((ROOT / "bench").glob("*.py")) if p.stem != "__init__"}
    g = {}
    for name, p in names.items():
        targets = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                targets |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
            elif isinstance(node, ast.ImportFrom) and node.module == "bench":
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
                targets.add(node.module.split(".")[1])
        g[name] = {t for t in targets if t in names and t != name}
    return g


def test_no_import_cycles_in_bench():
    assert "run" in bench_graph()["__main__"]  # the walker sees bench's imports
    found = cycles(bench_graph())
    assert not found, f"import cycles in bench/ (move what two modules share into a third): {found}"


#: No function longer than this (lines from ``def`` to its last line; decorators not counted).
MAX_FUNCTION_LINES = 120


def function_lengths(source: str, path: str = "<source>") -> dict[str, int]:
    """``"path::qualified.name"`` -> lines (``def`` line to last line) of each function and method in ``source``."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{path}::{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(_parse(source, path), "")
    return out


def all_function_lengths() -> dict[str, int]:
    out = {}
    for top in ("streamdp", "bench"):
        for p in sorted((ROOT / top).rglob("*.py")):
            out.update(function_lengths(p.read_text(), p.relative_to(ROOT).as_posix()))
    return out


def test_the_length_counter_counts_from_def_to_the_last_line_and_nested_ones_too():
    src = "@decorated\ndef f(a,\n      b):\n    def g():\n        return 1\n    return g\n\n\nclass C:\n    def m(self):\n        pass\n"
    assert function_lengths(src) == {"<source>::f": 5, "<source>::f.g": 2, "<source>::C.m": 2}
    long = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert [n for n, k in function_lengths(long).items() if k > MAX_FUNCTION_LINES] == ["<source>::f"]


def test_no_function_is_over_120_lines():
    long = {n: k for n, k in all_function_lengths().items() if k > MAX_FUNCTION_LINES}
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them along what they do: parse / validate / "
                      f"write, plan / fit / release): {dict(sorted(long.items()))}")


#: No module docstring in ``streamdp/`` longer than this (lines of its text, as ``ast.get_docstring`` gives it).
MAX_DOCSTRING_LINES = 40
DESIGN_NOTES = ROOT / "docs" / "design-notes.md"


def docstring_lines(source: str, path: str = "<source>") -> int:
    """Lines of the module docstring of ``source`` (0 without one)."""
    doc = ast.get_docstring(_parse(source, path), clean=False)
    return len(doc.splitlines()) if doc else 0


def test_the_docstring_counter_counts_the_docstrings_lines():
    assert docstring_lines('"""One line."""\n\nx = 1\n') == 1
    assert docstring_lines('"""Title.\n\nBody.\n"""\n') == 3
    assert docstring_lines("x = 1\n") == 0
    assert docstring_lines('"""' + "line\n" * 41 + '"""\n') == 41 > MAX_DOCSTRING_LINES


def test_no_module_docstring_is_over_40_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in sorted(PKG.rglob("*.py"))
            if (n := docstring_lines(p.read_text(), str(p))) > MAX_DOCSTRING_LINES}
    assert not long, (f"module docstrings over {MAX_DOCSTRING_LINES} lines (keep what the module does, its public names "
                      f"and the decisions; move derivations, tables, measurements and history to "
                      f"docs/design-notes.md, a section per module, and link it): {long}")


def markdown_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page (lower case, punctuation dropped, spaces to ``-``)."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_the_design_notes_links_in_the_package_name_sections_that_exist():
    assert "streamdpstorageingestpy" in markdown_anchors("## `streamdp/storage/ingest.py`\n")
    anchors = markdown_anchors(DESIGN_NOTES.read_text())
    links = {(p.relative_to(ROOT).as_posix(), a) for p in sorted(PKG.rglob("*.py"))
             for a in re.findall(r"docs/design-notes\.md#([\w-]+)", p.read_text())}
    assert links, "no module links a section of docs/design-notes.md"
    bad = sorted((p, a) for p, a in links if a not in anchors)
    assert not bad, f"links to sections docs/design-notes.md does not have: {bad}"


if __name__ == "__main__":
    import sys

    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    for name, n in sorted(all_function_lengths().items(), key=lambda kv: (-kv[1], kv[0])):
        if n > limit:
            print(f"{n:5d}  {name}")
