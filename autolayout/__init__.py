"""autolayout: an auto-parallelization planner for JAX.

Trace a training step into ops over named dims, price every way of splitting it on a
hardware profile, and choose the layout and the mesh shape.

    >>> import autolayout as al
    >>> hw = al.hardware("tpu-v4-256")
    >>> hw.num_devices
    128
"""

from .core import AutolayoutError as AutolayoutError
from .core import Dim as Dim
from .core import Graph as Graph
from .core import Hardware as Hardware
from .core import HardwareError as HardwareError
from .core import LayoutError as LayoutError
from .core import Loop as Loop
from .core import MeshError as MeshError
from .core import ModelFileError as ModelFileError
from .core import Op as Op
from .core import Plan as Plan
from .core import PlanDiff as PlanDiff
from .core import PlanError as PlanError
from .core import RuleError as RuleError
from .core import Spec as Spec
from .core import Tensor as Tensor
from .core import TraceError as TraceError
from .core import Workload as Workload
from .core import WorkloadError as WorkloadError
from .core import check_graph as check_graph
from .core import diff as diff
from .core import hardware as hardware
from .core import list_profiles as list_profiles
from .core import load_workload as load_workload
from .core import name_dims as name_dims
from .core import remat as remat
from .core import spec as spec
from .core import splash_attention as splash_attention
from .core import target as target
from .core import trace as trace
from .core import train_workload as train_workload
from .cost_models import evaluate as evaluate
from .runtime import apply as apply
from .runtime import validate as validate
from .search import compare as compare
from .search import plan as plan

__version__ = "0.1.0"
