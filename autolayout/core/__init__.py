"""The ground floor every other folder builds on: the named-dimension IR, the jaxpr tracer,
workloads, hardware profiles, layouts, and ``Plan`` (a layout with its prediction, as data,
with the reports over it). Nothing here imports ``cost_models``, ``search`` or
``runtime``; what those folders use of it is exported here."""

from ._dim_rules import ELEMENTWISE as ELEMENTWISE
from ._errors import AutolayoutError as AutolayoutError
from ._errors import HardwareError as HardwareError
from ._errors import LayoutError as LayoutError
from ._errors import MeshError as MeshError
from ._errors import ModelFileError as ModelFileError
from ._errors import PlanError as PlanError
from ._errors import RuleError as RuleError
from ._errors import TraceError as TraceError
from ._errors import WorkloadError as WorkloadError
from ._hardware import Cluster as Cluster
from ._hardware import Hardware as Hardware
from ._hardware import Torus as Torus
from ._hardware import hardware as hardware
from ._hardware import list_profiles as list_profiles
from ._hardware import profile_sources as profile_sources
from ._ir import LOOP_OPS as LOOP_OPS
from ._ir import Dim as Dim
from ._ir import Graph as Graph
from ._ir import Loop as Loop
from ._ir import Op as Op
from ._ir import Tensor as Tensor
from ._ir import check_graph as check_graph
from ._ir import model_named as model_named
from ._ir import op_index as op_index
from ._ir import per_graph as per_graph
from ._layout import Layout as Layout
from ._layout import check_layout as check_layout
from ._layout import local_bytes as local_bytes
from ._layout import local_shape as local_shape
from ._layout import mesh_text as mesh_text
from ._layout import partition_spec as partition_spec
from ._layout import replicated as replicated
from ._layout import split_factor as split_factor
from ._plan import Plan as Plan
from ._report import PlanDiff as PlanDiff
from ._report import collectives_by_kind as collectives_by_kind
from ._report import diff as diff
from ._report import inner_splits as inner_splits
from ._report import op_layers as op_layers
from ._report import rule_lines as rule_lines
from ._report import summary_rows as summary_rows
from ._report import top_ops as top_ops
from ._trace import gc_paused as gc_paused
from ._trace import trace as trace
from ._trace import trace_with_jaxpr as trace_with_jaxpr
from ._train import train_workload as train_workload
from ._workload import Spec as Spec
from ._workload import Workload as Workload
from ._workload import load_workload as load_workload
from ._workload import name_dims as name_dims
from ._workload import path_str as path_str
from ._workload import spec as spec
