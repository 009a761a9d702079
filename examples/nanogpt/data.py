"""A character-level corpus built from this repository's own text: no download, deterministic.

Sources (`DEFAULT_SOURCES`, paths relative to the repository root, each glob sorted by name):

- `README.md`: the project's front page (~13 kB).
- `docs/*.md`: the user's guides (usage, CLI, results) and the design notes.
- `shared/reference/*.txt`: the seed text (`seed-flashattention-walk.txt`), *if* the checkout
  has a `shared/` folder; most checkouts don't (the seed lives beside the repository), so the
  default corpus is README.md + docs/*.md, about 115 kB of text.

The files are read at run time, so the corpus follows the repository: when README.md changes,
so does the data. `Corpus.sha256` fingerprints the exact text and every training log records it;
two runs are comparable only when their fingerprints match. To pin a corpus across edits, save
it once (`python examples/nanogpt/data.py --out DIR`) and train with `--data DIR`.

Encoding: the vocabulary is the sorted set of characters in the text (Unicode code points, so
`·`, `ᵀ` and `≈` are tokens too), ids stored as uint16. The split is the first 90% of the
characters for training and the last 10% for validation, contiguous, as nanoGPT's char
Shakespeare does (a random split would leak the same sentences into both).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCES: tuple[str, ...] = ("README.md", "docs/*.md", "shared/reference/*.txt")
SEPARATOR = "\n\n"  # between files, so one file's last line does not run into the next's
VAL_FRACTION = 0.1


@dataclass
class Corpus:
    """Encoded train/val ids, the vocabulary and where the text came from."""

    train: np.ndarray  # uint16 ids
    val: np.ndarray  # uint16 ids
    chars: list[str]  # id -> character
    sources: list[str]  # files read, relative to the root they were read from
    sha256: str  # of the exact concatenated text
    stoi: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Characters -> uint16 ids (KeyError for a character outside the vocabulary)."""
        return np.array([self.stoi[c] for c in text], dtype=np.uint16)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """uint16 ids -> characters."""
        return "".join(self.chars[int(i)] for i in ids)

    def meta(self) -> dict[str, object]:
        """What a log needs to tell corpora apart (not the data itself)."""
        return {
            "sources": self.sources,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "train_tokens": int(self.train.size),
            "val_tokens": int(self.val.size),
        }


def resolve_sources(patterns: Sequence[str], root: Path) -> list[Path]:
    """Expand each pattern under root, sorted; a plain path that is missing is an error.

    A glob that matches nothing is skipped (that is how an absent `shared/` drops out), but
    when no pattern matches anything there is no corpus, and that is an error.
    """
    files: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            files.extend(sorted(p for p in root.glob(pattern) if p.is_file()))
            continue
        path = root / pattern
        if not path.is_file():
            raise FileNotFoundError(f"{path}: corpus source not found; pass existing files")
        files.append(path)
    unique = list(dict.fromkeys(files))  # a file named twice is read once
    if not unique:
        raise FileNotFoundError(f"no corpus source matched {list(patterns)} under {root}")
    return unique


def build_corpus(sources: Sequence[str] = DEFAULT_SOURCES, root: Path | str = REPO_ROOT) -> Corpus:
    """Read the sources (UTF-8), concatenate, build the vocabulary, encode and split."""
    root = Path(root)
    files = resolve_sources(sources, root)
    # newline=None turns CRLF into LF, so a Windows checkout builds the same corpus
    text = SEPARATOR.join(p.read_text(encoding="utf-8") for p in files)
    chars = sorted(set(text))
    if len(chars) > np.iinfo(np.uint16).max:
        raise ValueError(f"{len(chars)} distinct characters do not fit uint16 ids")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((stoi[c] for c in text), dtype=np.uint16, count=len(text))
    n_train = int(len(ids) * (1.0 - VAL_FRACTION))
    return Corpus(
        train=ids[:n_train].copy(),
        val=ids[n_train:].copy(),
        chars=chars,
        sources=[p.relative_to(root).as_posix() for p in files],
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
    )


def save_corpus(corpus: Corpus, out: Path | str) -> Path:
    """Write train.bin / val.bin (raw uint16) and meta.json (vocabulary, sources, hash)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus.train.tofile(out / "train.bin")
    corpus.val.tofile(out / "val.bin")
    meta = {**corpus.meta(), "chars": corpus.chars}
    (out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n")
    return out


def load_corpus(path: Path | str) -> Corpus:
    """Read a corpus written by `save_corpus`."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    return Corpus(
        train=np.fromfile(path / "train.bin", dtype=np.uint16),
        val=np.fromfile(path / "val.bin", dtype=np.uint16),
        chars=list(meta["chars"]),
        sources=list(meta["sources"]),
        sha256=str(meta["sha256"]),
    )


class Batches:
    """Random (x, y) windows from one split, drawn by NumPy's PCG64 seeded with `seed`.

    The draws depend on the seed, the split's length, batch size and block size only: not on
    the model, its attention, torch's RNG or the device. So two runs with the same seed see the
    same batches in the same order, and their loss curves can be compared step by step.
    """

    def __init__(self, ids: np.ndarray, batch_size: int, block_size: int, seed: int) -> None:
        if ids.size < block_size + 2:
            raise ValueError(
                f"split of {ids.size} tokens is too short for block_size {block_size}; use a "
                "smaller block_size or more text"
            )
        self.ids = ids
        self.batch_size = batch_size
        self.block_size = block_size
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def next_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """One batch as int64 arrays (B, T): inputs and the next-character targets."""
        starts = self.rng.integers(0, self.ids.size - self.block_size - 1, size=self.batch_size)
        offsets = np.arange(self.block_size)
        x = self.ids[starts[:, None] + offsets].astype(np.int64)
        y = self.ids[starts[:, None] + offsets + 1].astype(np.int64)
        return x, y

    def next(self, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """One batch as torch int64 tensors on `device`."""
        import torch  # here, so the corpus part of this module works without torch

        x, y = self.next_numpy()
        return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: build the corpus, print its summary, optionally save it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write train.bin, val.bin, meta.json here")
    parser.add_argument(
        "--source", action="append", dest="sources",
        help=f"file or glob relative to --root (repeatable; default {' '.join(DEFAULT_SOURCES)})",
    )  # fmt: skip
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="where sources are read")
    args = parser.parse_args(argv)
    corpus = build_corpus(args.sources or DEFAULT_SOURCES, args.root)
    print(json.dumps(corpus.meta(), indent=1))
    if args.out is not None:
        print(f"saved to {save_corpus(corpus, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
