"""Praesto: a Kubernetes-native model cache.

Shared contract code (names, labels, the store layout, spec parsing) lives in
this package and is imported by `praesto.hooks`, `praesto.agent` and
`praesto.csi`, never re-typed.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("praesto")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
