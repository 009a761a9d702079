"""A small GPT whose causal self-attention is pluggable: the seed's manual lines or flashgen.

The architecture is the usual GPT-2 shape: token + learned position embeddings, `n_layer` blocks
of (LayerNorm -> causal self-attention -> residual, LayerNorm -> MLP -> residual), a final
LayerNorm and a language-model head tied to the token embedding.

`attention="manual"` is the slow path of the seed text (shared/reference/seed-flashattention-
walk.txt): it materializes the (B, nh, T, T) score matrix, three times over. `attention="flashgen"`
calls `flashgen.torch.attention(q, k, v, causal=True)`, which never writes that matrix to memory.
Both paths take the same (B, nh, T, hs) tensors and have the same parameters, so one set of
weights runs under either (and `GPT(cfg, "manual")` and `GPT(cfg, "flashgen")` built after the
same `torch.manual_seed` are initialized identically).

There is no dropout on the attention probabilities: the flashgen op has none, and the point of
the example is that both paths compute the same function. `dropout` applies to the embeddings
and the residual branches only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

ATTENTIONS = ("manual", "flashgen")


@dataclass(frozen=True)
class GPTConfig:
    """Model size. The defaults are a ~3M-parameter character model (head dim 64)."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 256
    vocab_size: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive int")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd}, n_head={self.n_head}: n_embd must be a multiple of "
                "n_head (head size = n_embd // n_head)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r}: must be in [0, 1)")

    @property
    def head_size(self) -> int:
        """Per-head dimension (hs, flashgen's d)."""
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON logs and checkpoints."""
        return asdict(self)


def check_attention(attention: str) -> str:
    """The attention name, or a ValueError listing the choices."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: must be one of {', '.join(ATTENTIONS)}")
    return attention


_flashgen_torch: Any = None


def _flashgen() -> Any:
    """`flashgen.torch`, imported on first use so the manual path never needs flashgen."""
    global _flashgen_torch
    if _flashgen_torch is None:
        try:
            import flashgen.torch as fgt
        except ImportError as exc:
            raise ImportError(
                f"attention='flashgen' needs the flashgen package ({exc}); run `pip install -e .` "
                "in the repository root or put the root on PYTHONPATH"
            ) from exc
        _flashgen_torch = fgt
    return _flashgen_torch


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused qkv projection and a pluggable core."""

    def __init__(self, config: GPTConfig, attention: str = "manual") -> None:
        super().__init__()
        self.attention = check_attention(attention)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        hs = config.head_size
        if attention == "flashgen" and (hs % 8 or hs > 256):
            # flashgen's rule for d; failing here names the config field to change
            raise ValueError(
                f"head size n_embd/n_head={hs}: flashgen needs a multiple of 8 up to 256; "
                "change n_embd or n_head"
            )
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_drop = nn.Dropout(config.dropout)
        if attention == "manual":
            # The seed's mask, registered once as nanoGPT does. bool, not float: `mask == 0`
            # reads the same and the buffer is 4x smaller (256 MiB at block_size 16384).
            # Not persistent, so manual and flashgen checkpoints are interchangeable.
            bs = config.block_size
            mask = torch.tril(torch.ones(bs, bs, dtype=torch.bool)).view(1, 1, bs, bs)
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, C)."""
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, nh, hs) -> (B, nh, T, hs): a transposed *view*, hs still contiguous, which is
        # the layout flashgen takes without a copy (strides (T*3C, hs, 3C, 1))
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = self._manual(q, k, v) if self.attention == "manual" else self._flashgen(q, k, v)
        # manual: y is a dense (B, nh, T, hs), so this reshape copies; flashgen: O has q's
        # memory layout, (B, T, nh, hs) in memory, so this reshape is a free view
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_drop(self.proj(y))

    def _manual(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The seed's three lines, verbatim, then `att @ v`: O(T^2) memory per head."""
        T = q.size(-2)
        mask = self.mask[:, :, :T, :T]
        # fmt: off
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        # fmt: on
        return att @ v

    @staticmethod
    def _flashgen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """flashgen's fused kernel on (B, nh, T, hs) views: O(T) memory, same math."""
        if not q.is_cuda:
            # say it before importing anything: the op itself would say the same, later
            raise RuntimeError(
                f"attention='flashgen' runs on CUDA only and got a tensor on {q.device}; use "
                "--device cuda or attention='manual'"
            )
        # scale defaults to 1/sqrt(hs), the manual path's; causal masks j > i (Tq == Tk)
        return _flashgen().attention(q, k, v, causal=True)


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU -> C."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, attention: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, attention)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only language model; `attention` picks the attention core of every block."""

    def __init__(self, config: GPTConfig, attention: str = "manual") -> None:
        super().__init__()
        self.config = config
        self.attention = check_attention(attention)
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the head reads logits against the input embedding (fewer parameters,
        # and the usual GPT-2 choice)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual branch's output projection is shrunk so the
        # residual stream's variance does not grow with depth
        std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameter count (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token ids (B, T) -> logits (B, T, vocab) and, with targets, the mean cross-entropy."""
        B, T = idx.shape
        if self.config.block_size < T:
            raise ValueError(
                f"sequence length {T} > block_size {self.config.block_size}: crop the input "
                "or build the model with a larger block_size"
            )
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        # float(): under bf16 autocast the logits are bf16; the loss is taken in fp32
        loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def optimizer_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW groups: decay matrices (Linear, Embedding), not biases or LayerNorm gains."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
