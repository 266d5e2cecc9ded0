"""Plans as running JAX programs: shardings, ``al.apply``, ``al.validate`` against XLA."""

from .apply import apply as apply
from .apply import make_mesh as make_mesh
from .validate import hlo_collectives as hlo_collectives
from .validate import validate as validate
