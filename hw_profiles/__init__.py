"""Hardware profiles: one TOML file per family (data only). Read with ``al.hardware(name)``."""
