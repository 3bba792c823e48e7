"""sims package."""
