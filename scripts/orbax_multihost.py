"""Real multi-host Orbax on ckptfs: N JAX processes on this machine, one mount each.

    python scripts/orbax_multihost.py save --steps 20 DIR0 DIR1
    python scripts/orbax_multihost.py restore DIR0 DIR1

Starts one process per directory (process i uses DIRi: its own mount of one store, as a
host of a multi-host job would), joined by `jax.distributed.initialize` (gloo collectives
on CPU). `save` makes a global array sharded across the processes plus a replicated
scalar, and saves it with an async `CheckpointManager` (max_to_keep 3) at every step;
`restore` restores the latest step and checks every shard bit for bit against the values
`save` wrote (they are derived from the step, so any node can check them). Exit status 0
only when every process succeeded. Needs jax[cpu] and orbax-checkpoint (the test extra).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_platforms", "cpu")
    pid, n, port, mode, steps, directory = (int(sys.argv[1]), int(sys.argv[2]),
        sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n, process_id=pid,
                               initialization_timeout=120)
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharded = NamedSharding(mesh, PartitionSpec("x"))
    replicated = NamedSharding(mesh, PartitionSpec())
    shape = (n * 512, 256)

    def values(step):
        base = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        return base * (step + 1) + step

    def state(step):
        full = values(step)
        return {"w": jax.make_array_from_callback(shape, sharded, lambda i: full[i]),
                "step": jax.make_array_from_callback((), replicated,
                                                     lambda i: np.int32(step))}

    options = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=True)
    with ocp.CheckpointManager(directory, options=options) as mngr:
        if mode == "save":
            for step in range(steps):
                mngr.save(step, args=ocp.args.StandardSave(state(step)))
            mngr.wait_until_finished()
            print(f"process {pid}: saved steps {sorted(mngr.all_steps())}", flush=True)
        else:
            step = mngr.latest_step()
            abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state(0))
            got = mngr.restore(step, args=ocp.args.StandardRestore(abstract))
            want = values(step)
            for shard in got["w"].addressable_shards:
                assert np.array_equal(np.asarray(shard.data), want[shard.index]), shard.index
            assert int(got["step"]) == step
            print(f"process {pid}: restored step {step}, bit for bit", flush=True)
    jax.distributed.shutdown()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(mode: str, dirs: list[str], steps: int, timeout: float, verbose: bool = False) -> int:
    """Run one worker per directory; print their output; 0 when all succeeded."""
    port = str(free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(len(dirs)), port, mode,
                               str(steps), d], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
             for i, d in enumerate(dirs)]
    failed = 0
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            print(f"process {i}: timed out after {timeout:g} s", file=sys.stderr)
        if p.returncode != 0:
            failed += 1
            print(f"process {i} failed (exit {p.returncode}):\n{out[-4000:]}", file=sys.stderr)
        elif verbose:
            print(out)
        else:
            print(out.strip().splitlines()[-1] if out.strip() else f"process {i}: ok")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("save", "restore"))
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="the checkpoint directory of each process (one mount each)")
    parser.add_argument("--steps", type=int, default=20, help="steps to save (default 20)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before the processes are killed (default 600)")
    parser.add_argument("--verbose", action="store_true",
                        help="print every process's whole output (Orbax's log)")
    args = parser.parse_args()
    return run(args.mode, args.dirs, args.steps, args.timeout, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
