"""autoparallel's planner on its own LLaMA-3 model: the child of ``bench_autoparallel.py``.

Runs in a Python with torch and meta-pytorch/autoparallel installed (not autolayout's; see
``bench_autoparallel.py`` for the setup). It follows autoparallel's
``examples/example_llama3.py`` up to the answer of the planner: a fake 64-rank process group,
a 2-D device mesh ``dp x tp``, the model built on the meta device with selective (per-op)
activation checkpointing, bf16 parameters with fp32 gradient reduction, the default parameter
memory constraint, the batch sharded on ``dp``, the logits vocab-parallel, then
``optimize_placement()`` (an ILP that PuLP hands to CBC). The compile and run steps of the
example (which need GPUs) are left out. Prints one JSON line, prefixed ``RESULT ``.

    python experiments/_autoparallel_llama.py --size 8b --world 64 --tp 8
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

T_START = time.perf_counter()  # before torch is imported

SIZES = {
    # Llama-3-8B: ffn hidden = 14336 (ffn_dim_multiplier 1.3, multiple_of 1024), as the example
    "8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
               multiple_of=1024, rope_theta=500000, vocab_size=128256),
    "tiny": dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim_multiplier=1.3,
                 multiple_of=256, rope_theta=500000, vocab_size=1024),
}  # fmt: skip


def fake_gpu(name: str) -> None:
    """The workaround for a CPU-only torch (autoparallel's main assumes CUDA), three patches:

    - the mesh is a ``cpu`` one (``--device cpu``): a CPU torch cannot make fake CUDA tensors
      that need gradients ("PyTorch is not linked with support for cuda devices");
    - the compute and NCCL cost models see a ``name`` GPU (autoparallel looks its FLOP/s and
      bandwidth up by the device's name, and 8 GPUs a node for H100s), where they would stop at
      "module 'torch.cpu' has no attribute 'get_device_name'";
    - the model's attention calls the op that it traces to on an H100 (cuDNN attention, as in
      autoparallel's own llama3-8b traces in ``tools/overlap_simulator``), where a CPU tensor
      would give ``_scaled_dot_product_flash_attention_for_cpu``, which DTensor has no sharding
      rule for (autoparallel would replicate it)."""
    import torch
    from autoparallel._testing.models import llama3
    from autoparallel.cost_models import compute_estimation as ce

    limit = next(d for d in ce.DEVICE_LIMITS if d.name == name)
    ce._get_device_limit = lambda: limit
    torch.cuda.get_device_name = lambda device=None: f"NVIDIA {name}"

    def cudnn_attention(self, q, k, v):
        cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
        return cudnn(q, k, v, None, True, 0.0, True)[0]  # bias, logsumexp, dropout, causal

    llama3.ScaledDotProductAttention.forward = cudnn_attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="8b")
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--tp", type=int, default=8, help="the mesh is (world / tp) x tp")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=16, help="global batch")
    ap.add_argument("--device", default="cpu", help="the fake mesh's device (cuda: a CUDA torch)")
    ap.add_argument("--fake-gpu", default="H100", help="on a CPU torch: the GPU to plan for")
    a = ap.parse_args()

    import pulp
    import torch
    from autoparallel._testing.models.llama3 import Transformer, TransformerModelArgs, apply_ac
    from autoparallel.api import AutoParallel
    from torch._functorch._aot_autograd.fx_utils import get_named_param_nodes
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor.placement_types import Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if a.fake_gpu and not torch.cuda.is_available():
        fake_gpu(a.fake_gpu)

    t_import = time.perf_counter()
    torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.world)
    mesh = torch.distributed.device_mesh.init_device_mesh(
        a.device, (a.world // a.tp, a.tp), mesh_dim_names=("dp", "tp")
    )

    t0 = time.perf_counter()  # the planning: model build to the answer
    with torch.device("meta"):
        model = Transformer(TransformerModelArgs(**SIZES[a.size], max_seq_len=a.seq))
    apply_ac(model, mode="selective", selective_ac_option="op")
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    vocab = SIZES[a.size]["vocab_size"]

    def input_fn():
        return torch.randint(0, vocab, (a.batch, a.seq), device=torch.device(a.device))

    with AutoParallel(model, input_fn, mesh, mp_policy, repeated_subgraphs=True) as autop:
        autop.add_parameter_memory_constraint(low=None, high=None)
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.add_output_constraints([(Shard(0), Shard(2))])  # vocab parallel, as the example
        t1 = time.perf_counter()
        placement = autop.optimize_placement()
        t2 = time.perf_counter()
        prob = autop.sharding_optimizer.prob
        # the placements chosen for the parameters, layer 0's and the others outside the layers
        params = {}
        for name, node in get_named_param_nodes(autop.gm.graph).items():
            if name.startswith("layers.") and not name.startswith("layers.0."):
                continue
            spec = placement.get(node)
            places = spec.output_specs.placements if spec is not None else ("?",)
            short = name.removeprefix("layers.0.").removeprefix("_checkpoint_wrapped_module.")
            params[short] = "".join(str(p) for p in places)
        result = {
            "status": pulp.LpStatus[prob.status],
            "objective": pulp.value(prob.objective),  # us: each op's compute + comm, summed
            "ilp_variables": len(prob.variables()),
            "ilp_constraints": len(prob.constraints),
            "params": params,
        }
    t3 = time.perf_counter()

    result.update(
        torch=torch.__version__,
        mesh=f"dp={a.world // a.tp} x tp={a.tp}",
        import_s=t_import - T_START,
        build_s=t1 - t0,  # model, trace of the joint graph, the strategies, the ILP
        solve_s=t2 - t1,  # optimize_placement (CBC)
        plan_s=t3 - t0,
        self_maxrss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    )
    print("RESULT " + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
