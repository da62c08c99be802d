"""The Bayesian Filtering Transformer layer (``layer=bft``, ``layer=bft_h``), as in ``docs/BFT.md``.

Source: Long et al., "Precision Tracked Transformer via Kalman Filtering, Kriging and Process Noise"
(arXiv 2605.18832, 2026). Labels follow BFT.md: **[paper]** = stated by the paper's summary,
**[bftrec]** = our completion.

The layer library knows no backbone: the pure formulas live in ``bftrec.layers.precision``; this
file holds the config, the initial precision τ, the block mixin (the precision state and the softmax
kriging observe step), the variant registry, and the stack that carries ``(h, λ)``. Each backbone's
BFT twin lives beside its native block and registers itself (``bftrec/models/<name>_bft.py``:
``sasrec_bft`` pre-LN, ``bert4rec_bft`` post-LN, ``hstu_bft`` pointwise/sandwich). Imports run from
``bftrec.models`` to ``bftrec.layers`` only.

Structure (how to add a backbone's BFT twin, ``docs/ADD_A_BACKBONE.md``)::

    @register_variant(NativeBlock)              # key = NativeBlock.__name__
    class BFTNativeBlock(BFTBlockMixin, NativeBlock):
        def __init__(self, *native_args, bft_cfg, **native_kwargs):
            super().__init__(*native_args, **native_kwargs)
            self.init_bft(width=D, n_heads=H, bft_cfg=bft_cfg)
        def forward(self, h, lam, masks, run=None, **ctx) -> (h, lam | None, stats)

``h`` is (B, T, D); ``lam`` is the (n, D) float32 precision of the n valid positions ("rows", see
``bftrec.layers.precision``): padding has no precision at all, so no precision work is spent on it.
A block with softmax attention whose ``attn`` has ``heads(x)``, ``out``, ``attn_drop`` and ``n_heads``
(``bftrec.models.sasrec.SelfAttention``) reuses ``BFTBlockMixin.kriging_observe`` for BFT.md §1.

A variant subclasses the native block, so parameter names and shapes are the native ones and a
standard ``state_dict`` loads with ``strict=False`` (missing keys: only the BFT extras ``theta_q``,
``s0sq``, ``s0sq_ready`` per block and the stack's τ). Post-LN (BERT4Rec) adds
``precision.layernorm_precision`` after each residual (§2) and ``precision.ffn_jacobian_diag`` (no LN
term, §3); HSTU uses ``predict_precision(lam, None, Q, ...)`` and the sandwich moments of BFT.md §4
(``precision.sandwich_stats``).

Cost (BFT.md §5.8): the softmax, attention dropout, value path, kriging moments and Kish sums are one
autograd node (``precision.kriging_attention``: α̃ saved once, one (B, H, T, T) gradient), and so is
the FFN Jacobian (it recomputes the pre-activation on the valid rows, so no (B, T, F) gradient);
padding has no precision rows, so every per-token precision step runs on the valid positions only.
``reference_observe = True`` on a block runs the reference composition instead (tests compare the
two). ``scripts/bench_layer.py`` measures the cost.

The BFT extras live where backbone initialisers do not reach: ``theta_q`` and the τ table are plain
``nn.Parameter``s (not ``nn.Linear``/``nn.Embedding``), and τ sits on the stack, not in ``blocks``.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bftrec.config import ConfigError, check_choice, upgrade_legacy_layer  # noqa: F401  (re-exported)
from bftrec.layers import LAYER_BUILDERS, LAYER_CONFIGS, Masks, masked_softmax
from bftrec.layers.precision import (
    compiling,
    gather_head_rows,
    gather_rows,
    geometric_mean_d,
    kriging_attention,
    kriging_bias,
    observe_from_stats,
    observe_precision,
    scatter_rows,
    valid_rows,
)
from bftrec.registry import Registry

log = logging.getLogger(__name__)

TAU_KINDS = ("item", "mlp")
UNITS = ("count", "h")
# the valid tau.scale values of each bft.units (BFT.md §0, §7)
TAU_SCALES = {"count": ("count", "mean_count"), "h": ("embedding", "unit")}
PRECISION_MODES = ("learned", "uniform")


# --------------------------------------------------------------------------------------------------
# Config (configs/layer/bft.yaml, configs/layer/bft_h.yaml; keys read like BFT.md)
# --------------------------------------------------------------------------------------------------
@dataclass
class TauConfig:
    """Initial precision ``λ⁰ = exp(τ)`` (BFT.md §0, §7)."""

    kind: str = "item"          # item: learned table (n_tokens, dims) [paper]; mlp: τ₀ + MLP(item embedding) [paper]
    scale: str = "count"        # where τ starts [bftrec]. units=count: count (τ₀ = 0, one observation) |
    #                             mean_count (τ₀ = log n̄, set by calibration);
    #                             units=h: embedding (τ₀ = log(1/v₀)) | unit (τ₀ = 0)
    dims: int = 1               # 1 (broadcast over D) or D (one τ per coordinate)
    freq_slope: float = 0.0     # adds slope·(log(1+count) − mean) to the starting τ [bftrec]
    mlp_hidden: int = 16        # hidden width of the τ MLP (kind=mlp)
    lr_scale: float = 1.0       # > 0: τ's learning rate relative to the model's (a per-item row learns only when
    #                             its item occurs); an optimizer param group (optimizer_param_groups)


@dataclass
class BFTParams:
    """Filtering settings (BFT.md §1–§3, §7)."""

    units: str = "count"                # count: precision counted in observations (§7, v2) | h: in the units of h (v1)
    precision: str = "learned"          # learned | uniform (zero attention bias and K=1; λ still computed)
    prior_dof: float = 1.0              # ν₀ of the scaled-inverse-χ² prior, > 0, not learned
    s0_momentum: float = 0.01           # EMA momentum of the s₀² buffers, in (0, 1]
    detach_precision_grad: bool = False  # stop gradients from precision into activations and block weights
    q_init_ratio: float = 0.1           # Q starts at q_init_ratio / mean λ⁰
    clamp_min: float = 1e-8             # guard clamps on precisions and variances (valid positions only)
    clamp_max: float = 1e8


@dataclass
class BFTLayerConfig:
    """``layer=bft``: the BFT twin of the backbone's block, v2 defaults (``bft.units=count``, BFT.md §7).

    Raises:
        ConfigError: on construction (hence when a yaml is merged into it, at start), for a bad
            ``units``, ``tau.scale`` or any other value ``check_bft_config`` refuses.
    """

    name: str = "bft"
    tau: TauConfig = field(default_factory=TauConfig)
    bft: BFTParams = field(default_factory=BFTParams)

    def __post_init__(self) -> None:
        check_bft_config(self)


@dataclass
class BFTHLayerConfig(BFTLayerConfig):
    """``layer=bft_h``: the same layer with v1 defaults, precision in the units of ``h`` (ablation, BFT.md §0)."""

    name: str = "bft_h"
    tau: TauConfig = field(default_factory=lambda: TauConfig(scale="embedding"))
    bft: BFTParams = field(default_factory=lambda: BFTParams(units="h"))


LAYER_CONFIGS["bft"] = BFTLayerConfig
LAYER_CONFIGS["bft_h"] = BFTHLayerConfig


def check_bft_config(cfg: BFTLayerConfig, d_model: Optional[int] = None) -> None:
    """Validate a BFT layer config; raise a one-line ``ConfigError`` naming key, value and valid choices."""
    t, b = cfg.tau, cfg.bft
    check_choice(t.kind, TAU_KINDS, "layer.tau.kind")
    check_choice(b.units, UNITS, "layer.bft.units")
    valid = TAU_SCALES[b.units]
    if t.scale not in valid:
        other = next(u for u in UNITS if u != b.units)
        if t.scale in TAU_SCALES[other]:
            hint = " (or use layer=bft_h)" if other == "h" else ""
            raise ConfigError(f"layer.tau.scale={t.scale} belongs to layer.bft.units={other}, not to "
                              f"layer.bft.units={b.units}; set layer.bft.units={other}{hint}, or choose "
                              f"layer.tau.scale from {', '.join(valid)}")
        raise ConfigError(f"layer.tau.scale={t.scale!r} is not valid under layer.bft.units={b.units}; choose one of "
                          f"{', '.join(valid)} (layer.bft.units={other}: {', '.join(TAU_SCALES[other])})")
    check_choice(b.precision, PRECISION_MODES, "layer.bft.precision")
    if not b.prior_dof > 0:
        raise ConfigError(f"layer.bft.prior_dof={b.prior_dof} is not valid; it must be > 0 (ν₀, e.g. 1)")
    if not 0.0 < b.s0_momentum <= 1.0:
        raise ConfigError(f"layer.bft.s0_momentum={b.s0_momentum} is not valid; it must be in (0, 1]")
    if not b.q_init_ratio > 0:
        raise ConfigError(f"layer.bft.q_init_ratio={b.q_init_ratio} is not valid; it must be > 0")
    if not 0.0 < b.clamp_min < b.clamp_max:
        raise ConfigError(f"layer.bft.clamp_min={b.clamp_min}, layer.bft.clamp_max={b.clamp_max} are not valid; "
                          f"need 0 < clamp_min < clamp_max")
    if not t.lr_scale > 0:
        raise ConfigError(f"layer.tau.lr_scale={t.lr_scale} is not valid; it must be > 0 "
                          f"(1 = the model's learning rate)")
    if t.mlp_hidden < 1:
        raise ConfigError(f"layer.tau.mlp_hidden={t.mlp_hidden} is not valid; it must be >= 1")
    if d_model is not None and t.dims not in (1, d_model):
        raise ConfigError(f"layer.tau.dims={t.dims} is not valid; choose 1 or {d_model} (= the model width D)")


# --------------------------------------------------------------------------------------------------
# Initial precision τ (BFT.md §0)
# --------------------------------------------------------------------------------------------------
def starting_tau(cfg: TauConfig, n_tokens: int, precision_ctx: dict) -> torch.Tensor:
    """Starting log-precision per token id [bftrec] (BFT.md §0, "Scale" and ``tau.freq_slope``).

    ``τ₀ = log(1/v₀)`` (``tau.scale=embedding``, ``v₀ = precision_ctx["input_variance"]``) or 0
    (``unit``; under ``bft.units=count`` both ``count`` and ``mean_count``, whose ``log n̄`` the
    calibration pass adds, ``BFTStack.calibration``), plus ``slope · (log(1+count) − mean over real
    items)`` with training counts ``precision_ctx["train_counts"]`` ((N+1,) int64, real items only;
    ids beyond it, the specials, keep offset 0).

    Returns:
        (n_tokens,) float32.
    Raises:
        ConfigError: the backbone did not provide what the setting needs.
    """
    if cfg.scale == "embedding":
        v0 = precision_ctx.get("input_variance")
        if v0 is None or not (math.isfinite(float(v0)) and float(v0) > 0):
            raise ConfigError(f"layer.tau.scale=embedding needs a positive input_variance from the backbone "
                              f"(got {v0!r}); use layer.tau.scale=unit")
        tau0 = math.log(1.0 / float(v0))
    else:
        tau0 = 0.0
    tau = torch.full((n_tokens,), tau0, dtype=torch.float32)
    if cfg.freq_slope != 0.0:
        counts = precision_ctx.get("train_counts")
        if counts is None:
            raise ConfigError(f"layer.tau.freq_slope={cfg.freq_slope} needs training counts from the backbone; "
                              f"use layer.tau.freq_slope=0")
        c = torch.as_tensor(np.asarray(counts), dtype=torch.float64)[:n_tokens]  # (N+1,)
        logc = torch.log1p(c[1:])  # real items 1..N
        off = torch.zeros(n_tokens, dtype=torch.float64)
        off[1:len(c)] = cfg.freq_slope * (logc - logc.mean())  # specials and padding keep offset 0
        tau = tau + off.float()
    return tau


class InitialPrecision(nn.Module):
    """``λ⁰_t = exp(τ_{x_t})`` [paper] (BFT.md §0).

    ``tau.kind=item``: a learned table ``tau`` of shape (n_tokens, dims); ``n_tokens`` includes the
    padding id 0 (its row is unused: padding is λ=0 through the mask) and every special token (such as
    BERT4Rec's ``[MASK]``), which therefore has its own learned τ.

    ``tau.kind=mlp``: ``τ = τ_start[x] + MLP(e_x)`` with hidden ``tau.mlp_hidden`` (GELU) and the last
    layer zero at start. ``e_x`` is the item embedding only, without dropout: positions add no
    precision (BFT.md §0). The backbone hands it to the stack as ``tau_input=`` (a callable
    ``items (B, L) int64 -> (B, L, D)``, called only for ``kind=mlp``, or a tensor). ``τ_start`` (a
    buffer) holds τ₀ and the fixed ``freq_slope`` offset.

    All parameters are plain ``nn.Parameter``s so that backbone initialisers (which re-init
    ``nn.Linear`` / ``nn.Embedding``) never touch them. ``lr_scale`` (``tau.lr_scale``) asks the
    optimizer for ``lr · lr_scale`` on them (``bftrec.layers.optimizer_param_groups``).
    """

    def __init__(self, cfg: TauConfig, n_tokens: int, d_model: int, tau_start: torch.Tensor) -> None:
        super().__init__()
        self.kind, self.dims = cfg.kind, cfg.dims
        self.lr_scale = float(cfg.lr_scale)  # read by bftrec.layers.optimizer_param_groups
        if cfg.kind == "item":
            self.tau = nn.Parameter(tau_start[:, None].repeat(1, cfg.dims).float())  # (n_tokens, dims)
        else:
            self.register_buffer("tau_start", tau_start.float())  # (n_tokens,)
            hid = cfg.mlp_hidden
            bound = 1.0 / math.sqrt(d_model)  # nn.Linear's default init for the first layer
            self.mlp_w1 = nn.Parameter(torch.empty(hid, d_model).uniform_(-bound, bound))  # (hid, D)
            self.mlp_b1 = nn.Parameter(torch.empty(hid).uniform_(-bound, bound))  # (hid,)
            self.mlp_w2 = nn.Parameter(torch.zeros(cfg.dims, hid))  # (dims, hid), zero at start
            self.mlp_b2 = nn.Parameter(torch.zeros(cfg.dims))  # (dims,)

    def start_values(self) -> torch.Tensor:
        """(n_tokens,) float32 τ at start (item: the table's current mean over dims)."""
        return (self.tau.mean(1) if self.kind == "item" else self.tau_start).detach()

    @torch.no_grad()
    def shift_(self, delta: float) -> None:
        """Add ``delta`` to every token's τ (``tau.scale=mean_count``: ``τ₀ = log n̄``, BFT.md §7)."""
        (self.tau if self.kind == "item" else self.tau_start).add_(delta)

    def forward(self, items: torch.Tensor, emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        """items (...) int64 [, emb (..., D)] -> τ (..., dims) float32 (log-precision)."""
        if self.kind == "item":
            return F.embedding(items, self.tau).float()  # (..., dims)
        if emb is None:
            raise ValueError("tau.kind=mlp needs the item embedding: the backbone must pass tau_input= to the stack")
        hid = F.gelu(F.linear(emb.float(), self.mlp_w1.float(), self.mlp_b1.float()))  # (..., hid)
        return self.tau_start[items][..., None] + F.linear(hid, self.mlp_w2, self.mlp_b2)  # (..., dims)


# --------------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------------
@dataclass
class LayerRun:
    """What the stack asks of one block forward.

    Attributes:
        calibrate: set ``s₀²`` from this forward before using it (``BFTStack.calibration``).
        need_lam: compute the predicted precision ``λ''`` (the stack skips it for the last layer of a
            plain forward, where nothing consumes it).
        want_stats: return per-position mechanism statistics (BFT.md §6).
        probe: a dict to record min/max of every clamped quantity on valid positions, or None.
        rows: (n,) int64 flat indices ``b·T + t`` of the valid positions, the order of the λ rows
            (computed once per forward by the stack); None = the block computes them from the mask.
    """

    calibrate: bool = False
    need_lam: bool = True
    want_stats: bool = False
    probe: Optional[dict] = None
    rows: Optional[torch.Tensor] = None


def fp32(device_type: str):
    """Autocast off: every precision quantity is computed in float32 (BFT.md "Notation")."""
    return torch.autocast(device_type=device_type, enabled=False)


def record(probe: Optional[dict], name: str, x: torch.Tensor) -> None:
    """Append min/max of the rows ``x`` (n, D) (valid positions) to ``probe[name]``."""
    if probe is not None and x.numel():
        probe.setdefault(name, []).append((float(x.detach().min()), float(x.detach().max())))


class BFTBlockMixin:
    """The precision state every BFT block carries [bftrec] (BFT.md §1, §3).

    - ``theta_q`` (D,) parameter: ``Q = exp(θ_Q)`` per coordinate, learned (BFT.md §3).
    - ``s0sq`` (D,) float32 buffer: prior scale ``s₀²`` per value coordinate (heads concatenated).
    - ``s0sq_ready`` () bool buffer: ``s₀²`` was calibrated or set from a first training batch.

    ``s₀²`` semantics (BFT.md §1): a forward uses the value the buffer held before it; the stack
    updates it after the forward, in training only, with no gradient (``update_prior``).
    """

    # False: the observe step runs as one autograd node (``precision.kriging_attention``, the fast path);
    # True: the reference composition of small functions it is tested against (tests only)
    reference_observe: bool = False

    def init_bft(self, width: int, n_heads: int, bft_cfg: BFTParams) -> None:
        self.width, self.n_heads_bft, self.bft_cfg = width, n_heads, bft_cfg
        self.theta_q = nn.Parameter(torch.zeros(width))  # (D,), set by the builder
        self.register_buffer("s0sq", torch.ones(width))  # (D,)
        self.register_buffer("s0sq_ready", torch.tensor(False))

    def process_noise(self) -> torch.Tensor:
        """Q = exp(θ_Q), (D,) float32 (BFT.md §3)."""
        return self.theta_q.float().exp()

    @torch.no_grad()
    def set_prior(self, total: torch.Tensor, count: torch.Tensor) -> None:
        """Set ``s₀²`` to the batch mean of the REML variance (calibration), per head where count > 0.

        Args: total (H, d) float, count (H,) float from ``precision.prior_statistic``.
        """
        mean, has = self._prior_mean(total, count)
        self.s0sq.copy_(torch.where(has, mean, self.s0sq.float()).to(self.s0sq.dtype))
        self.s0sq_ready.fill_(bool(has.any()))

    @torch.no_grad()
    def update_prior(self, total: torch.Tensor, count: torch.Tensor) -> None:
        """EMA update of ``s₀²`` after a training forward (momentum ``bft.s0_momentum``) (BFT.md §1).

        If the buffer was never calibrated, the first update sets it directly (logged once).
        """
        if not bool(self.s0sq_ready):
            log.warning("BFT s0^2 was not calibrated before training; set from the first training batch "
                        "(call model.calibrate(batch) before the first step)")
            self.set_prior(total, count)
            return
        mean, has = self._prior_mean(total, count)
        mom = self.bft_cfg.s0_momentum
        new = (1.0 - mom) * self.s0sq.float() + mom * mean
        self.s0sq.copy_(torch.where(has, new, self.s0sq.float()).to(self.s0sq.dtype))

    def _prior_mean(self, total: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, d) total, (H,) count -> (D,) mean and (D,) bool where defined."""
        d = total.shape[-1]
        mean = (total / count.clamp_min(1.0)[:, None]).reshape(-1)  # (H, d) -> (D,)
        has = (count > 0)[:, None].expand(-1, d).reshape(-1)  # (H,) -> (D,)
        return mean.float(), has

    def kriging_observe(self, x: torch.Tensor, lam: torch.Tensor, masks: Masks, run: LayerRun,
                        rows: torch.Tensor, stats: dict) -> tuple:
        """Observe (BFT.md §1), shared by the SASRec twin (``x = LN1(h)``, pre-LN) and the BERT4Rec twin
        (``x = h``, post-LN): precision-weighted kriging attention, REML + inverse-χ² precision of the
        estimate, and the delta method through ``W_O`` (``G = W_O``; under ``bft.units=count`` the
        precision is ``Var₁(o)/Var(o)``, §7).

        Args:
            x: (B, T, D) float attention input; lam: (n, D) float32 precision rows of ``rows``;
            masks: the block's ``Masks``; run: the stack's ``LayerRun``; stats: receives ``prior`` in training.
        Returns:
            o (B, T, D) attention output before dropout; λ_obs (n, D) float32; ok (B, 1, T) bool (a valid
            query with at least one valid key); a2 (B, H, T) float32 ``Σ α̃²`` (Kish n = 1/a2).
        """
        cfg = self.bft_cfg
        lo, hi = cfg.clamp_min, cfg.clamp_max
        learned, detach = cfg.precision == "learned", cfg.detach_precision_grad
        valid = masks.valid  # (B, T)
        B, T, D = x.shape
        H = self.attn.n_heads
        d = D // H
        dev = x.device.type
        s0sq = self.s0sq.detach().float().clone().view(H, d)  # value before this forward; (D,) -> (H, d)
        q, k, v = self.attn.heads(x)  # (B, H, T, d) each
        v = v.contiguous()  # one copy, shared by the value matmul and the moments
        logits = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
        allowed = masks.attn & valid[:, None, None, :]  # (B, 1, T, T): BFT.md's where(valid_j, ·, -inf)
        ok = allowed.any(-1) & valid[:, None, :]  # (B, 1, T): valid query with >= 1 valid key
        setter = None
        if run.calibrate:
            def setter(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
                self.set_prior(total, count)
                return self.s0sq.float().clone().view(H, d)  # (D,) -> (H, d)
        if not self.reference_observe:  # the fast path: one autograd node (precision.kriging_attention)
            with fp32(dev):
                bias = kriging_bias(lam, rows, B, T, lo, hi) if learned else None  # (B, 1, 1, T)
                drop = self.attn.attn_drop
                m, S_r, a2_r, b_r, a2 = kriging_attention(logits.float(), bias, allowed, v.float(), rows, drop.p,
                                                          drop.training, stats_grad=not detach)
                w_o = self.attn.out.weight.float()
                lam_obs, prior = observe_from_stats(
                    S_r, a2_r, b_r, gather_head_rows(ok, rows), s0sq, w_o.detach() if detach else w_o,
                    cfg.prior_dof, lo, hi, want_prior=self.training and not run.calibrate, set_prior=setter,
                    count=cfg.units == "count")  # (n, D)
            if prior is not None and not run.calibrate:
                stats["prior"] = prior
            record(run.probe, "lam_obs", lam_obs)
            o = self.attn.out(m.to(v.dtype).transpose(1, 2).reshape(B, T, D))  # (B, H, T, d) -> (B, T, D)
            return o, lam_obs, ok, a2
        with fp32(dev):  # the reference path (tests): masked_softmax, nn.Dropout, kriging_stats, row gathers
            logits = logits.float()
            if learned:
                logits = logits + kriging_bias(lam, rows, B, T, lo, hi)  # + (B, 1, 1, T)
            alpha = masked_softmax(logits, allowed)  # (B, H, T, T) float32, empty rows all 0
            a_p, v_p, w_o = alpha, v.float(), self.attn.out.weight.float()
            if detach:
                a_p, v_p, w_o = a_p.detach(), v_p.detach(), w_o.detach()
            m_u, lam_obs, a2, prior = observe_precision(
                a_p, v_p, s0sq, w_o, ok, rows, cfg.prior_dof, lo, hi,
                want_prior=self.training and not run.calibrate, set_prior=setter,
                count=cfg.units == "count")  # lam_obs (n, D)
            if prior is not None and not run.calibrate:
                stats["prior"] = prior
        record(run.probe, "lam_obs", lam_obs)
        if (self.training and self.attn.attn_drop.p > 0) or (detach and torch.is_grad_enabled()):
            m = self.attn.attn_drop(alpha) @ v  # (B, H, T, d): dropout on α̃ as in the native layer
        else:
            m = m_u  # eval / no attention dropout: the kriging mean is the value path
        o = self.attn.out(m.transpose(1, 2).reshape(B, T, D))  # (B, H, T, d) -> (B, T, D) -> (B, T, D)
        return o, lam_obs, ok, a2


# name of the native block class -> its BFT variant
BFT_VARIANTS: Registry = Registry("BFT block")


def register_variant(native_cls: type):
    """Register a BFT block for ``native_cls`` (key: the native class name). It must subclass it."""
    def deco(bft_cls: type) -> type:
        if not issubclass(bft_cls, native_cls):
            raise TypeError(f"{bft_cls.__name__} must subclass {native_cls.__name__}")
        BFT_VARIANTS.register(native_cls.__name__)(bft_cls)
        return bft_cls
    return deco


def bft_variant_for(block_cls: type, layer: str = "bft") -> type:
    """The BFT variant registered for a native block class (``layer`` names the request in the error).

    Raises:
        ConfigError: ``layer=bft is not available for <Block>; BFT variants exist for: ...``.
    """
    name = block_cls.__name__
    if name not in BFT_VARIANTS or not issubclass(BFT_VARIANTS.get(name), block_cls):
        raise ConfigError(f"layer={layer} is not available for {name}; BFT variants exist for: "
                          f"{', '.join(BFT_VARIANTS.names())}")
    return BFT_VARIANTS.get(name)


# --------------------------------------------------------------------------------------------------
# Stack
# --------------------------------------------------------------------------------------------------
class BFTStack(nn.Module):
    """A stack of BFT blocks carrying ``(h, λ)`` from layer to layer (BFT.md "Notation", §0–§3, §6, §7).

    ``forward(h, items, masks, mech=None, **ctx) -> h``, the same signature as the standard ``Stack``.
    λ is carried as (n, D) float32 rows of the valid positions (``bftrec.layers.precision``);
    ``forward_with_precision`` returns it as (B, L, D), exactly 0 on padding. ``ctx`` may hold
    ``tau_input``, the item embedding the τ MLP reads (``tau.kind=mlp``, ``InitialPrecision``): a
    callable ``items (B, L) int64 -> (B, L, D)`` or a (B, L, D) tensor; the other keys go to the blocks.

    Attributes:
        blocks: ``nn.ModuleList`` of BFT blocks (the backbone may re-initialise their native weights).
        tau: ``InitialPrecision`` (τ), outside ``blocks``.
        probe: None, or a dict that forwards fill with per-layer min/max of every clamped quantity on
            valid positions (``lam``, ``lam_obs``, ``lam1``, ``lam2``: lists of (min, max)); for tests
            and diagnostics of the "clamps never bind" requirement (BFT.md "Notation"). Costs a host
            sync per entry; leave None in training.
    Notes:
        The last block's λ'' feeds no later layer and no loss, so in a plain ``forward`` it is not
        computed and that block's ``theta_q`` receives no gradient (DDP needs
        ``find_unused_parameters=True`` or ``static_graph=True`` with ``layer=bft``).
    """

    def __init__(self, blocks: list[nn.Module], tau: InitialPrecision, cfg: BFTLayerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.tau = tau
        self.cfg = cfg
        self.probe: Optional[dict] = None
        self._calibrating = False
        self.compile_precision = False  # trainer.compile_precision: the precision formulas run compiled
        self._tau0_set = cfg.tau.scale != "mean_count"  # mean_count: the first calibration sets τ₀ = log n̄

    @property
    def width(self) -> int:
        return self.blocks[0].width

    def initial_precision(self, items: torch.Tensor, rows: torch.Tensor, tau_input=None) -> torch.Tensor:
        """λ⁰ rows (BFT.md §0): (B, L) int64 items, (n,) valid rows -> (n, D) float32.

        ``exp(clamp(τ))`` on the valid positions; padding has no row (``λ = 0``). Positions add no
        precision: the τ MLP reads the item embedding ``tau_input`` (see the class docstring) only.
        """
        lo, hi = self.cfg.bft.clamp_min, self.cfg.bft.clamp_max
        emb_r = None
        if self.tau.kind == "mlp":
            emb = tau_input(items) if callable(tau_input) else tau_input  # (B, L, D) or None
            if emb is not None:
                emb = emb.detach() if self.cfg.bft.detach_precision_grad else emb
                emb_r = gather_rows(emb, rows)  # (n, D)
        tau = self.tau(items.reshape(-1)[rows], emb_r)  # (n,) item ids -> (n, dims)
        lam0 = tau.clamp(math.log(lo), math.log(hi)).exp()  # (n, dims)
        return lam0.expand(len(rows), self.width)  # (n, dims) -> (n, D)

    def forward(self, h: torch.Tensor, items: torch.Tensor, masks: Masks, mech: Optional[dict] = None,
                last_only: bool = False, **ctx) -> torch.Tensor:
        """h (B, L, D), items (B, L) int64, masks -> h (B, L, D). Fills ``mech`` when it is a dict.

        ``last_only`` (``Stack``'s scoring shortcut) is accepted and ignored: every position is returned.
        """
        return self.run(h, items, masks, mech=mech, need_lam=mech is not None, **ctx)[0]

    def forward_with_precision(self, h: torch.Tensor, items: torch.Tensor, masks: Masks,
                               mech: Optional[dict] = None, **ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``forward`` but also returns the final precision λ (B, L, D) float32 (exactly 0 on padding)."""
        h, lam = self.run(h, items, masks, mech=mech, need_lam=True, **ctx)
        return h, scatter_rows(lam, valid_rows(masks.valid), *masks.valid.shape)

    def run(self, h: torch.Tensor, items: torch.Tensor, masks: Masks, mech: Optional[dict], need_lam: bool,
            **ctx) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Carry ``(h, λ)`` through the blocks; update ``s₀²`` afterwards in training (BFT.md §1).

        λ travels as (n, D) rows of the valid positions (``bftrec.layers.precision``); returns
        ``(h (B, L, D), λ (n, D) rows or None)``.

        ``mech`` (if a dict) receives, in the format of ``bftrec.mechanism``: ``units`` (str, ``bft.units``),
        ``lam0`` (B, L) float32 (λ̄⁰, the geometric mean of λ⁰ over D, 0 on padding) and ``layers``: per
        layer ``K`` (B, L) float32 mean over D, ``lam_obs`` (B, L) float32 λ̄^obs (geometric mean over D,
        BFT.md §6), ``n_eff`` (B, L) float32 Kish n mean over heads (0 on padding), ``Q`` (D,) float32.
        """
        valid = masks.valid  # (B, L)
        B, L = valid.shape
        rows = valid_rows(valid)  # (n,) flat indices of the valid positions, once per forward
        tau_input = ctx.pop("tau_input", None)
        lam = self.initial_precision(items, rows, tau_input)  # (n, D) float32 rows
        want = mech is not None or self._calibrating
        if mech is not None:
            mech["units"] = self.cfg.bft.units
            mech["lam0"] = scatter_rows(geometric_mean_d(lam.detach()), rows, B, L)  # (B, L)
            mech["layers"] = []
        pending, n = [], len(self.blocks)
        with compiling(self.compile_precision):  # trainer.compile_precision (precision/compile.py)
            for i, block in enumerate(self.blocks):
                flags = LayerRun(calibrate=self._calibrating, need_lam=need_lam or i < n - 1, want_stats=want,
                                 probe=self.probe, rows=rows)
                h_in = h
                h, lam_next, stats = block(h, lam, masks, run=flags, **ctx)
                if i == 0 and self._calibrating and not self._tau0_set and len(rows):
                    # tau.scale=mean_count (BFT.md §7): layer-0 λ̂^obs does not depend on τ (the kriging bias and
                    # HSTU's relative reliability ignore a common scale), so set τ₀ = log n̄ now and rerun layer 0
                    self._set_mean_count_start(float(stats["lam_obs"].mean()))
                    lam = self.initial_precision(items, rows, tau_input)
                    h, lam_next, stats = block(h_in, lam, masks, run=flags, **ctx)
                lam = lam_next
                if "prior" in stats:
                    pending.append((block, stats["prior"]))
                if mech is not None:
                    mech["layers"].append({"K": scatter_rows(stats["K"], rows, B, L),
                                           "lam_obs": scatter_rows(stats["lam_obs"], rows, B, L),
                                           "n_eff": stats["n_eff"], "Q": block.process_noise().detach()})
                if self._calibrating:
                    k = float(stats["K"].mean()) if len(rows) else float("nan")
                    log.info("BFT calibration layer %d: mean s0^2 %.4g, mean K %.4f", i, float(block.s0sq.mean()), k)
        if self.training and not self._calibrating:
            for block, (total, count) in pending:  # after the forward: this batch never sees its own update
                block.update_prior(total, count)
        return h, lam

    def _set_mean_count_start(self, n_bar: float) -> None:
        """``tau.scale=mean_count``: ``τ₀ = log n̄`` and ``Q̂₀ = q_init_ratio/mean λ⁰`` (``0.1/n̄``) (BFT.md §7).

        ``n̄`` is the mean over the calibration batch's valid positions of the layer-0 λ̄̂^obs (each
        position's geometric mean over D, as every λ summary here, BFT.md §6). Applied once per model:
        a later calibration keeps τ (it is a learned parameter by then).
        """
        if not (math.isfinite(n_bar) and n_bar > 0):
            log.warning("tau.scale=mean_count: layer-0 mean lambda_obs %r is not positive; tau stays at 0", n_bar)
            return
        self.tau.shift_(math.log(n_bar))
        q0 = set_process_noise(self.blocks, self.tau, self.cfg)
        self._tau0_set = True
        log.info("BFT tau.scale=mean_count: n_bar %.4g, tau0 = log n_bar = %.4f, Q0 %.4g", n_bar,
                 math.log(n_bar), q0)

    @contextlib.contextmanager
    def calibration(self) -> Iterator[None]:
        """Forwards under this context set each layer's ``s₀²`` from the batch, layer by layer (BFT.md §1).

        Use once, with no grad and no dropout, on one training batch before the first step
        (``SeqRecModel.calibrate``). Layer ``l`` is calibrated on the states produced by the already
        calibrated layers ``< l``. Under ``tau.scale=mean_count`` the first calibration also sets τ's
        start and θ_Q (``_set_mean_count_start``, BFT.md §7); without it τ stays at 0.
        """
        prev, self._calibrating = self._calibrating, True
        try:
            yield
        finally:
            self._calibrating = prev


# --------------------------------------------------------------------------------------------------
# Builder (the single swap point, bftrec.layers.build_stack)
# --------------------------------------------------------------------------------------------------
def bft_overhead(cfg: BFTLayerConfig, n_tokens: int, n_layers: int, d_model: int) -> int:
    """Parameters BFT adds to a backbone (BFT.md §0 "Report the parameter overhead")."""
    t = cfg.tau
    tau = n_tokens * t.dims if t.kind == "item" else t.mlp_hidden * (d_model + 1) + t.dims * (t.mlp_hidden + 1)
    return tau + n_layers * d_model


def set_process_noise(blocks, tau: InitialPrecision, cfg: BFTLayerConfig) -> float:
    """``Q = q_init_ratio / mean λ⁰`` in every block and coordinate (BFT.md §0 "Process noise"); returns Q.

    The mean is over the starting λ⁰ of all non-padding token ids.
    """
    lam0_mean = float(tau.start_values()[1:].exp().mean())
    q0 = cfg.bft.q_init_ratio / lam0_mean
    with torch.no_grad():
        for blk in blocks:
            blk.theta_q.fill_(math.log(q0))
    return q0


@LAYER_BUILDERS.register("bft")
@LAYER_BUILDERS.register("bft_h")
def build_bft_stack(layer_cfg: BFTLayerConfig, block_cls: type, n_layers: int, n_tokens: int, block_kwargs: dict,
                    precision_ctx: dict) -> BFTStack:
    """Build a ``BFTStack`` of the BFT variant of ``block_cls`` (see ``bftrec.layers.build_stack``).

    ``layer=bft`` and ``layer=bft_h`` (v1 defaults) share this builder. Sets ``Q = q_init_ratio /
    mean λ⁰`` in every layer and coordinate (``set_process_noise``).

    Raises:
        ConfigError: a bad config value, or no BFT variant for ``block_cls``.
    """
    check_bft_config(layer_cfg)
    variant = bft_variant_for(block_cls, layer_cfg.name)
    blocks = [variant(**block_kwargs, bft_cfg=layer_cfg.bft) for _ in range(n_layers)]
    D = blocks[0].width
    check_bft_config(layer_cfg, D)
    tau = InitialPrecision(layer_cfg.tau, n_tokens, D, starting_tau(layer_cfg.tau, n_tokens, precision_ctx))
    q0 = set_process_noise(blocks, tau, layer_cfg)
    log.info("BFT stack: %d x %s, units=%s, tau=%s/%s dims %d, mean lambda0 %.4g, Q0 %.4g, +%d parameters",
             n_layers, variant.__name__, layer_cfg.bft.units, layer_cfg.tau.kind, layer_cfg.tau.scale,
             layer_cfg.tau.dims, layer_cfg.bft.q_init_ratio / q0, q0, bft_overhead(layer_cfg, n_tokens, n_layers, D))
    return BFTStack(blocks, tau, layer_cfg)


__all__ = ["TauConfig", "BFTParams", "BFTLayerConfig", "BFTHLayerConfig", "UNITS", "TAU_SCALES", "check_bft_config",
           "upgrade_legacy_layer", "starting_tau", "InitialPrecision", "LayerRun", "BFTBlockMixin", "BFT_VARIANTS",
           "register_variant", "bft_variant_for", "fp32", "record", "BFTStack", "bft_overhead", "set_process_noise",
           "build_bft_stack"]
