"""Backbones, registered by explicit import: one line per backbone, no auto-import.

Adding a backbone = its model file (and its BFT twin ``<name>_bft.py`` beside it), one import line
below, one yaml in configs/model/ (docs/ADD_A_BACKBONE.md). Imports run from models to layers only.
"""
# ruff: noqa: I001, F401  (order matters little, but one line per backbone keeps the recipe readable)
from bftrec.models.base import MODELS, DataInfo, SeqRecModel
from bftrec.layers import bft  # registers layer=bft and layer=bft_h (the twins register with their backbones)

from bftrec.models import sasrec, sasrec_bft  # registers "sasrec" and its BFT twin
from bftrec.models import bert4rec, bert4rec_bft  # registers "bert4rec" and its BFT twin
from bftrec.models import hstu, hstu_bft  # registers "hstu" and its BFT twin
from bftrec.models import gru4rec  # registers "gru4rec" (recurrent; no Transformer layers)
from bftrec.models import pop  # registers "pop" (most popular; counted, not trained)
from bftrec.models import markov  # registers "markov" (item transitions; counted, not trained)

__all__ = ["MODELS", "DataInfo", "SeqRecModel"]
