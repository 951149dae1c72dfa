"""A run folder and what fills it: its writer and readers, media, provenance, step timing."""
