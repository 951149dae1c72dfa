"""Training the embedded engine's tiny MAGI-2 on captioned scenes (see :mod:`.trainer`)."""
