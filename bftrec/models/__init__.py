"""Backbones, registered by explicit import (one line per backbone; no auto-import)."""
from bftrec.models.base import MODELS, DataInfo, SeqRecModel

from bftrec.models import sasrec  # noqa: F401  registers "sasrec"
from bftrec.layers import bft  # noqa: F401  registers layer=bft
from bftrec.models import bert4rec  # noqa: F401  registers "bert4rec"
from bftrec.models import hstu  # noqa: F401  registers "hstu"

__all__ = ["MODELS", "DataInfo", "SeqRecModel"]
