"""The single layer swap point: ``build_stack(layer_cfg, block_cls, ...)``.

A backbone defines its native block and builds its whole stack through one call::

    self.stack = build_stack(layer_cfg, SASRecBlock, n_layers, n_tokens=n_items + 2, d_model=64, ...)

``layer=standard`` returns a ``Stack`` of native blocks. ``layer=bft`` returns the BFT version of the
same block (``bftrec.layers.bft``): same parameter names and shapes, same mask contract, plus the
precision state λ (BFT.md). The standard path computes no precision and pays nothing for BFT.

Block contract (native blocks):
    ``forward(h: (B, L, D) float, masks: Masks, **ctx) -> (B, L, D)``; optionally ``last_only=True``
    (scoring, ``Stack``) -> (B, 1, D), the last position only.
Blocks never build masks; they receive them (``Masks``), with polarity ``True = may attend``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from bftrec.config import ConfigError
from bftrec.registry import Registry


@dataclass
class Masks:
    """Attention masks handed to every block. Polarity: ``True`` = may attend / is a real token.

    Attributes:
        attn: (B, 1, L, L) bool, query t may attend key j (causal or bidirectional, and key valid).
        valid: (B, L) bool, position holds a real token (not padding).
    """

    attn: torch.Tensor
    valid: torch.Tensor


def build_masks(items: torch.Tensor, causal: bool, key_padding: bool = True) -> Masks:
    """The one shared mask builder. items (B, L) int64 with 0 = padding. ``key_padding=False`` leaves
    padded keys attendable (``attn`` then depends on ``causal`` alone; RecTools' default, SASRec's
    ``model.key_padding_mask=false``); ``valid`` still marks the real tokens."""
    valid = items.ne(0)  # (B, L)
    attn = (valid if key_padding else torch.ones_like(valid))[:, None, None, :]  # (B, 1, 1, L) key may be attended
    if causal:
        L = items.shape[1]
        tril = torch.ones(L, L, dtype=torch.bool, device=items.device).tril()
        attn = attn & tril  # (B, 1, L, L)
    else:
        attn = attn.expand(-1, 1, items.shape[1], -1)
    return Masks(attn=attn, valid=valid)


def masked_softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to ``allowed`` keys; a row with no allowed key is all 0.

    Uses the dtype's finite minimum instead of -inf so that empty rows produce neither NaN values
    nor NaN gradients. logits (..., T, T) float; allowed broadcastable bool.
    """
    neg = torch.finfo(logits.dtype).min
    probs = torch.softmax(logits.masked_fill(~allowed, neg), dim=-1)
    return probs * allowed.any(dim=-1, keepdim=True)


class Stack(nn.Module):
    """A plain stack of native blocks: ``forward(h, items, masks, mech=None, **ctx) -> h``.

    ``last_only_training``: ``last_only`` holds in training too (``trainer.last_position_only``: the loss reads
    the last position alone); the BFT stack, which always computes every position, has no such path.

    ``items`` is unused here; the BFT stack reads it for the initial precision τ. ``mech`` and the
    context key ``tau_input`` (the item embedding for BFT's τ MLP) are accepted for interface parity and
    left untouched (no BFT mechanism in a standard stack); the other ``ctx`` keys go to every block.

    ``last_only=True`` (scoring: only the last position is ranked) is handed to the last block alone,
    which may then return (B, 1, D) instead of (B, L, D); the built-in blocks do, so the last block
    computes one query instead of L. A block without the option ignores it through ``**ctx``, and
    callers take ``[:, -1]`` either way. The BFT stack always returns (B, L, D).
    """

    last_only_training = True

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, h: torch.Tensor, items: torch.Tensor, masks: Masks,
                mech: Optional[dict] = None, last_only: bool = False, **ctx) -> torch.Tensor:
        ctx.pop("tau_input", None)
        for i, block in enumerate(self.blocks):
            if last_only and i == len(self.blocks) - 1:
                h = block(h, masks, last_only=True, **ctx)  # (B, L, D) -> (B, 1, D)
            else:
                h = block(h, masks, **ctx)
        return h


@dataclass
class StandardLayerConfig:
    name: str = "standard"  # the backbone's native block


# name -> layer config dataclass; bftrec.layers.bft adds "bft" and "bft_h" when imported (bftrec/models/__init__.py)
LAYER_CONFIGS: dict[str, type] = {"standard": StandardLayerConfig}
# name -> builder(layer_cfg, block_cls, n_layers, n_tokens, block_kwargs) -> stack module
LAYER_BUILDERS: Registry = Registry("layer")


@LAYER_BUILDERS.register("standard")
def _build_standard(layer_cfg, block_cls, n_layers: int, n_tokens: int, block_kwargs: dict,
                    precision_ctx: dict) -> nn.Module:
    return Stack([block_cls(**block_kwargs) for _ in range(n_layers)])


def build_stack(layer_cfg, block_cls: type, n_layers: int, n_tokens: int,
                precision_ctx: Optional[dict] = None, **block_kwargs) -> nn.Module:
    """Build ``n_layers`` blocks of the kind ``layer_cfg.name`` asks for.

    Args:
        layer_cfg: a typed layer config (``StandardLayerConfig`` or the BFT one).
        block_cls: the backbone's native block class.
        n_layers: number of blocks (>= 1).
        n_tokens: size of the token vocabulary incl. padding and specials (for per-item τ).
        precision_ctx: facts the BFT stack needs at build time (ignored by ``standard``):
            ``input_variance`` (float, mean per-coordinate variance of the layer-0 input at init,
            BFT.md §0 ``tau.scale=embedding``), ``train_counts`` ((n_tokens,) int64 numpy, training
            counts per token id, for ``tau.freq_slope``), ``pad_id`` (int).
        **block_kwargs: passed to every block constructor.
    Raises:
        ConfigError: unknown layer name, or a backbone without support for it.
    """
    if n_layers < 1:
        raise ConfigError(f"model.n_layers={n_layers} must be >= 1")
    if layer_cfg.name not in LAYER_BUILDERS:
        raise ConfigError(f"unknown layer {layer_cfg.name!r}; choose one of {', '.join(LAYER_BUILDERS.names())}")
    return LAYER_BUILDERS.get(layer_cfg.name)(layer_cfg, block_cls, n_layers, n_tokens, block_kwargs,
                                              precision_ctx or {})


def optimizer_param_groups(model: nn.Module, lr: float) -> list[dict]:
    """Optimizer parameter groups: every parameter at ``lr``, except those of a submodule with an
    attribute ``lr_scale != 1`` (BFT's τ, ``layer.tau.lr_scale``), which get ``lr · lr_scale``.

    With no such submodule this is one group holding ``model.parameters()`` in order, so the optimizer
    (and a saved optimizer state) is exactly what ``optimizer(model.parameters(), lr=lr)`` gives.

    Returns:
        a list of ``{"params": [...], "lr": float}`` dicts for ``torch.optim`` constructors.
    """
    scaled: dict[float, list] = {}
    seen: set[int] = set()
    for module in model.modules():
        scale = getattr(module, "lr_scale", 1.0)
        if scale != 1.0:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    scaled.setdefault(float(scale), []).append(p)
    rest = [p for p in model.parameters() if id(p) not in seen]
    return [{"params": rest, "lr": lr}] + [{"params": ps, "lr": lr * s} for s, ps in scaled.items()]


__all__ = ["Masks", "build_masks", "masked_softmax", "Stack", "build_stack", "LAYER_CONFIGS",
           "LAYER_BUILDERS", "StandardLayerConfig", "optimizer_param_groups"]
