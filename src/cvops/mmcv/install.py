"""``import cvops.mmcv.install`` runs :func:`cvops.mmcv.install_as_mmcv`: the one line for config-driven tools,
e.g. ``custom_imports = dict(imports=["cvops.mmcv.install"], allow_failed_imports=False)`` in an OpenMMLab
config, which mmengine imports before it builds the model."""
from cvops.mmcv import install_as_mmcv

install_as_mmcv()
