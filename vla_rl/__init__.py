"""vla_rl package."""
