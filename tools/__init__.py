"""Command-line tools that serve the whole repository (pinned artifacts)."""
