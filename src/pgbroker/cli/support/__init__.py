"""What the CLI's commands share."""
