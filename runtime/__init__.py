"""Plans as running JAX programs: shardings, ``al.apply``, ``autolayout run``, and
``al.validate`` against what XLA compiles. Builds on ``autolayout.core`` and
``autolayout.cost_models``; never imports ``autolayout.search``."""

from .apply import apply as apply
from .apply import make_mesh as make_mesh
from .calibrate import calibrate as calibrate
from .calibrate import write_profile as write_profile
from .checkpoint import KEEP as KEEP
from .checkpoint import Checkpoints as Checkpoints
from .cluster import SUPERVISED as SUPERVISED
from .cluster import cluster_identity as cluster_identity
from .cluster import detect_cluster as detect_cluster
from .cluster import supervise as supervise
from .run import HEARTBEAT_S as HEARTBEAT_S
from .run import PeerError as PeerError
from .run import init_distributed as init_distributed
from .run import reference_losses as reference_losses
from .run import run as run
from .validate import MEMORY_TOLERANCE as MEMORY_TOLERANCE
from .validate import hlo_collectives as hlo_collectives
from .validate import validate as validate
