"""BERT4Rec: bidirectional Transformer trained with a cloze (masked item) objective.

Paper: F. Sun, J. Liu, J. Wu, C. Pei, X. Lin, W. Ou and P. Jiang, "BERT4Rec: Sequential
Recommendation with Bidirectional Encoder Representations from Transformer", CIKM 2019.
Reference code: github.com/FeiSun/BERT4Rec (TensorFlow).

Item and learned position embeddings, an embedding LayerNorm, post-LN bidirectional Transformer
blocks (BERT), then the output head: ``model.head=mlm`` (default, the reference code's masked-LM
head) ``GELU(W h + b) -> LayerNorm`` and an output layer tied to the item embeddings with a per-item
bias; ``model.head=tied`` the tied item embeddings alone, no bias (Klenitskiy & Vasilev, "Turning
Dross Into Gold Loss: is BERT4Rec really better than SASRec?", RecSys 2023, code
github.com/antklen/sasrec-bert4rec-recsys23: HF ``BertModel`` + a tied bias-free ``Linear``).
Token ids: ``0`` padding, ``1..N`` items, ``N + 1`` = ``[MASK]``. The stack is built through the
single swap point ``bftrec.layers.build_stack`` over ``N + 2`` tokens, so ``layer=bft`` gives the BFT
twin of the same block (BFT.md; post-LN rule of §2/§3).

Training (cloze): on the most recent ``max_len`` training items (``batch["seq"][:, 1:]``), every
non-padding item is replaced by ``[MASK]`` with probability ``mask_prob`` (at least one per
sequence); a share ``last_item_mask_share`` of the sequences instead masks *only the last item*,
which is exactly the prediction task at test time. The loss is the mean CE over all masked positions
of the batch (as both references). Scoring: the most recent ``max_len - 1`` history items followed by
``[MASK]``; the scores are read at the ``[MASK]`` position.

Convergence (issue 11; ``results/diag/diag_bert4rec_fit.py``, results/diag/bert4rec_fit.json): the cloze
loss falls far more slowly per epoch than SASRec's next-item loss, with no defect behind it. Two
causes, measured one at a time: (1) the masks are redrawn every step, so each epoch's loss is taken
on (input, target) pairs never seen before, where SASRec sees the same pairs every epoch and can
memorise them (with the masks frozen the cloze loss falls as fast as SASRec's, while the
next-item CE gets worse); (2) only ``mask_prob`` of the positions carry a target (SASRec with 20% of
its targets slows down likewise). lr, warm-up, the loss normalisation, the head, the initialisation
and dropout change little. So budget BERT4Rec by convergence (early stopping, a large epoch cap),
as Petrov & Macdonald (RecSys 2022, "A Systematic Review and Replicability Study of BERT4Rec")
who trace weak re-implementations to too short training (the reference runs 400k steps of 256).

Deviations from the paper / reference implementation (github.com/FeiSun/BERT4Rec):
- Masked items are always replaced by ``[MASK]``; the reference also uses only ``[MASK]``
  (``mask_prob=1.0`` in its run scripts, which turns off BERT's 80/10/10 random/keep replacement),
  as does Klenitskiy & Vasilev's code. This matches the code, not BERT.
- The reference masks exactly ``max(1, round(0.2 n))`` positions of a window of n items (at most
  ``max_predictions_per_seq``, 40 on ML-1M: never binding at L=200); here each item is masked
  independently (Bernoulli, as Klenitskiy & Vasilev) and at least one per sequence: the same mean,
  a larger spread.
- The reference builds masked copies offline (``dupe_factor`` copies per window, plus one copy per
  window with only the last item masked: a share 1/11 of the samples). Here masks are drawn on the
  fly each step from torch's global RNG (seeded by the trainer), and the "last item only" samples
  are a per-sequence share ``last_item_mask_share`` (default 0.1). Klenitskiy & Vasilev use none
  (their ``force_last_item_masking_prob=0``) and still report the strongest BERT4Rec on ML-1M.
- The reference trains on sliding windows (step ``0.5 max_len`` on ML-1M); here each user's most
  recent window (``trainer.train_windows=last``, as Klenitskiy & Vasilev), or ``sliding``.
- Loss is configurable: ``ce`` (full softmax, as the paper), ``sampled_softmax`` or ``bce``.
- The ``mlm`` head keeps the reference code's LayerNorm after ``GELU(W h + b)`` (the paper's Eq. 7
  omits it; the code inherits it from BERT's masked-LM head).
- Positions are counted from the right end by default (``model.positions=from_end``: the last column
  is position ``max_len - 1``), so the [MASK] at scoring takes the last training position. Both
  references count from the left: ``model.positions=from_start`` numbers each row's first item 0
  (padding side does not matter then: padding is masked out of the bidirectional attention). Either
  way extra left padding never changes a score.
- Timestamps are ignored (``encode`` accepts them for the contract). No token-type embedding (BERT's
  is one constant learned vector here).
- Initialisation N(0, init_std) (as HF ``BertModel``, Klenitskiy & Vasilev) instead of the TF
  reference's truncated normal; LayerNorm eps 1e-5 (torch default) instead of BERT's 1e-12.
- The optimiser is the trainer's (Adam, constant lr, as Klenitskiy & Vasilev); the reference uses
  AdamW (weight decay 0.01), lr 1e-4 with 100 warm-up steps, linear decay and gradient clipping 5.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from bftrec.config import ConfigError, check_choice
from bftrec.layers import build_masks, build_stack
from bftrec.mechanism import score_position
from bftrec.models.base import MODELS, DataInfo, SeqRecModel, check_common, full_scores, next_item_loss
from bftrec.models.blocks import POSITIONS, BERT4RecBlock, position_ids  # noqa: F401  (BERT4RecBlock: its home)

HEADS = ("mlm", "tied")


@dataclass
class BERT4RecConfig:
    name: str = "bert4rec"
    d_model: int = 64                   # hidden width D
    n_layers: int = 2                   # number of blocks
    n_heads: int = 2                    # attention heads H (d = D / H)
    d_ff: int = 256                     # point-wise FFN width F
    dropout: float = 0.1                # hidden / embedding dropout
    attn_dropout: float = 0.1           # dropout on attention weights
    max_len: int = 50                   # tokens per sequence incl. the scoring [MASK] (L)
    loss: str = "ce"                    # ce | bce | sampled_softmax, over masked positions only
    n_negatives: int = 256              # negatives for sampled_softmax (see negatives_per)
    negatives_per: str = "batch"        # sampled_softmax: batch (one shared draw) | position (HSTU reference)
    ce_chunk: int = 128                 # ce: positions per chunk of the softmax, 0 = materialise (P, N)
    init_std: float = 0.02              # N(0, init_std) initialisation
    mask_prob: float = 0.2              # cloze: probability of masking each item, in (0, 1)
    last_item_mask_share: float = 0.1   # share of training sequences that mask only the last item
    head: str = "mlm"                   # mlm: GELU(W h + b) -> LN, tied + bias (reference) | tied: tied only
    positions: str = "from_end"         # from_end: last column = max_len - 1 | from_start: first item = 0 (references)


@MODELS.register("bert4rec")
class BERT4Rec(SeqRecModel):
    """BERT4Rec backbone: ``encode``, cloze ``training_loss``, ``score_items`` at an appended [MASK].

    Raises:
        ConfigError: ``mask_prob`` outside (0, 1), ``last_item_mask_share`` outside [0, 1],
            ``max_len < 2``, ``head`` not one of ``mlm``, ``tied``, ``positions`` not one of
            ``from_end``, ``from_start``, or a shared check
            (``check_common``) fails.
    """

    Config = BERT4RecConfig
    causal = False

    def __init__(self, cfg: BERT4RecConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        if not 0.0 < cfg.mask_prob < 1.0:
            raise ConfigError(f"model.mask_prob={cfg.mask_prob} must be in (0, 1)")
        if not 0.0 <= cfg.last_item_mask_share <= 1.0:
            raise ConfigError(f"model.last_item_mask_share={cfg.last_item_mask_share} must be in [0, 1]")
        if cfg.max_len < 2:
            raise ConfigError(f"model.max_len={cfg.max_len} must be >= 2 for bert4rec (history + [MASK])")
        check_choice(cfg.head, HEADS, "model.head")
        check_choice(cfg.positions, POSITIONS, "model.positions")
        self.cfg, self.n_items = cfg, info.n_items
        self.mask_id = info.n_items + 1
        D = cfg.d_model
        self.item_emb = nn.Embedding(info.n_items + 2, D, padding_idx=0)  # 0 pad, 1..N, N+1 [MASK]
        self.pos_emb = nn.Embedding(cfg.max_len, D)
        self.emb_ln = nn.LayerNorm(D)
        self.emb_drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)
        # train_counts covers the real items only ((N + 1,)): [MASK] is no zero-count item, its τ starts at
        # offset 0 under tau.freq_slope (BFT.md §0, special tokens)
        self.stack = build_stack(
            layer_cfg, BERT4RecBlock, cfg.n_layers, n_tokens=info.n_items + 2,
            precision_ctx={"input_variance": self.input_variance(), "train_counts": info.train_counts, "pad_id": 0},
            d_model=D, n_heads=cfg.n_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout)
        for block in self.stack.blocks:  # not the stack itself: the BFT τ table keeps its own init
            block.apply(self._init)
        # output head. mlm (reference code, BERT's masked-LM head): GELU(W h + b) -> LayerNorm, then tied
        # embeddings + bias; tied (Klenitskiy & Vasilev 2023): the tied embeddings alone
        if cfg.head == "mlm":
            self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.LayerNorm(D))
            self.head.apply(self._init)
            self.out_bias: Optional[nn.Parameter] = nn.Parameter(torch.zeros(info.n_items + 2))  # (N + 2,)
        else:
            self.head = nn.Identity()
            self.out_bias = None

    @torch.no_grad()
    def input_variance(self) -> float:
        """Mean per-coordinate variance of the layer-0 input LN(item + position) at init.

        Each real item is paired with one position (``id mod max_len``) to keep this (N, D).
        """
        ids = torch.arange(1, self.n_items + 1)
        x = self.emb_ln(self.item_emb.weight[1: self.n_items + 1] + self.pos_emb(ids % self.cfg.max_len))  # (N, D)
        return float(x.var(dim=0).mean())

    def embed(self, item_seq: torch.Tensor) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded -> (B, L, D) float, 0 on padding. ``positions=from_end``:
        the last column is position max_len - 1; ``from_start``: each row's first token (item or [MASK])
        is position 0."""
        pos = position_ids(item_seq, self.cfg.max_len, self.cfg.positions)  # (1 or B, L)
        h = self.emb_ln(self.item_emb(item_seq) + self.pos_emb(pos))  # (B, L, D)
        return self.emb_drop(h) * item_seq.ne(0).unsqueeze(-1)

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None, last_only: bool = False) -> torch.Tensor:
        """Bidirectional encoding.

        Args:
            item_seq: (B, L) int64, left-padded with 0, may contain [MASK] = N + 1; only the last
                ``max_len`` columns are used.
            timestamps: ignored.
            mech: optional dict the BFT stack fills with mechanism statistics.
            last_only: the last block may return the last position alone (``Stack``), L' = 1.
        Returns:
            (B, L', D) float hidden states after the last block, L' = min(L, max_len).
        """
        item_seq = item_seq[:, -self.cfg.max_len:]
        masks = build_masks(item_seq, causal=False)
        return self.stack(self.embed(item_seq), item_seq, masks, mech=mech, tau_input=self.item_emb,
                          last_only=last_only)

    def cloze(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the cloze masks from torch's global RNG.

        Args:
            seq: (B, L) int64 left-padded item ids, L <= max_len.
        Returns:
            inputs (B, L) int64 with masked items replaced by [MASK], and targets (B, L) int64 holding
            the original item at masked positions and 0 elsewhere.
        """
        valid = seq.ne(0)  # (B, L)
        B, L = seq.shape
        # drawn for all max_len columns and cut to the last L: trimming common left padding (the
        # trainer does) leaves every mask unchanged
        u = torch.rand(B, self.cfg.max_len, device=seq.device)[:, self.cfg.max_len - L:]  # (B, L)
        masked = valid & (u < self.cfg.mask_prob)
        # at least one masked item per non-empty sequence: the valid position with the smallest draw
        first = u.masked_fill(~valid, 2.0).argmin(dim=1)  # (B,)
        none = ~masked.any(dim=1) & valid.any(dim=1)  # (B,)
        masked[none, first[none]] = True
        # "last item only" samples: exactly the test-time task
        last_only = torch.rand(seq.shape[0], device=seq.device) < self.cfg.last_item_mask_share  # (B,)
        last = torch.zeros_like(masked)
        last[:, -1] = True
        masked = torch.where(last_only[:, None], last & valid, masked)
        return seq.masked_fill(masked, self.mask_id), seq * masked

    def training_loss(self, batch: dict) -> torch.Tensor:
        """Cloze loss on the most recent ``max_len`` training items, masked positions only; scalar.

        ``batch["seq"]`` is (B, L + 1) int64 with L + 1 <= max_len + 1 (the trainer may trim common
        left padding); its last ``max_len`` columns are used (``seq[:, 1:]`` when untrimmed).
        """
        seq = batch["seq"][:, -self.cfg.max_len:]  # (B, L + 1) -> (B, min(L + 1, max_len))
        inputs, targets = self.cloze(seq)
        h = self.head(self.encode(inputs))  # (B, L, D)
        return next_item_loss(h, targets, self.item_emb.weight, self.cfg.loss, self.cfg.n_negatives,
                              self.n_items, bias=self.out_bias, ce_chunk=self.cfg.ce_chunk,
                              negatives_per=self.cfg.negatives_per)

    def scoring_input(self, item_seq: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 history -> (B, min(L, max_len - 1) + 1) int64: recent items then [MASK]."""
        L = item_seq.shape[1]
        hist = item_seq[:, max(L - (self.cfg.max_len - 1), 0):]  # (B, <= max_len - 1)
        mask_col = torch.full_like(item_seq[:, :1], self.mask_id)  # (B, 1)
        return torch.cat([hist, mask_col], dim=1)

    def score_items(self, batch: dict) -> torch.Tensor:
        """``batch["item_seq"]`` (B, L) int64 history -> (B, N + 1) float32; column 0 is -inf.

        [MASK] (N + 1) is never a candidate: its column is not returned. In eval mode the last block
        computes the [MASK] position only (``Stack``'s ``last_only``).
        """
        h = self.head(self.encode(self.scoring_input(batch["item_seq"]), last_only=not self.training)[:, -1])  # (B, D)
        return full_scores(h, self.item_emb.weight, self.n_items, bias=self.out_bias)

    def mechanism(self, batch: dict) -> dict:
        """BFT statistics of the scoring forward, re-aligned to ``batch["item_seq"]`` (B, L).

        The scoring input drops the oldest column when the history is full and appends [MASK], so
        its position ``t`` holds history column ``t + L - L_in + 1``. Every (B, L_in) tensor of the
        mech dict is shifted back to the history's columns; columns the forward never saw get 0.
        ``at_score`` holds K and λ̄⁰ at the [MASK] position, the one scored.
        """
        mech: dict = {}
        item_seq = batch["item_seq"]
        with torch.no_grad():
            x = self.scoring_input(item_seq)
            self.encode(x, mech=mech)
        at_score = score_position(mech).pop("at_score", None)  # at the [MASK] column, kept out of the re-alignment
        B, L = item_seq.shape
        L_in = x.shape[1]

        def align(v):
            if isinstance(v, dict):
                return {k: align(w) for k, w in v.items()}
            if isinstance(v, list):
                return [align(w) for w in v]
            if torch.is_tensor(v) and v.dim() >= 2 and tuple(v.shape[:2]) == (B, L_in):
                out = v.new_zeros((B, L) + tuple(v.shape[2:]))
                n = L_in - 1  # history columns in the scoring input
                if n > 0:
                    out[:, L - n:] = v[:, :n]
                return out
            return v

        out = align(mech)
        if at_score is not None:
            out["at_score"] = at_score
        return out
