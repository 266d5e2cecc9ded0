"""Plans as running JAX programs: shardings, ``al.apply``, ``autolayout run``, and
``al.validate`` against what XLA compiles. Builds on ``autolayout.core`` and
``autolayout.cost_models``; never imports ``autolayout.search``."""

from .apply import apply as apply
from .apply import make_mesh as make_mesh
from .calibrate import calibrate as calibrate
from .calibrate import write_profile as write_profile
from .run import init_distributed as init_distributed
from .run import reference_losses as reference_losses
from .run import run as run
from .validate import hlo_collectives as hlo_collectives
from .validate import validate as validate
