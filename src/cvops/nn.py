"""``torch.nn`` modules with mmcv/torchvision names and signatures."""
from __future__ import annotations

import torch
from torch import nn

import cvops
