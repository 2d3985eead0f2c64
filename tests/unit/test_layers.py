"""The package's layers only look down: topologies -> comms -> rl -> the tools on top."""

import ast
from pathlib import Path

import gossiprl
import topologies

PACKAGE = Path(gossiprl.__file__).parent
LAYERS = {"topologies": 0, "gossiprl.comms": 1, "gossiprl.rl": 2, "gossiprl": 3}
"""A module may import from its own layer and the ones with a lower number."""


def layer_of(module: str) -> int | None:
    for prefix, rank in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def imports_of(path: Path, module: str) -> list[str]:
    """Every project module `path` imports, relative imports resolved against `module`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [name for name in found if layer_of(name) is not None]


def modules():
    for root, name in ((PACKAGE, "gossiprl"), (Path(topologies.__file__).parent, "topologies")):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            yield path, ".".join([name, *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))


def test_every_import_looks_down_the_layers():
    upward = []
    for path, module in modules():
        own = layer_of(module)
        for name in imports_of(path, module):
            if layer_of(name) > own:
                upward.append(f"{module} imports {name}")
    assert upward == []


def test_the_checker_sees_an_upward_import(tmp_path):
    """The test above would pass on a checker that found nothing; this one would not."""
    path = tmp_path / "client.py"
    path.write_text("from ..rl.agent import train\nfrom . import wire\nimport topologies\n")
    names = imports_of(path, "gossiprl.comms.client")
    assert "gossiprl.rl.agent" in names and "gossiprl.comms.wire" in names and "topologies" in names
    assert layer_of("gossiprl.rl.agent") > layer_of("gossiprl.comms.client")
