"""Shared fixtures: the real SmolLM2 backbone (session-scoped) and a small real index."""
