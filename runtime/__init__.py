"""The runtime (plans to shardings, apply, validate, run). Installed as
``autolayout.runtime``; never imports ``autolayout.search``."""
