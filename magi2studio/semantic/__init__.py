"""The semantic check: scenes whose content is known, and a run's score against its scene."""
