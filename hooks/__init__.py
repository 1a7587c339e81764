"""Praesto hooks for Metacontroller and the admission webhooks."""
