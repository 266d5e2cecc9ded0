"""Cost models: the price of a layout. Compute on the chip's rooflines, collectives on the
real interconnect, memory against HBM (``compute``, ``collectives``, ``memory``), per-op
strategies and resharding (``sharding``), Mesh-TF rules (``rules``), a whole step priced
(``pricing``) and as a ``Plan`` (``plans``: ``evaluate``). Installed as
``autolayout.cost_models``; builds on ``autolayout.core`` alone. What ``search`` and
``runtime`` use of it is exported here."""

from .collectives import COMBINE_BYTES as COMBINE_BYTES
from .collectives import COMBINED_KINDS as COMBINED_KINDS
from .collectives import collective_time as collective_time
from .collectives import place_mesh as place_mesh
from .compute import kernel_notes as kernel_notes
from .compute import op_time as op_time
from .compute import peak_flops as peak_flops
from .memory import aliased_outputs as aliased_outputs
from .memory import lifetimes as lifetimes
from .memory import liveness_peak as liveness_peak
from .pipeline import RUNNABLE as RUNNABLE
from .pipeline import SCHEDULES as SCHEDULES
from .pipeline import edge_conflict as edge_conflict
from .pipeline import flops_as_compiled as flops_as_compiled
from .pipeline import pipelined_plan as pipelined_plan
from .pipeline import price_pipeline as price_pipeline
from .pipeline import stage_hardware as stage_hardware
from .plans import donated_inputs as donated_inputs
from .plans import evaluate as evaluate
from .plans import output_layouts as output_layouts
from .plans import plan_from_costs as plan_from_costs
from .pricing import price as price
from .pricing import recomputed_ops as recomputed_ops
from .pricing import step_time as step_time
from .rules import RuleSet as RuleSet
from .rules import RuleSpec as RuleSpec
from .rules import check_mesh as check_mesh
from .rules import normalize_rules as normalize_rules
from .sharding import LOOP_OPS as LOOP_OPS
from .sharding import PROMOTED_ON_CPU as PROMOTED_ON_CPU
from .sharding import Group as Group
from .sharding import Machine as Machine
from .sharding import boundaries as boundaries
from .sharding import boundary_comms as boundary_comms
from .sharding import conv_spatial as conv_spatial
from .sharding import copy_layout as copy_layout
from .sharding import free_tensors as free_tensors
from .sharding import fused_ops as fused_ops
from .sharding import halo as halo
from .sharding import layouts_of as layouts_of
from .sharding import map_layout as map_layout
from .sharding import op_cost as op_cost
from .sharding import op_groups as op_groups
from .sharding import op_kind as op_kind
from .sharding import op_signature as op_signature
from .sharding import op_template as op_template
from .sharding import op_tensors as op_tensors
from .sharding import reshard as reshard
from .sharding import stacked_residuals as stacked_residuals
from .sharding import state_dims as state_dims
