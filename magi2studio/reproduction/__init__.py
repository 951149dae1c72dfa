"""Reports beside run folders: a sample set reproduced against references, paired A/B runs."""
