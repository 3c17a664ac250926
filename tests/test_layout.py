"""The code's layout rules, enforced here rather than in docstrings (issue 17).

- No import cycles among the shipped packages. Every import counts: module-level, inside
  a function (a "late import" is a cycle that waits), and under ``TYPE_CHECKING`` (a cycle
  for the reader and for mypy). Parts that must talk back type against a small public
  contract instead, as the operators' tools do with :mod:`sip_bridge.bridge_surface` and
  the media clock with :class:`sip_bridge.media.media_clock.ClockedCall`.
- ``jitter/``, ``resample/``, ``model_runtime/`` and ``agent/`` never import
  ``sip_bridge``: they are the libraries the bridge is built from.
- No module over 500 lines without a ``# size:`` comment at its top saying why.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sip_bridge", "agent", "jitter", "resample", "model_runtime")
LIBRARIES = ("agent", "jitter", "resample", "model_runtime")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module of ours that an imported name lives in (None: not ours)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                # "from pkg import mod" imports the module pkg.mod, else a name in pkg
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                         for a in node.names]  # fmt: skip
            else:
                continue
            targets |= {t for n in names if (t := _owner(n, mods)) is not None and t != mod}
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_any_kind_of_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_walk_sees_late_and_type_only_imports() -> None:
    graph = import_graph(_modules())
    assert "sip_bridge.media.call_media" in graph["sip_bridge.server"]  # module level
    assert "sip_bridge.web.web_server" in graph["sip_bridge.server"]  # in a function
    assert "sip_bridge.bridge_surface" in graph["sip_bridge.ops.operator_view"]  # TYPE_CHECKING
    assert "agent.words" in graph["agent.dialogue.backchannel"]  # from agent.words import normalize


def test_no_import_cycles() -> None:
    found = cycles(import_graph(_modules()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_libraries_never_import_the_bridge() -> None:
    graph = import_graph(_modules())
    bad = {
        mod: sorted(t for t in targets if t.split(".")[0] == "sip_bridge")
        for mod, targets in graph.items()
        if mod.split(".")[0] in LIBRARIES
    }
    assert not {m: t for m, t in bad.items() if t}, bad


def test_no_module_is_long_without_saying_why() -> None:
    long = []
    for path in _modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES and not lines[0].startswith("# size: "):
            long.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert not long, f"over {MAX_LINES} lines with no '# size:' reason at the top: {long}"


#: What each sub-package of sip_bridge may import, as its docstring says: other packages
#: (a name ending in "." means the whole sub-package) and top-level modules by name.
AGENT_TOP = {
    "agent", "agent.base", "agent.ticks", "agent.words", "agent.transcript",
    "agent.voice_settings", "agent.redaction", "agent.model_guard", "agent.wav_format",
}  # fmt: skip
ALLOWED = {
    "sip_bridge.sip": {"sip_bridge.config.", "sip_bridge.media."},
    "sip_bridge.media": {"agent", "jitter", "resample", "sip_bridge.sip.", "sip_bridge.logs"},
    "sip_bridge.config": {"agent", "sip_bridge.sip.", "sip_bridge.media."},
    "sip_bridge.ops": {
        "agent", "model_runtime", "sip_bridge.config.", "sip_bridge.sip.", "sip_bridge.media.",
        "sip_bridge", "sip_bridge.bridge_surface", "sip_bridge.logs",
    },
    "sip_bridge.web": {
        "agent", "resample", "sip_bridge.config.", "sip_bridge.ops.",
        "sip_bridge.bridge_surface", "sip_bridge.agents", "sip_bridge.logs",
    },
    "sip_bridge.script": {
        "agent", "jitter", "resample", "model_runtime",
        "sip_bridge.config.", "sip_bridge.sip.", "sip_bridge.media.",
    },
    # agent/: the top holds the interface and what several share
    "agent.voice": {*AGENT_TOP, "agent.dialogue.", "model_runtime", "resample"},
    "agent.dialogue": {*AGENT_TOP, "agent.lines."},
    "agent.lines": {*AGENT_TOP, "resample"},
}  # fmt: skip


def _allowed(target: str, allowed: set[str]) -> bool:
    if target.split(".")[0] in allowed:  # a library: agent, jitter, ...
        return True
    return target in allowed or any(a.endswith(".") and target.startswith(a) for a in allowed)


def test_each_sub_package_imports_only_what_its_docstring_allows() -> None:
    graph = import_graph(_modules())
    found = {}
    for package, allowed in ALLOWED.items():
        assert (ROOT / package.replace(".", "/") / "__init__.py").read_text().count("May import")
        for mod, targets in graph.items():
            if mod == package or mod.startswith(package + "."):
                bad = [t for t in targets if not t.startswith(package + ".")
                       and t != package and not _allowed(t, allowed)]  # fmt: skip
                if bad:
                    found[mod] = sorted(bad)
    assert not found, found
    # every module is in a sub-package but the few each top level keeps
    packages = {p.split(".")[1] for p in ALLOWED}
    top = {m for m in graph if m.count(".") == 1 and m.split(".")[1] not in packages}
    assert {m for m in top if m.startswith("agent.")} == {
        *AGENT_TOP - {"agent"}, "agent.speech_to_speech",
    }  # fmt: skip
    assert {m for m in top if m.startswith("sip_bridge.")} == {
        "sip_bridge.agents", "sip_bridge.bridge_surface", "sip_bridge.cli", "sip_bridge.logs",
        "sip_bridge.native", "sip_bridge.server",
    }, top  # fmt: skip
