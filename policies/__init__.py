"""policies package."""
