"""The search: strategies per mesh shape (``request``), the ILP (``ilp``, the one module
that imports OR-Tools), hand layouts (``baselines``), mesh shapes (``meshes``) and the
planner that puts them together (``planner``). Installed as ``autolayout.search``; builds on
``autolayout.core`` and ``autolayout.cost_models``, never the reverse."""

from .baselines import NAMES as NAMES
from .baselines import standard_layout as standard_layout
from .baselines import standard_layouts as standard_layouts
from .clock import WORK_SHARE as WORK_SHARE
from .interrupt import interrupted as interrupted
from .interrupt import mark as mark
from .interrupt import stoppable as stoppable
from .planner import compare as compare
from .planner import plan as plan
