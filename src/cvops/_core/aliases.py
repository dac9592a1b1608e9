"""Registering cvops's drop-in namespaces under a peer library's module names in ``sys.modules``.

``cvops.spconv.install_as_spconv`` and ``cvops.mmcv.install_as_mmcv`` both replace a peer's package (or one
subpackage of it) by cvops modules, so that code which imports the peer itself and is not the user's to edit
(OpenPCDet, mmdet, mmseg, mmdet3d) runs on cvops unchanged.
"""
from __future__ import annotations

import sys
import types


def drop_modules(name: str) -> None:
    """Remove ``name`` and every ``name.*`` from ``sys.modules``, so that no later import mixes the peer's
    modules with the ones registered in their place."""
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def new_package(name: str, doc: str) -> types.ModuleType:
    """An empty package ``name`` (its submodules come from ``sys.modules`` only), registered there."""
    package = types.ModuleType(name, doc)
    package.__path__ = []
    sys.modules[name] = package
    return package


def register(name: str, module: types.ModuleType) -> None:
    """Make ``import name`` give ``module``, and ``module`` an attribute of its parent package as a normal
    import would, unless the parent has that attribute already (``mmcv.ops.nms`` stays the function)."""
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and not hasattr(sys.modules[parent], child):
        setattr(sys.modules[parent], child, module)


def register_submodules(package: str, alias: str) -> None:
    """Register every imported submodule ``package.x.y`` of ``package`` also as ``alias.x.y``."""
    prefix = package + "."
    for key, module in list(sys.modules.items()):
        if key.startswith(prefix):
            sys.modules[alias + "." + key[len(prefix):]] = module
