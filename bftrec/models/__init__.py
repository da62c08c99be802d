"""Backbones, registered by explicit import: one line per backbone, no auto-import.

Adding a backbone = its model file, one import line below, one yaml in configs/model/.
"""
# ruff: noqa: I001, F401  (order matters little, but one line per backbone keeps the recipe readable)
from bftrec.models.base import MODELS, DataInfo, SeqRecModel
from bftrec.layers import bft  # registers layer=bft and its block variants

from bftrec.models import sasrec  # registers "sasrec"
from bftrec.models import bert4rec  # registers "bert4rec"
from bftrec.models import hstu  # registers "hstu"

__all__ = ["MODELS", "DataInfo", "SeqRecModel"]
