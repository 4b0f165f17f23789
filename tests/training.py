"""A training state as checkpoint code saves it (torch), and an exact comparison."""

from __future__ import annotations

import torch


def training_state(megabytes: int = 200) -> dict[str, object]:
    """Model weights + Adam moments (~3x the weights) + scheduler, RNG and step."""
    torch.manual_seed(1234)
    n_layers = max(1, megabytes * 2**20 // (3 * 4 * 1024 * 1024))
    model = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(n_layers)}
    model["layer0.bias"] = torch.zeros(1024)
    model["embed"] = torch.randn(4096, 128).to(torch.bfloat16)
    optim = {"state": {i: {"step": torch.tensor(500.0), "exp_avg": torch.randn_like(t.float()),
                           "exp_avg_sq": torch.rand_like(t.float())}
                       for i, t in enumerate(model.values())},
             "param_groups": [{"lr": 1e-4, "params": list(range(len(model)))}]}
    return {"model": model, "optimizer": optim, "scheduler": {"last_epoch": 500},
            "rng": torch.get_rng_state(), "step": 500}


def assert_same(a: object, b: object, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), f"tensor differs at {where}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where
