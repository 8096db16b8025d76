"""pgbroker's benchmark scenarios; each module runs on its own (python -m bench.<name>)."""
