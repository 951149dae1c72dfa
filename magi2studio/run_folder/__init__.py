"""A run folder: its one writer and its readers, the atomic writes, the provenance it records."""
