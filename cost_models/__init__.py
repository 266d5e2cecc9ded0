"""Cost models (compute roofline, collectives on a topology, memory). Installed as
``autolayout.cost_models``; built in the cost-model issue, on the IR in ``autolayout._ir``."""
