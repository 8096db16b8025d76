"""The CLI's commands, one module per group."""
