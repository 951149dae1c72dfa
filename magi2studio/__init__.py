"""magi2studio: a reproducibility distribution and web studio for MAGI-2 Preview."""

__version__ = "0.1.0"
