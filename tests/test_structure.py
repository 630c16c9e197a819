"""The house's structure, read from the source (``ast``, nothing imported): who may import whom.

Rules checked here:

* **methods stand alone**: a method module (``streamdp/methods/<name>.py``, not ``_*``,
  ``base`` or ``options``) imports no other method module; the shared parts
  (``methods/_*.py``, ``base``, ``options``) import no method module. What two methods
  share lives in a shared part (``_centering``, ``_biases``, ``_subspace``, ...);
* **no private names across modules**: no module imports a ``_name`` from another
  module of the package;
* **no import cycles** among the modules of ``streamdp.methods``, counting imports
  inside functions too (they run as well, only later).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "streamdp"
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


def imports_of(name: str) -> list[tuple[str, str, int, bool]]:
    """``(module imported, name imported or "", line, inside a function)`` for each import in module ``name``."""
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

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


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
