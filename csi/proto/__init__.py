"""CSI v1 protocol subset and its generated stubs."""
