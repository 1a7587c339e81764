"""Downloader shared by the agent, the PVC-mode Job and users."""
