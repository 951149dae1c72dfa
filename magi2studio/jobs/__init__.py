"""The job queue: the outputs root's queue file, its one runner, the ETA learned from past runs."""
