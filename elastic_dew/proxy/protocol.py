"""The IFRT proxy protocol: its message classes, the versions this server speaks, the choice.

The messages are those of jaxlib's proxy client, built at import time from the definitions
:mod:`elastic_dew.proxy._wire` holds (``scripts/ifrt_proxy_protocol.py`` writes them from the
installed jaxlib) in a descriptor pool of their own, so they never meet another copy of
XLA's protos in the process. :func:`choose_version` is the one rule for which protocol
version a session speaks, and what a client outside it is told.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from elastic_dew.proxy import _wire

__all__ = [
    "MIN_VERSION",
    "MAX_VERSION",
    "SERDES_VERSIONS",
    "SERVICE",
    "ProtocolMismatch",
    "choose_version",
    "restrict",
    "spoken",
    "message",
    "WIRE_JAXLIB",
]

#: The lowest IFRT proxy protocol version this server speaks (jaxlib 0.10.2's client offers 16-25).
MIN_VERSION = 16
#: The highest IFRT proxy protocol version this server speaks.
MAX_VERSION = 25
#: The IFRT SerDes version numbers it reads and writes (jaxlib 0.10.2's client: 0-3).
SERDES_VERSIONS = (0, 3)
#: The gRPC service the proxy client calls.
SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
#: The jaxlib whose definitions :mod:`elastic_dew.proxy._wire` holds.
WIRE_JAXLIB = _wire.JAXLIB

_POOL = descriptor_pool.DescriptorPool()
for _blob in _wire.FILES.values():
    _POOL.Add(descriptor_pb2.FileDescriptorProto.FromString(_blob))
_CLASSES: dict[str, Any] = {}


def message(name: str) -> Any:
    """The message class of ``name`` (a full name, ``xla.ifrt.proxy.IfrtRequest``, or one in
    ``xla.ifrt.proxy`` by its short name, ``IfrtRequest``).

    Raises:
        KeyError: the protocol defines no such message.
    """
    full = name if "." in name else f"xla.ifrt.proxy.{name}"
    cls = _CLASSES.get(full)
    if cls is None:
        cls = _CLASSES[full] = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full))
    return cls


class ProtocolMismatch(Exception):
    """The client's protocol versions and this server's do not meet."""


_SPOKEN = [MIN_VERSION, MAX_VERSION]


def restrict(low: int, high: int) -> None:
    """Speak only versions ``low..high`` of this server's own (an operator's pin).

    Raises:
        ValueError: the range is empty or outside :data:`MIN_VERSION`..:data:`MAX_VERSION`.
    """
    if not MIN_VERSION <= low <= high <= MAX_VERSION:
        raise ValueError(f"protocol versions {low}-{high}: the server speaks {MIN_VERSION}-{MAX_VERSION}; "
                         "give a range within it")
    _SPOKEN[:] = [low, high]


def spoken() -> tuple[int, int]:
    """The protocol versions the server speaks now."""
    return _SPOKEN[0], _SPOKEN[1]


def choose_version(client_min: int, client_max: int) -> int:
    """The protocol version a session with a client offering ``client_min..client_max`` speaks:
    the highest both sides know.

    Raises:
        ProtocolMismatch: the ranges do not meet; its message is the one line the client
            and the server's log show.
    """
    own_low, own_high = spoken()
    low, high = max(client_min, own_low), min(client_max, own_high)
    if low > high:
        raise ProtocolMismatch(
            f"elastic-dew proxy speaks IFRT proxy protocol versions {own_low}-{own_high} "
            f"(those of jaxlib {WIRE_JAXLIB}'s client); this client offers {client_min}-{client_max}: "
            f"run the program with a jaxlib whose proxy client offers a version in {own_low}-{own_high}")
    return high
