"""``src/cvops`` uses the public APIs of torch and numba only: any torch or numba release may change their
private parts. Each module's syntax tree (code only: docstrings and comments may name what is avoided) is
searched for private torch (``torch._<name>`` attributes and imports, ``torch.ops.mkldnn``) and private numba
(``numba.core``, the dispatcher's ``_compile_for_args``, assignments to ``numba.config``)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cvops"


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``torch._C.DispatchKey`` for such an attribute chain (import aliases resolved), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id)] + parts[::-1])


def _private_module(module: str) -> bool:
    return module.startswith("torch._") or module == "numba.core" or module.startswith("numba.core.")


def private_uses(source: str) -> list[str]:
    """Every use of private torch or numba API in ``source`` (Python code), as ``line: what``."""
    tree = ast.parse(source)
    aliases = {}  # local name -> module, from `import torch as t` / `from numba import config`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                aliases[name.asname or name.name.split(".")[0]] = name.name if name.asname else name.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch", "numba"):
            for name in node.names:
                aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    found = []

    def report(node, what):
        found.append(f"{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {n.name}" for n in node.names if _private_module(n.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _private_module(node.module):
                report(node, f"from {node.module} import ...")
            for name in node.names:
                if _private_module(f"{node.module}.{name.name}") or (node.module == "torch" and name.name.startswith("_")):
                    report(node, f"from {node.module} import {name.name}")
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node, aliases) or ""
            if node.attr == "_compile_for_args":
                report(node, "_compile_for_args")
            elif dotted.startswith("torch._") or dotted.startswith("torch.ops.mkldnn") or _private_module(dotted):
                report(node, dotted)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (_dotted(target, aliases) or "").startswith("numba.config."):
                    report(node, f"assignment to {_dotted(target, aliases)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "getattr"):
            obj = _dotted(node.args[0], aliases) if node.args else None
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else ""
            if node.func.id == "setattr" and obj == "numba.config":
                report(node, "setattr(numba.config, ...)")
            elif obj == "torch" and isinstance(name, str) and name.startswith("_"):
                report(node, f"getattr(torch, {name!r})")
            elif name == "_compile_for_args":
                report(node, "_compile_for_args")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def _files():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        yield pytest.param(path, id=rel)


@pytest.mark.parametrize("path", list(_files()))
def test_module_uses_public_torch_and_numba_only(path):
    assert private_uses(path.read_text()) == []


# What the scan must catch (and what it must let pass), so that a clean scan means something.
CAUGHT = [
    "import torch\nkey = torch._C.DispatchKey.AutocastCPU",
    "import torch\ntorch._assert_async(ok)",
    "import torch\nimport torch._dynamo",
    "from torch._library.custom_ops import OPDEFS",
    "from torch._jit_internal import BroadcastingList2",
    "from torch import _C",
    "import torch as t\nt._C._dispatch_key_for_device('cpu')",
    "import torch\ntorch.ops.mkldnn._linear_pointwise(x, w, b, 'none', [], '')",
    "import torch\nok = hasattr(torch.ops.mkldnn, '_linear_pointwise')",
    "import torch\nf = getattr(torch, '_assert_async')",
    "from numba.core import cgutils",
    "import numba.core.dispatcher",
    "import numba\nd = numba.core.registry.CPUDispatcher",
    "d._compile_for_args = fn",
    "import numba\nnumba.config.LOOP_VECTORIZE = 0",
    "import numba\nsetattr(numba.config, 'SLP_VECTORIZE', 1)",
    "from numba import config\nconfig.SLP_VECTORIZE = 1",
]
PASSED = [
    "import torch\nfrom torch.jit.annotations import BroadcastingList2\nn = torch.ops.cvops.psamask_forward",
    "import torch\nv = weight._version\ny = torch.autocast('cpu', enabled=False)",
    "import numba\nn = numba.config.NUMBA_NUM_THREADS\nfrom numba.extending import intrinsic",
    '"""``torch._assert_async`` is private; numba.config.LOOP_VECTORIZE = 0 is global."""\n# torch._C',
]


@pytest.mark.parametrize("source", CAUGHT)
def test_the_scan_catches_private_use(source):
    assert private_uses(source)


@pytest.mark.parametrize("source", PASSED)
def test_the_scan_lets_public_use_pass(source):
    assert private_uses(source) == []
