"""autolayout: an auto-parallelization planner for JAX.

Trace a training step into ops over named dims, price every way of splitting it on a
hardware profile, and choose the layout and the mesh shape.

    >>> import autolayout as al
    >>> hw = al.hardware("tpu-v4-256")
    >>> hw.num_devices
    128
"""

from ._errors import AutolayoutError as AutolayoutError
from ._errors import HardwareError as HardwareError
from ._errors import LayoutError as LayoutError
from ._errors import MeshError as MeshError
from ._errors import ModelFileError as ModelFileError
from ._errors import PlanError as PlanError
from ._errors import RuleError as RuleError
from ._errors import TraceError as TraceError
from ._errors import WorkloadError as WorkloadError
from ._evaluate import evaluate as evaluate
from ._hardware import Hardware as Hardware
from ._hardware import hardware as hardware
from ._hardware import list_profiles as list_profiles
from ._ir import Dim as Dim
from ._ir import Graph as Graph
from ._ir import Loop as Loop
from ._ir import Op as Op
from ._ir import Tensor as Tensor
from ._ir import check_graph as check_graph
from ._plan import Plan as Plan
from ._report import PlanDiff as PlanDiff
from ._report import diff as diff
from ._trace import trace as trace
from ._train import train_workload as train_workload
from ._workload import Spec as Spec
from ._workload import Workload as Workload
from ._workload import load_workload as load_workload
from ._workload import name_dims as name_dims
from ._workload import spec as spec


def apply(plan, fn, devices=None, **kw):
    """``fn`` as a ``jax.jit`` function laid out as ``plan`` says (``autolayout.runtime``)."""
    from .runtime import apply as _apply

    return _apply(plan, fn, devices, **kw)


def plan(workload, hw, *, mesh=None, memory_limit=None, time_limit_s=60.0, **kw):
    """The layout and mesh shape with the least predicted step time that fits in memory
    (``autolayout.search``): an :class:`Plan` with status OPTIMAL, FEASIBLE, TIMEOUT or
    INFEASIBLE (then ``plan.solver["least_memory_bytes"]`` says what the least-memory
    layout found needs). ``objective="memory"``: the least peak memory per device instead
    (Mesh-TF's auto_mtf objective). ``deterministic=True``: the same plan on every run
    (the time limit then counts the solver's work, not wall time)."""
    from .search.planner import plan as _plan

    return _plan(
        workload, hw, mesh=mesh, memory_limit=memory_limit, time_limit_s=time_limit_s, **kw
    )


def compare(workload, hw, *, time_limit_s=60.0, **kw):
    """One table (pandas): the planner's layout beside DP, FSDP, Megatron, 2-D,
    Megatron+FSDP and (for convolutions) spatial partitioning, all priced by the same cost
    model (``auto=`` reuses a plan)."""
    from .search.planner import compare as _compare

    return _compare(workload, hw, time_limit_s=time_limit_s, **kw)


def validate(plan, workload=None, devices=None, **kw):
    """The plan's prediction beside what XLA compiles for it (``autolayout.runtime``)."""
    from .runtime import validate as _validate

    return _validate(plan, workload, devices, **kw)


__version__ = "0.1.0"
