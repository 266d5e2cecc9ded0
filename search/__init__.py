"""The search (strategies, mesh shapes, the ILP). Installed as ``autolayout.search``;
built in the search issue. May import ``autolayout.cost_models``, never the reverse."""
