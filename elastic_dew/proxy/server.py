"""The gRPC face of the local Pathways backend: the IFRT proxy service jaxlib's client calls.

:class:`ProxyService` serves ``xla.ifrt.proxy.GrpcIfrtService`` (its messages from
:mod:`elastic_dew.proxy.protocol`): ``GetVersion`` picks the protocol version
(:func:`~elastic_dew.proxy.protocol.choose_version`, refusing with one line a client it does
not speak), ``IfrtSession`` is one client's stream of requests, each answered in order by a
:class:`~elastic_dew.proxy.session.Session` on the
:class:`~elastic_dew.proxy.backend.ProxyBackend` (a read while a slice hangs beside the
others: it answers only once the slice is lost, restored or woken), and the host-buffer
calls move array bytes between the client and the session's buffer store.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from elastic_dew.proxy import protocol
from elastic_dew.proxy.backend import ProxyBackend
from elastic_dew.proxy.session import HostBuffers, Session

__all__ = ["ProxyService"]

logger = logging.getLogger(__name__)

_SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
_STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
_CHUNK = 1 << 20


class ProxyService:
    """The ``GrpcIfrtService`` handlers over one :class:`ProxyBackend` (every session shares it)."""

    def __init__(self, backend: ProxyBackend):
        self.backend = backend
        self._lock = threading.Lock()
        self._next_session = 1
        self._stores: dict[int, HostBuffers] = {}
        self.refusals: list[str] = []
        self.sessions = 0

    def handler(self) -> grpc.GenericRpcHandler:
        m = protocol.message
        return grpc.method_handlers_generic_handler(protocol.SERVICE, {
            "GetVersion": grpc.unary_unary_rpc_method_handler(
                self.get_version, m("GrpcGetVersionRequest").FromString, _serialize),
            "IfrtSession": grpc.stream_stream_rpc_method_handler(
                self.ifrt_session, m("IfrtRequest").FromString, _serialize),
            "HostBufferStore": grpc.stream_unary_rpc_method_handler(
                self.host_buffer_store, m("GrpcHostBufferStoreRequest").FromString, _serialize),
            "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
                self.host_buffer_lookup, m("GrpcHostBufferLookupRequest").FromString, _serialize),
            "HostBufferDelete": grpc.unary_unary_rpc_method_handler(
                self.host_buffer_delete, m("GrpcHostBufferDeleteRequest").FromString, _serialize),
        })

    def get_version(self, request: Any, context: grpc.ServicerContext) -> Any:
        logger.info("a client offers protocol versions %d-%d, IFRT SerDes versions %d-%d",
                    request.min_version.protocol_version, request.max_version.protocol_version,
                    request.min_version.ifrt_serdes_version_number, request.max_version.ifrt_serdes_version_number)
        try:
            version = protocol.choose_version(request.min_version.protocol_version,
                                              request.max_version.protocol_version)
        except protocol.ProtocolMismatch as refusal:
            with self._lock:
                first = not self.refusals
                self.refusals.append(str(refusal))
            if first:
                logger.error("%s", refusal)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
        low, high = protocol.SERDES_VERSIONS
        serdes = min(high, request.max_version.ifrt_serdes_version_number)
        if serdes < max(low, request.min_version.ifrt_serdes_version_number):
            message = (f"elastic-dew proxy reads IFRT SerDes versions {low}-{high}; this client offers "
                       f"{request.min_version.ifrt_serdes_version_number}-"
                       f"{request.max_version.ifrt_serdes_version_number}")
            self.refusals.append(message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        out = protocol.message("GrpcGetVersionResponse")()
        out.version.protocol_version = version
        out.version.ifrt_serdes_version_number = serdes
        return out

    def ifrt_session(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        metadata = dict(context.invocation_metadata())
        raw = metadata.get(_SESSION_METADATA)
        if raw is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing session metadata {_SESSION_METADATA}")
        session_metadata = protocol.message("GrpcIfrtSessionMetadata").FromString(raw)
        with self._lock:
            session_id = self._next_session
            self._next_session += 1
            self.sessions += 1
            store = self._stores[session_id] = HostBuffers()
        session = Session(self.backend, session_metadata.version.protocol_version, session_id, store)
        logger.info("session %d: protocol version %d", session_id, session.version)
        try:
            yield from _answers(session, requests)
        finally:
            with self._lock:
                self._stores.pop(session_id, None)
            logger.info("session %d ended", session_id)

    def _store(self, session_id: int, context: grpc.ServicerContext) -> HostBuffers:
        with self._lock:
            store = self._stores.get(session_id)
        if store is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"session {session_id} does not exist")
        assert store is not None, "grpc's abort raises"
        return store

    def host_buffer_store(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        metadata = dict(context.invocation_metadata())
        raw = metadata.get(_STORE_METADATA)
        if raw is None:
            context.abort(grpc.StatusCode.INTERNAL, "missing host buffer store metadata")
        meta = protocol.message("GrpcHostBufferStoreMetadata").FromString(raw)
        store = self._store(meta.session_id, context)
        data = b"".join(r.data for r in requests)
        if len(data) != meta.buffer_size:
            context.abort(grpc.StatusCode.DATA_LOSS, f"expected {meta.buffer_size} bytes, got {len(data)}")
        store.put(meta.handle, data)
        return protocol.message("GrpcHostBufferStoreResponse")()

    def host_buffer_lookup(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        store = self._store(request.session_id, context)
        data = store.get(request.handle)
        if data is None:  # copy_to_host_buffer answers before the lookup asks
            context.abort(grpc.StatusCode.NOT_FOUND, f"host buffer {request.handle} does not exist")
        assert data is not None, "grpc's abort raises"
        response = protocol.message("GrpcHostBufferLookupResponse")
        if not data:
            yield response()
        for offset in range(0, len(data), _CHUNK):
            yield response(data=data[offset:offset + _CHUNK])

    def host_buffer_delete(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._store(request.session_id, context).pop(request.handle)
        return protocol.message("GrpcHostBufferDeleteResponse")()


#: The requests that read a result: on a hung slice they answer only once it is lost,
#: restored or woken, and a step's while the program has not yet seen a returned slice
#: (:meth:`~elastic_dew.proxy.faults.StepSchedule.hold`), so they are answered beside the
#: session's other requests.
_READS = frozenset({"check_value_ready_request", "copy_to_host_buffer_request", "check_future_request",
                    "loaded_executable_fetch_execute_result_request"})


def _answers(session: Session, requests: Iterator[Any]) -> Iterator[Any]:
    """The responses to a session's ``requests``, each answered one numbered as it is sent: in order, but
    a read while a slice hangs is answered on a thread of its own (a read that never answers
    holds up no other request, as a Pathways worker that stopped answering holds up none)."""
    out: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            for request in requests:
                stepper = session.backend.stepper
                waits = session.backend.slices.states.hung or (stepper is not None and stepper.holding)
                if waits and request.WhichOneof("request") in _READS:
                    threading.Thread(target=lambda r=request: out.put(session.answer(r)), daemon=True,
                                     name="elastic-dew-proxy-read").start()
                else:
                    out.put(session.answer(request))
        except grpc.RpcError:  # the client went away: the session ends
            pass
        finally:
            out.put(None)

    threading.Thread(target=read, daemon=True, name="elastic-dew-proxy-session").start()
    seq = 0
    while (response := out.get()) is not None:
        if not response.response_metadata.status.code:
            response.response_metadata.seq_num = seq
            seq += 1
        yield response


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()
