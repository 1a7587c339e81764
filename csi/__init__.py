"""Praesto CSI node plugin: read-only mounts of cached models."""
