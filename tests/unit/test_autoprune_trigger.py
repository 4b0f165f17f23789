"""autoprune: which applied op asks for a prune of which directory (the checkpoint
directory is the nearest one, or the path itself for a directory, whose name matches the
pattern; its parent is pruned), and the mount options' checks (MountConfig)."""

from __future__ import annotations

import pytest

from ckptfs.common.config import MountConfig
from ckptfs.common.errors import ConfigError
from ckptfs.fs.autoprune import Policy, prune_target
from ckptfs.pipeline.journal import Op
from ckptfs.tools.retention import PolicyError


@pytest.mark.parametrize(("kind", "path", "path2", "target"), [
    ("put_file", "run/checkpoint-100/model.safetensors", None, "run"),
    ("put_file", "run/checkpoint-100/global_step100/mp_rank_00.pt", None, "run"),
    ("put_dir", "run/checkpoint-100", None, "run"),
    ("put_dir", "run/checkpoint-100/global_step100", None, "run"),
    ("put_file", "checkpoint-7/w.pt", None, ""),  # at the root: the root is pruned
    ("put_dir", "checkpoint-7", None, ""),
    ("rename_dir", "run/tmp-checkpoint-100", "run/checkpoint-100", "run"),
    ("rename_file", "run/checkpoint-100/x.tmp", "run/checkpoint-100/x", "run"),
    ("put_file", "a/checkpoint-1/b/checkpoint-2/f", None, "a/checkpoint-1/b"),  # nearest
    ("put_file", "run/checkpoint-100", None, None),  # a file, not a directory
    ("put_file", "run/runs/events.out", None, None),  # tensorboard logs: no checkpoint
    ("put_dir", "run", None, None),
    ("rename_dir", "run/checkpoint-100", "run/old-100", None),  # renamed away
    ("delete_file", "run/checkpoint-100/x", None, None),  # deletes never trigger
    ("delete_dir", "run/checkpoint-100", None, None),
])
def test_prune_target(kind: str, path: str, path2: str | None, target: str | None) -> None:
    assert prune_target(Op(1, kind, path, path2), "checkpoint-*") == target


def test_the_pattern_matches_whole_names() -> None:
    op = Op(1, "put_file", "run/global_step300/mp_rank_00_model_states.pt")
    assert prune_target(op, "global_step*") == "run"
    assert prune_target(op, "step*") is None  # fnmatch: the whole name, case-sensitive
    assert prune_target(op, "GLOBAL_STEP*") is None
    assert prune_target(op, "*") == "run"


def test_policy_is_checked_like_prune() -> None:
    assert Policy(3, 1000, "step-*").describe() == "keep-last 3, keep-every 1000"
    for last, every in ((0, None), (-1, None), (2, 0)):
        with pytest.raises(PolicyError):
            Policy(last, every, "*")


def config(**kw: object) -> MountConfig:
    return MountConfig(store="/s", mountpoint="/m", node_id="n", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "message"), [
    ({"keep_every": 5}, "--keep-every needs --keep-last N"),
    ({"keep_pattern": "step-*"}, "--keep-pattern needs --keep-last N"),
    ({"keep_every": 5, "keep_pattern": "s*"}, "--keep-every and --keep-pattern need"),
    ({"keep_last": 2}, "--keep-last needs --keep-pattern GLOB"),
    ({"keep_last": 2, "keep_pattern": "run/step-*"}, "one directory name"),
    ({"keep_last": 2, "keep_pattern": ""}, "one directory name"),
    ({"fast_keep": 3}, "^--fast-keep needs --fast-tier DIR"),
    ({"fast_size": 1 << 30}, "^--fast-size needs --fast-tier DIR"),
    ({"fast_keep": 2, "fast_size": 1}, "^--fast-keep and --fast-size need --fast-tier DIR"),
])
def test_mount_options_that_do_not_go_together(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        config(**kw)
    assert "\n" not in str(e.value)


def test_auto_prune_is_off_by_default() -> None:
    cfg = config()
    assert cfg.keep_last is None and cfg.keep_every is None and cfg.keep_pattern is None
    cfg = config(keep_last=3, keep_every=100, keep_pattern="checkpoint-*")
    assert (cfg.keep_last, cfg.keep_every, cfg.keep_pattern) == (3, 100, "checkpoint-*")
