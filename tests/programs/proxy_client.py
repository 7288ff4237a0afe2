"""A JAX program run on the local Pathways backend by ``tests/test_proxy.py`` (no elastic_dew
in its process): ``pathwaysutils.initialize()``, then what the test names, each result
printed as one JSON line ``{"check": NAME, ...}``.

    python proxy_client.py basics
    python proxy_client.py faults CONTROL_ADDRESS
    python proxy_client.py paced    (the test loses and restores slice 1 between the lines it sends)
"""

import json
import sys

import pathwaysutils

pathwaysutils.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def say(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def basics():
    devices = jax.devices()
    say("devices", platform=jax.default_backend(), ids=[d.id for d in devices],
        slices=[d.slice_index for d in devices])
    x = jax.device_put(np.arange(8, dtype=np.float32), devices[5])
    say("device_put", value=np.asarray(x).tolist(), device=next(iter(x.devices())).id)
    y = jax.jit(lambda a: a * 2 + 1)(x)
    say("jit", value=np.asarray(y).tolist())
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    z = jax.device_put(a, NamedSharding(mesh, P("data", "model")))
    w = jax.jit(lambda m: (m @ m.T).sum(axis=0), out_shardings=NamedSharding(mesh, P("model")))(z)
    say("spmd", value=np.asarray(w).tolist(), expected=(a @ a.T).sum(axis=0).tolist(),
        shards=sorted(len(s.data.shape) and s.data.shape[0] for s in w.addressable_shards))
    h = jax.device_put(z, NamedSharding(mesh, P("data", "model"), memory_kind="pinned_host"))
    back = jax.device_put(h, NamedSharding(mesh, P(), memory_kind="device"))
    say("pinned_host", kind=h.sharding.memory_kind, value=np.asarray(back).tolist(), expected=a.tolist())
    b = jnp.asarray(np.arange(6, dtype=np.int32).reshape(2, 3)).astype(jnp.bfloat16)
    say("bfloat16", value=np.asarray(b.astype(jnp.float32)).tolist())


def faults(address):
    import grpc
    from pathwaysutils.elastic import elastic

    channel = grpc.insecure_channel(address)

    def control(method, **request):
        call = channel.unary_unary(f"/elastic_dew.proxy.Control/{method}", request_serializer=lambda o: json.dumps(o).encode(),
                                   response_deserializer=json.loads)
        return call(request, timeout=10)

    devices = jax.devices()
    on_1 = jax.device_put(np.ones(4, np.float32), devices[4])  # slice 1, never read before the loss
    on_1.block_until_ready()  # (a read would keep a host copy in this process)
    probe = jax.device_put(np.ones(4, np.float32), devices[4])
    say("before", read=read(probe), active=sorted(elastic.get_active_slice_indices()))
    control("Lose", slice=1)
    later = jax.jit(lambda a: a + 1)(on_1)  # the dispatch itself does not fail
    say("dispatched")
    say("lost", old=read(on_1), later=read(later), active=sorted(elastic.get_active_slice_indices()),
        other=read(jax.device_put(np.ones(2, np.float32), devices[0])))
    control("Restore", slice=1)
    fresh = jax.jit(lambda a: a + 1)(jax.device_put(np.ones(4, np.float32), devices[4]))
    say("restored", fresh=read(fresh), old=read(on_1), active=sorted(elastic.get_active_slice_indices()))


def read(array):
    """An array's value, or its error's code and whether pathwaysutils counts it as slice-down."""
    from pathwaysutils.elastic import elastic

    try:
        return {"value": np.asarray(array).tolist()}
    except jax.errors.JaxRuntimeError as error:
        return {"error": str(error).split(":")[0], "slice_down": elastic.is_error_due_to_slice_down(error)}


def paced():
    """Reads slice 1's arrays before a loss, during it and after the return; the test loses and
    restores the slice (``LocalPathways.lose_slice``, ``restore_slice``) and then sends a line."""
    from pathwaysutils.elastic import elastic

    devices = jax.devices()
    held = jax.device_put(np.ones(4, np.float32), devices[4])  # slice 1, never read before the loss
    held.block_until_ready()
    say("before", active=sorted(elastic.get_active_slice_indices()))
    sys.stdin.readline()  # slice 1 is lost
    later = jax.jit(lambda a: a + 1)(jax.device_put(np.ones(4, np.float32), devices[4]))
    say("lost", held=read(held), later=read(later), other=read(jax.jit(lambda a: a + 1)(
        jax.device_put(np.ones(2, np.float32), devices[0]))), active=sorted(elastic.get_active_slice_indices()))
    sys.stdin.readline()  # slice 1 is back
    fresh = jax.jit(lambda a: a + 1)(jax.device_put(np.ones(4, np.float32), devices[4]))
    say("restored", fresh=read(fresh), held=read(held), active=sorted(elastic.get_active_slice_indices()))


if __name__ == "__main__":
    if sys.argv[1] == "basics":
        basics()
    elif sys.argv[1] == "paced":
        paced()
    else:
        faults(sys.argv[2])
