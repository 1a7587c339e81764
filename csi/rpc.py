"""Turning driver outcomes into gRPC statuses, the same way for every RPC."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc
from praesto.csi.volume import CsiError

from praesto import names

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")
Handler = Callable[[Self, Req, grpc.ServicerContext], Resp]


def rpc(method: Handler[Self, Req, Resp]) -> Handler[Self, Req, Resp]:
    """Answer CsiError with its code, and any other failure with INTERNAL and its cause.

    The kubelet puts the message into the Pod's events; an unexpected OSError
    still says which operation on which path failed instead of "Exception
    calling application".
    """

    @functools.wraps(method)
    def wrapper(self: Self, request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return method(self, request, context)
        except CsiError as err:
            log.info("%s: %s: %s", method.__name__, err.code.name, err.message)
            context.abort(err.code, err.message)
        except OSError as err:
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__}: {err}")

    return wrapper


def unimplemented(context: grpc.ServicerContext, method: str, why: str) -> NoReturn:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {names.CSI_DRIVER_NAME} {why}")
