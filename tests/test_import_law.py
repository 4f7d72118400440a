"""The import law of DESIGN.md, checked on the source (ast; nothing is imported).

Lower layers never import higher ones: ``record`` <- ``segment``/``index`` <- ``io_pool``
<- ``engines`` <- ``db``/``store`` <- ...; ``tiering`` and ``spark`` sit above the embedded
API. And the DB layer never knows which engine it drives: it reaches engines only through
``seglog.engines.base`` (the protocols) and ``seglog.engines.registry`` (open by name).
Nor which tier: it reaches tiering only through the tier seam (``seglog.tiering.seam``,
the protocols, and the factory the ``seglog.tiering`` package exports).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

PACKAGE_DIR: Final = Path(__file__).resolve().parents[1] / "seglog"

# Module (or package, covering everything under it) -> layer; a module may import its own
# layer and lower ones. Every module must be listed: a new one fails until it is placed.
LAYERS: Final[dict[str, int]] = {
    # Foundations every layer may use.
    "seglog.errors": 0,
    "seglog._fs": 0,
    "seglog._gc": 0,
    "seglog._memory": 0,
    "seglog._routing": 0,
    "seglog._columns": 0,  # compiled (seglog/_columns.c): Record -> Arrow buffers
    "seglog.topics": 0,
    "seglog.record": 1,
    "seglog.segment": 2,
    "seglog.index": 2,
    "seglog.io_pool": 3,
    "seglog.engines": 4,
    # The embedded API (DESIGN: db.py, store.py) and what serves it directly.
    "seglog.db": 5,
    "seglog.db_config": 5,
    "seglog.db_producers": 5,
    "seglog.store": 5,
    "seglog.store_config": 5,
    "seglog.groups": 5,
    "seglog.consumer": 5,
    "seglog.follower": 5,
    "seglog.readonly": 5,
    "seglog.iterators": 5,
    "seglog.subscriptions": 5,
    "seglog": 5,  # the package itself (only exactly: it re-exports the embedded API)
    # The wire contract: what server and client share (no I/O, only errors below it).
    "seglog.cluster.protocol": 1,
    "seglog.cluster.fetch_wire": 1,
    # Replication bookkeeping on top of the replica log seam.
    "seglog.isr": 6,
    # The node server on top of the store; the network client beside it.
    "seglog.cluster": 7,
    "seglog.client": 7,
    # Beside the cluster layer, on top of the storage API.
    "seglog.tiering": 7,
    "seglog.spark": 7,
    # The command line uses everything.
    "seglog.cli": 8,
    "seglog.cli_net": 8,
}

# Known upward imports, each to be removed by the step named. The test fails when one is
# no longer needed, so this list only shrinks.
ALLOWED_UPWARD: Final[dict[tuple[str, str], str]] = {
    # readonly reads a tiered database's manifest and objects without a store.
    ("seglog.readonly", "seglog.tiering.db_tier"): "move tiering orchestration",
    ("seglog.readonly", "seglog.tiering.manifest"): "move tiering orchestration",
    ("seglog.readonly", "seglog.tiering.targets"): "move tiering orchestration",
}

# The DB layer proper: these drive an engine without knowing which one.
DB_LAYER: Final = ("seglog.db", "seglog.db_config", "seglog.store", "seglog.store_config")

# The tier seam (Kafka's RemoteLogManager boundary): db/store depend on the storage API and
# on this, never on concrete tiering classes (DbTier, the manifest, the targets, the
# orchestrator). Not an allowance that shrinks: a permanent, deliberate upward dependency
# on an interface. From the seam module any name; from the package exactly the factory
# that builds the seam (everything else the package re-exports is concrete).
TIER_SEAM_MODULE: Final = "seglog.tiering.seam"
TIER_PACKAGE: Final = "seglog.tiering"
TIER_PACKAGE_API: Final = frozenset({"open_tier_service"})
ENGINE_API: Final = ("seglog.engines", "seglog.engines.base", "seglog.engines.registry")
ALLOWED_ENGINE_IMPORTS: Final[dict[tuple[str, str], str]] = {
    # Follow-up: the defaults of the segment-engine store options (buffer_ms) are defined
    # in segment_writer, which this change left alone; they belong in the engine API.
    ("seglog.store_config", "seglog.engines.segment_writer"): "move engine option defaults",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


MODULES: Final = _modules()


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every seglog module ``module`` imports, anywhere in the file (TYPE_CHECKING and
    function-level imports included: they are dependencies all the same)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "seglog")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "seglog":
                continue
            for alias in node.names:
                # ``from seglog import errors`` imports a module; ``from seglog.x import Y`` a name.
                sub = f"{base}.{alias.name}"
                yield sub if sub in MODULES else base


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for key, layer in LAYERS.items():
        covers = module == key or (key != "seglog" and module.startswith(key + "."))
        if covers and (best is None or len(key) > best[0]):
            best = (len(key), layer)
    return None if best is None else best[1]


def _edges() -> set[tuple[str, str]]:
    return {(m, dep) for m, path in MODULES.items() for dep in _imports(m, path) if dep != m}


def _names_from(path: Path, module: str) -> set[str]:
    """Names ``path`` imports with ``from <module> import ...`` (absolute imports only)."""
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == module
        for alias in node.names
    }


def _through_tier_seam(module: str, dep: str) -> bool:
    """Whether ``module -> dep`` is a DB-layer import of the tier seam (see TIER_SEAM_MODULE)."""
    return module in DB_LAYER and dep in (TIER_SEAM_MODULE, TIER_PACKAGE)


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if _layer(m) is None)
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


def test_lower_layers_never_import_higher_ones() -> None:
    upward = set()
    for module, dep in _edges():
        low, high = _layer(module), _layer(dep)
        assert low is not None and high is not None, (module, dep)
        if high > low and not _through_tier_seam(module, dep):
            upward.add((module, dep))
    unexpected = sorted(upward - ALLOWED_UPWARD.keys())
    assert not unexpected, f"imports of a higher layer: {unexpected}"
    stale = sorted(ALLOWED_UPWARD.keys() - upward)
    assert not stale, f"no longer needed, remove from ALLOWED_UPWARD: {stale}"


def test_db_layer_reaches_engines_only_through_their_api() -> None:
    concrete = {
        (module, dep)
        for module, dep in _edges()
        if module in DB_LAYER and dep.startswith("seglog.engines") and dep not in ENGINE_API
    }
    unexpected = sorted(concrete - ALLOWED_ENGINE_IMPORTS.keys())
    assert not unexpected, f"the DB layer imports a concrete engine: {unexpected}"
    stale = sorted(ALLOWED_ENGINE_IMPORTS.keys() - concrete)
    assert not stale, f"no longer needed, remove from ALLOWED_ENGINE_IMPORTS: {stale}"


# Read-only views of a store another process owns: they read an engine's files only through
# the registry (shard_files, open_reader) and the reader protocols in base, never its layout.
OUT_OF_PROCESS_READERS: Final = ("seglog.follower", "seglog.readonly")


@pytest.mark.parametrize("module", OUT_OF_PROCESS_READERS)
def test_out_of_process_readers_reach_engines_only_through_their_api(module: str) -> None:
    deps = set(_imports(module, MODULES[module]))
    concrete = sorted(d for d in deps if d.startswith("seglog.engines") and d not in ENGINE_API)
    assert not concrete, f"{module} imports a concrete engine module: {concrete}"
    layout = sorted(d for d in deps if d == "seglog.segment" or d.startswith("seglog.segment."))
    assert not layout, f"{module} reads segment files itself: {layout}"


def test_db_layer_reaches_tiering_only_through_the_seam() -> None:
    concrete = sorted(
        (module, dep)
        for module, dep in _edges()
        if module in DB_LAYER and dep.startswith(TIER_PACKAGE) and not _through_tier_seam(module, dep)
    )
    assert not concrete, f"the DB layer imports concrete tiering modules: {concrete}"
    for module in DB_LAYER:
        names = _names_from(MODULES[module], TIER_PACKAGE)
        assert names <= TIER_PACKAGE_API, (
            f"{module} imports {sorted(names - TIER_PACKAGE_API)} from {TIER_PACKAGE}"
        )


@pytest.mark.parametrize("module", ["seglog.db", "seglog.store"])
@pytest.mark.parametrize("engine", ["segment", "memory", "lmdb_engine", "segment_writer"])
def test_db_and_store_import_no_engine(module: str, engine: str) -> None:
    deps = set(_imports(module, MODULES[module]))
    assert f"seglog.engines.{engine}" not in deps


def test_the_checker_sees_imports() -> None:
    # Guards the test itself: a parser that found nothing would pass every rule above.
    edges = _edges()
    assert ("seglog.store", "seglog.engines.registry") in edges
    assert ("seglog.engines.segment", "seglog.segment.journal") in edges
    assert ("seglog.cli", "seglog.errors") in edges  # ``from seglog import errors``
    # ... and the seam rules are not vacuous: db and store do go through it.
    assert ("seglog.db", TIER_SEAM_MODULE) in edges
    assert _names_from(MODULES["seglog.store"], TIER_PACKAGE) == TIER_PACKAGE_API
