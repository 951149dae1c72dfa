"""The suite runs under the deterministic environment, as the CLI and the image do."""

from magi2studio import determinism

determinism.apply_defaults()  # before any test starts torch
