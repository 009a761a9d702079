"""Train the small GPT on the repository's own text with either attention, and log the run.

    python examples/nanogpt/train.py --attention manual   --steps 500 --out runs/manual
    python examples/nanogpt/train.py --attention flashgen --steps 500 --out runs/flashgen

Same `--seed` means the same initial weights and the same batches in the same order for both
attentions (the batches come from their own NumPy generator, the weights from
`torch.manual_seed`, and neither depends on the attention), so the two loss curves differ only
by the attention's arithmetic. `OUT/metrics.json` holds the per-step training `losses`,
periodic `val` losses, `tokens_per_s`, `peak_mem_bytes` (torch.cuda.max_memory_allocated on
CUDA, null on CPU), the configuration and the corpus fingerprint.

`--dtype bf16` trains under torch.autocast (fp32 master weights, bf16 matmuls and attention):
q, k and v reach the attention as bf16 either way. `--eval-only --init-from OUT/model.pt`
evaluates saved weights with the chosen attention, which needs only a forward pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__:
    from .data import Batches, Corpus, build_corpus, load_corpus
    from .model import ATTENTIONS, GPT, GPTConfig
else:  # run as a script: this folder is sys.path[0]
    from data import Batches, Corpus, build_corpus, load_corpus
    from model import ATTENTIONS, GPT, GPTConfig

DTYPES = ("bf16", "fp32")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (defaults: a ~3M-parameter model, 16 x 256 tokens a step)."""
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(
        description="Train the nanoGPT-style example with manual or flashgen attention."
    )
    p.add_argument("--attention", choices=ATTENTIONS, default="manual")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps")
    p.add_argument("--out", type=Path, required=True, help="folder for metrics.json (model.pt)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=default_device)
    p.add_argument(
        "--dtype", choices=DTYPES, default=None,
        help="bf16: autocast with fp32 weights; fp32: no autocast (default bf16 on cuda, "
        "fp32 on cpu)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=1e-4, help="end of the cosine decay")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default steps/10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--eval-interval", type=int, default=100, help="0: only at the end")
    p.add_argument("--eval-iters", type=int, default=10, help="validation batches per eval")
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--data", type=Path, help="a corpus saved by data.py (default: build one)")
    p.add_argument("--save", action="store_true", help="write OUT/model.pt at the end")
    p.add_argument(
        "--eval-only", action="store_true",
        help="no training: evaluate --init-from's weights with --attention",
    )  # fmt: skip
    p.add_argument("--init-from", type=Path, help="a model.pt written by --save")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if args.steps < 1 and not args.eval_only:
        p.error("--steps must be >= 1")
    if args.eval_only and args.init_from is None:
        p.error("--eval-only needs --init-from OUT/model.pt")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False; use --device cpu")
    return args


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """bf16: torch.autocast (matmuls in bf16, softmax and loss in fp32); fp32: nothing."""
    if dtype == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine decay from --lr to --min-lr over the remaining steps."""
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    if step < warmup:
        return float(args.lr * (step + 1) / warmup)
    progress = min(1.0, (step - warmup) / max(1, args.steps - warmup))
    return float(args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(
    model: GPT, ids: np.ndarray, args: argparse.Namespace, seed: int
) -> float:  # fmt: skip
    """Mean loss over --eval-iters batches drawn with `seed`: the same windows every call."""
    was_training = model.training
    model.eval()
    batches = Batches(ids, args.batch_size, model.config.block_size, seed)
    losses = []
    for _ in range(args.eval_iters):
        x, y = batches.next(args.device)
        with autocast(args.device, args.dtype):
            _, loss = model(x, y)
        assert loss is not None
        losses.append(loss)
    model.train(was_training)
    return float(torch.stack(losses).mean())


def environment(device: str) -> dict[str, Any]:
    """Versions and the device, so a log says where its numbers came from."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def load_data(args: argparse.Namespace) -> Corpus:
    return load_corpus(args.data) if args.data is not None else build_corpus()


def _sync(device: str) -> None:
    # CUDA runs asynchronously: time only what has finished
    if device == "cuda":
        torch.cuda.synchronize()


def build_model(args: argparse.Namespace, vocab_size: int) -> GPT:
    """The model, seeded: the same weights for either attention."""
    config = GPTConfig(
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
        block_size=args.block_size, vocab_size=vocab_size, dropout=args.dropout,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    return GPT(config, attention=args.attention).to(args.device)


BACKWARD_MISSING = (
    "flashgen.torch.attention has no backward pass yet, so --attention flashgen cannot train "
    "today. Train with --attention manual --save, then check flashgen's forward on those "
    "weights with --attention flashgen --eval-only --init-from OUT/model.pt"
)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, write OUT/metrics.json, and return what it holds."""
    corpus = load_data(args)
    model = build_model(args, corpus.vocab_size)
    optimizer = torch.optim.AdamW(
        model.optimizer_groups(args.weight_decay), lr=args.lr, betas=(0.9, 0.95)
    )
    batches = Batches(corpus.train, args.batch_size, args.block_size, args.seed)
    val_seed = args.seed + 1  # its own stream: evaluating never shifts the training batches
    tokens_per_step = args.batch_size * args.block_size
    metrics: dict[str, Any] = {
        "attention": args.attention,
        "dtype": args.dtype,
        "seed": args.seed,
        "steps": args.steps,
        "config": model.config.to_dict(),
        "num_params": model.num_params(),
        "tokens_per_step": tokens_per_step,
        "corpus": corpus.meta(),
        "env": environment(args.device),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "losses": [],
        "val": [],
        "tokens_per_s": None,
        "first_step_s": None,
        "peak_mem_bytes": None,
        "error": None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    print(
        f"{args.attention} attention, {model.num_params() / 1e6:.2f}M parameters, "
        f"{args.dtype} on {args.device}, corpus {corpus.sha256[:12]} "
        f"({corpus.train.size} train / {corpus.val.size} val chars)"
    )
    losses: list[torch.Tensor] = []  # kept on the device: no host sync per step
    model.train()
    t_start = time.perf_counter()
    t_steady = t_start
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        x, y = batches.next(args.device)
        with autocast(args.device, args.dtype):
            _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad(set_to_none=True)
        try:
            loss.backward()
        except NotImplementedError as exc:
            if args.attention != "flashgen":
                raise
            metrics["error"] = f"{BACKWARD_MISSING} ({exc})"
            _write(args.out / "metrics.json", metrics)
            raise SystemExit(f"error: {BACKWARD_MISSING}") from None
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        losses.append(loss.detach())
        if step == 0:
            # the first step pays one-off costs (flashgen compiles its kernel, cuBLAS picks
            # algorithms): report it apart and leave it out of the throughput
            _sync(args.device)
            t_steady = time.perf_counter()
            metrics["first_step_s"] = t_steady - t_start
        last = step == args.steps - 1
        periodic = args.eval_interval > 0 and step > 0 and step % args.eval_interval == 0
        if periodic or last:
            metrics["val"].append(
                {"step": step, "loss": evaluate(model, corpus.val, args, val_seed)}
            )
        if step % args.log_interval == 0 or last:
            print(f"step {step:5d} | loss {loss.item():.4f} | lr {lr_at(step, args):.2e}")
    _sync(args.device)
    elapsed = time.perf_counter() - t_steady
    steady_steps = args.steps - 1
    if steady_steps > 0 and elapsed > 0:
        # evaluation time is inside this window; it is small (eval-iters forward passes)
        metrics["tokens_per_s"] = steady_steps * tokens_per_step / elapsed
    else:
        metrics["tokens_per_s"] = tokens_per_step / metrics["first_step_s"]
    metrics["losses"] = torch.stack(losses).float().cpu().tolist()
    if args.device == "cuda":
        metrics["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated())
    if args.save:
        torch.save(
            {"config": model.config.to_dict(), "model": model.state_dict(),
             "corpus": corpus.meta()},
            args.out / "model.pt",
        )  # fmt: skip
    _write(args.out / "metrics.json", metrics)
    val = metrics["val"][-1]["loss"]
    print(
        f"done: train loss {metrics['losses'][-1]:.4f}, val loss {val:.4f}, "
        f"{metrics['tokens_per_s']:.0f} tokens/s -> {args.out / 'metrics.json'}"
    )
    return metrics


def eval_only(args: argparse.Namespace) -> dict[str, Any]:
    """Load --init-from, evaluate train and val loss with --attention, write OUT/eval.json."""
    ckpt = torch.load(args.init_from, map_location=args.device, weights_only=True)
    config = GPTConfig(**ckpt["config"])
    corpus = load_data(args)
    if corpus.sha256 != ckpt["corpus"]["sha256"]:
        print(
            f"warning: corpus {corpus.sha256[:12]} differs from the checkpoint's "
            f"{ckpt['corpus']['sha256'][:12]} (the repository text changed?); pass --data",
            file=sys.stderr,
        )
    model = GPT(config, attention=args.attention).to(args.device)
    model.load_state_dict(ckpt["model"])
    result: dict[str, Any] = {
        "attention": args.attention,
        "dtype": args.dtype,
        "init_from": str(args.init_from),
        "val_loss": evaluate(model, corpus.val, args, args.seed + 1),
        "train_loss": evaluate(model, corpus.train, args, args.seed + 2),
        "env": environment(args.device),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "eval.json", result)
    print(json.dumps(result, indent=1))
    return result


def _write(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.eval_only:
        eval_only(args)
    else:
        train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
