#!/usr/bin/env python3
"""Write ``elastic_dew/proxy/_wire.py`` (the IFRT proxy protocol's message definitions), or check it.

The local Pathways backend (:mod:`elastic_dew.proxy`) speaks the protocol of the proxy client
that ships inside jaxlib. Its messages are defined by ``.proto`` files in the XLA tree
(``xla/python/ifrt_proxy/common/ifrt_service.proto``, ``grpc_ifrt_service.proto`` and what
they import, plus the IFRT serialisation formats of shardings, layouts and compile options).
jaxlib's own library carries the compiled form of exactly those files (each a serialized
``FileDescriptorProto``, as ``protoc`` embeds it), built from the XLA commit that jaxlib
was built from; this script reads them from the installed jaxlib, so the definitions are
pinned to the client they talk to, and writes them (in dependency order) as bytes literals
in the form ``protoc``'s Python generator gives. No gRPC code generator is needed: the server
builds its message classes from these descriptors at import time.

Usage, from the repository root::

    python scripts/ifrt_proxy_protocol.py            # (re)write elastic_dew/proxy/_wire.py
    python scripts/ifrt_proxy_protocol.py --check    # exit 1 if it differs from the installed jaxlib's

``tests/test_proxy_protocol.py`` checks the written file against the installed jaxlib the
same way (every message and field the file defines, with its number and type).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "elastic_dew" / "proxy" / "_wire.py"

#: The files the server needs; everything they import comes along.
ROOTS = (
    "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto",
    "xla/python/ifrt/sharding_serdes.proto",
    "xla/python/pjrt_ifrt/xla_sharding.proto",
    "xla/python/pjrt_ifrt/xla_compiler.proto",
    "xla/python/pjrt_ifrt/pjrt_layout_serdes.proto",
    "xla/python/ifrt/layout_serdes.proto",
)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _extent(data: bytes, start: int) -> int:
    """The end of the FileDescriptorProto that starts at ``start``: its fields (1-14, varints
    and length-delimited only) run until a byte that cannot start one."""
    i = end = start
    while i < len(data):
        try:
            tag, j = _varint(data, i)
            number, wire = tag >> 3, tag & 7
            if not 1 <= number <= 14:
                break
            if wire == 2:
                length, j = _varint(data, j)
                j += length
            elif wire == 0:
                _, j = _varint(data, j)
            else:
                break
        except IndexError:
            break
        if j > len(data):
            break
        i = end = j
    return end


def library() -> Path:
    """The installed jaxlib's shared library that holds the proxy client."""
    import jaxlib

    path = Path(jaxlib.__file__).parent / "libjax_common.so"
    if not path.exists():
        raise SystemExit(f"{path} is missing: this jaxlib keeps its proxy client elsewhere")
    return path


def descriptors(data: bytes, roots=ROOTS) -> dict[str, bytes]:
    """The serialized FileDescriptorProtos in ``data`` for ``roots`` and what they import,
    in dependency order (each after the files it imports)."""
    from google.protobuf import descriptor_pb2

    found: dict[str, tuple[bytes, object]] = {}

    def find(name: str) -> tuple[bytes, object]:
        key = name.encode()
        best = None
        for match in re.finditer(re.escape(bytes([0x0A, len(key)]) + key), data):
            blob = data[match.start():_extent(data, match.start())]
            proto = descriptor_pb2.FileDescriptorProto()
            try:
                proto.ParseFromString(blob)
            except Exception:  # noqa: BLE001 - a string that only looks like a file name
                continue
            if proto.name == name and (best is None or len(blob) > len(best[0])):
                best = (blob, proto)
        if best is None:
            raise SystemExit(f"{name} is not in the library")
        return best

    order: list[str] = []

    def visit(name: str) -> None:
        if name in found:
            return
        found[name] = find(name)
        for dependency in found[name][1].dependency:
            visit(dependency)
        order.append(name)

    for root in roots:
        visit(root)
    return {name: found[name][0] for name in order}


def render(files: dict[str, bytes], version: str) -> str:
    lines = [
        '"""The IFRT proxy protocol\'s message definitions, as compiled into jaxlib '
        f'{version} (generated; do not edit).',
        "",
        "Written by ``scripts/ifrt_proxy_protocol.py`` from the serialized FileDescriptorProtos in",
        "jaxlib's library, in dependency order; :mod:`elastic_dew.proxy.protocol` builds the",
        "message classes from them.",
        '"""',
        "",
        f"JAXLIB = {version!r}",
        "",
        "FILES: dict[str, bytes] = {",
    ]
    for name, blob in files.items():
        lines.append(f"    {name!r}: (")
        for i in range(0, len(blob), 96):
            lines.append(f"        {blob[i:i + 96]!r}")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    import jaxlib

    text = render(descriptors(library().read_bytes()), jaxlib.__version__)
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(REPO)} differs from jaxlib {jaxlib.__version__}'s definitions; "
                  "run python scripts/ifrt_proxy_protocol.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(REPO)} matches jaxlib {jaxlib.__version__}")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)} ({len(text)} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
