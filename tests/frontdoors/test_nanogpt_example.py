"""examples/nanogpt: the manual model trains on CPU, the corpus is deterministic, failures are rows.

CPU-only and fast. The flashgen path needs CUDA (and nvcc to build its kernel): its test is
skipped here with the reason, and on a GPU machine it checks flashgen's forward against the
manual attention on the same weights, then the backward once the op has one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "nanogpt"
PKG = "nanogpt_example"  # a unique name: the example's modules are called model, data, ...


def _load(name: str) -> ModuleType:
    """examples/nanogpt/<name>.py as PKG.<name> (a package, so its relative imports work)."""
    if PKG not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PKG, EXAMPLE / "__init__.py", submodule_search_locations=[str(EXAMPLE)]
        )
        assert spec is not None and spec.loader is not None, f"{EXAMPLE} is missing"
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[PKG] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"{PKG}.{name}")


model = _load("model")
data = _load("data")
train = _load("train")
sweep = _load("sweep")
plot = _load("plot")

TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--batch-size", "8", "--device", "cpu", "--dtype", "fp32", "--log-interval", "1000",
        "--eval-interval", "0", "--eval-iters", "2"]  # fmt: skip
NO_CUDA = "flashgen kernels run on CUDA only and torch.cuda.is_available() is False here"


@pytest.fixture(scope="module")
def corpus() -> object:
    return data.build_corpus()


# ---- data --------------------------------------------------------------------------------
def test_corpus_is_deterministic_and_local(corpus: object) -> None:
    again = data.build_corpus()
    assert corpus.train.dtype == corpus.val.dtype == np.uint16
    assert (corpus.train == again.train).all() and (corpus.val == again.val).all()
    assert corpus.chars == again.chars and corpus.sha256 == again.sha256
    assert corpus.sources[0] == "README.md" and "docs/design.md" in corpus.sources
    assert all((ROOT / s).is_file() for s in corpus.sources)  # read from the repository
    assert corpus.val.size > 1000 and corpus.train.size > 9 * corpus.val.size - 10
    text = corpus.decode(corpus.train[:200])
    assert (corpus.encode(text) == corpus.train[:200]).all()


def test_corpus_roundtrips_through_disk(corpus: object, tmp_path: Path) -> None:
    loaded = data.load_corpus(data.save_corpus(corpus, tmp_path / "c"))
    assert (loaded.train == corpus.train).all() and (loaded.val == corpus.val).all()
    assert loaded.chars == corpus.chars and loaded.sha256 == corpus.sha256


def test_corpus_sources_are_explicit(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("abc\r\nabd\n" * 20)
    c = data.build_corpus(["a.md", "missing/*.txt"], root=tmp_path)  # empty glob: dropped
    assert c.sources == ["a.md"] and c.chars == ["\n", "a", "b", "c", "d"]  # CRLF -> LF
    with pytest.raises(FileNotFoundError, match="not found"):
        data.build_corpus(["nope.md"], root=tmp_path)


def test_batches_depend_on_the_seed_only(corpus: object) -> None:
    a = data.Batches(corpus.train, 4, 16, seed=3)
    b = data.Batches(corpus.train, 4, 16, seed=3)
    for _ in range(3):
        (xa, ya), (xb, yb) = a.next_numpy(), b.next_numpy()
        assert (xa == xb).all() and (ya == yb).all()
        assert (xa[:, 1:] == ya[:, :-1]).all()  # targets are the inputs shifted by one
    c = data.Batches(corpus.train, 4, 16, seed=4)
    assert not (c.next_numpy()[0] == data.Batches(corpus.train, 4, 16, 3).next_numpy()[0]).all()


# ---- model -------------------------------------------------------------------------------
def _tiny_config(**kw: int) -> object:
    return model.GPTConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32,
                              "vocab_size": 50, **kw})  # fmt: skip


def test_both_attentions_start_from_the_same_weights() -> None:
    """Building the flashgen model imports nothing and draws the same random numbers."""
    cfg = _tiny_config()
    torch.manual_seed(0)
    manual = model.GPT(cfg, "manual")
    torch.manual_seed(0)
    flash = model.GPT(cfg, "flashgen")
    sd_m, sd_f = manual.state_dict(), flash.state_dict()
    assert sd_m.keys() == sd_f.keys()  # the mask buffer is not persistent
    assert all(torch.equal(sd_m[k], sd_f[k]) for k in sd_m)
    assert manual.head.weight is manual.tok_emb.weight  # tied head


def test_manual_attention_is_causal_softmax_attention() -> None:
    """The seed's three lines with the registered mask equal SDPA's causal attention."""
    cfg = _tiny_config(n_head=4, n_embd=64)
    torch.manual_seed(0)
    attn = model.CausalSelfAttention(cfg, "manual")
    q, k, v = (torch.randn(2, 4, 20, 16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attn._manual(q, k, v), ref, atol=1e-5, rtol=1e-5)


def test_config_and_attention_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        model.GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="manual, flashgen"):
        model.GPT(_tiny_config(), "sdpa")
    with pytest.raises(ValueError, match="multiple of 8"):
        model.GPT(_tiny_config(n_head=8, n_embd=32), "flashgen")  # head size 4


def test_flashgen_model_on_cpu_says_cuda_only() -> None:
    torch.manual_seed(0)
    m = model.GPT(_tiny_config(), "flashgen")
    with pytest.raises(RuntimeError, match="CUDA only"):
        m(torch.zeros(1, 8, dtype=torch.long))


# ---- training ----------------------------------------------------------------------------
def test_manual_model_trains_on_cpu(tmp_path: Path) -> None:
    metrics = train.train(train.parse_args([*TINY, "--steps", "40", "--out", str(tmp_path)]))
    losses = metrics["losses"]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)  # ~4.7 (uniform over ~110 chars) to ~3.4
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk["losses"] == losses and on_disk["tokens_per_s"] > 0
    assert on_disk["peak_mem_bytes"] is None  # CPU: no torch.cuda memory counters
    assert on_disk["corpus"]["sha256"] == data.build_corpus().sha256
    assert on_disk["val"][-1]["step"] == 39


def test_same_seed_same_curve(tmp_path: Path) -> None:
    """Runs are reproducible, which is what makes manual vs flashgen curves comparable."""
    argv = [*TINY, "--steps", "5"]
    a = train.train(train.parse_args([*argv, "--out", str(tmp_path / "a")]))
    b = train.train(train.parse_args([*argv, "--out", str(tmp_path / "b")]))
    assert a["losses"] == b["losses"]


def test_train_script_runs_and_eval_only_reloads(tmp_path: Path) -> None:
    """As a script (sibling imports), then --eval-only on the saved weights."""
    script = EXAMPLE / "train.py"
    out = tmp_path / "run"
    run = [sys.executable, str(script), *TINY, "--out", str(out)]
    subprocess.run([*run, "--steps", "3", "--save"], check=True, capture_output=True, cwd=ROOT)
    assert (out / "model.pt").is_file()
    args = train.parse_args([*TINY, "--eval-only", "--init-from", str(out / "model.pt"),
                             "--out", str(out)])  # fmt: skip
    result = train.eval_only(args)
    assert result["attention"] == "manual" and 0 < result["val_loss"] < 10


# ---- sweep and plot ----------------------------------------------------------------------
SWEEP = ["--device", "cpu", "--T", "16", "32", "64", "--heads", "2", "--head-dim", "16",
         "--reps", "1", "--warmup", "0"]  # fmt: skip


def test_sweep_records_failures_instead_of_crashing(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    assert sweep.main([*SWEEP, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 * 2 * 2  # T x mode x attention
    manual = [r for r in rows if r["attention"] == "manual"]
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in manual)
    flash = [r for r in rows if r["attention"] == "flashgen"]
    assert all(r["status"] == "error" and "CUDA only" in r["error"] for r in flash)


def test_sweep_records_oom_and_skips_larger_t(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep.measure

    def measure(impl: str, t: int, mode: str, args: object) -> dict[str, object]:
        if impl == "manual" and t >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(impl, t, mode, args)

    monkeypatch.setattr(sweep, "measure", measure)
    result = sweep.run_sweep(sweep.parse_args([*SWEEP, "--attention", "manual",
                                               "--out", "unused.json"]))  # fmt: skip
    status = {(r["T"], r["mode"]): r["status"] for r in result["rows"]}
    assert status[16, "fwd"] == status[16, "fwd_bwd"] == "ok"
    assert status[32, "fwd"] == status[32, "fwd_bwd"] == "oom"
    assert status[64, "fwd"] == status[64, "fwd_bwd"] == "skipped"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        plot._pyplot()


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = []
    for name in ("a", "b"):
        runs.append(tmp_path / name / "metrics.json")
        train.train(train.parse_args([*TINY, "--steps", "3", "--out", str(tmp_path / name)]))
    assert plot.main(["losses", *map(str, runs), "--out", str(tmp_path / "l.png")]) == 0
    sweep.main([*SWEEP, "--attention", "manual", "--out", str(tmp_path / "s.json")])
    assert plot.main(["sweep", str(tmp_path / "s.json"), "--out", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "l.png").stat().st_size > 0 and (tmp_path / "s.png").stat().st_size > 0


# ---- flashgen (CUDA) ---------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_flashgen_matches_manual_on_cuda() -> None:
    """Same weights, same batch: flashgen's logits match the manual path's; then gradients."""
    pytest.importorskip("flashgen.torch")
    cfg = _tiny_config(n_head=4, n_embd=256, block_size=128)  # head size 64
    torch.manual_seed(0)
    manual = model.GPT(cfg, "manual").cuda()
    flash = model.GPT(cfg, "flashgen").cuda()
    flash.load_state_dict(manual.state_dict())
    idx = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        lm, _ = manual(idx)
        lf, _ = flash(idx)
    torch.testing.assert_close(lf.float(), lm.float(), atol=5e-2, rtol=5e-2)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # as train.py --dtype bf16 runs
        _, loss_m = manual(idx, idx)
        _, loss_f = flash(idx, idx)
    try:
        loss_f.backward()
    except NotImplementedError as exc:
        pytest.skip(f"flashgen.torch.attention has no backward yet ({exc})")
    loss_m.backward()
    for (name, pm), pf in zip(manual.named_parameters(), flash.parameters(), strict=True):
        # relative to the gradient's size: bf16 rounding differs between the two paths
        rel = float((pf.grad - pm.grad).norm() / pm.grad.norm().clamp_min(1e-12))
        assert rel < 5e-2, f"{name}: relative gradient difference {rel:.3g}"
