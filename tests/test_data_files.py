"""Training data from files: ArrayRecord shards (``elastic-dew data prepare``) read through Grain,
in this process and through real Grain worker processes (``spawn``), with the installed
``ElasticIterator`` and with a stand-in for Grain's next one (:class:`_NextElasticIterator`)."""

from __future__ import annotations

import functools
import json
import multiprocessing
from pathlib import Path

import grain
import numpy as np
import pytest

from elastic_dew import cli, record
from elastic_dew._compat import grain as grain_private
from elastic_dew.elastic.loop import data as data_module
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.runtime import Preempted, PreemptionNotice
from elastic_dew.recipes.data import encode
from elastic_dew.recipes.data.files import load, tokenize

pytestmark = pytest.mark.libraries  # Grain and ArrayRecord

TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!\n"
    "How vexingly quick daft zebras jump?\tSphinx of black quartz, judge my vow.\n"
) * 40


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Two text files through ``elastic-dew data prepare`` (seq_len 15, 3 shards)."""
    root = tmp_path_factory.mktemp("text")
    (root / "a.txt").write_text(TEXT[: len(TEXT) // 2])
    (root / "b.txt").write_text(TEXT[len(TEXT) // 2 :])
    out = root / "prepared"
    assert cli.main(["data", "prepare", "--out", str(out), "--seq-len", "15", "--shards", "3",
                     str(root / "a.txt"), str(root / "b.txt")]) == 0
    return out


def test_prepared_shards_hold_the_text_tokenized_as_lm_does_in_windows_of_seq_len_plus_one(prepared):
    manifest = json.loads((prepared / "dataset.json").read_text())
    assert manifest["seq_len"] == 15 and len(manifest["shards"]) == 3
    assert sorted(p.name for p in prepared.glob("*.array_record")) == manifest["shards"]
    dataset, _ = load(prepared)
    expected, dropped = tokenize(TEXT)
    assert dropped == TEXT.count(",")  # outside the vocabulary; every whitespace run became a space
    normal = " ".join(TEXT.lower().replace(",", "").split())
    np.testing.assert_array_equal(expected[: len(normal)], encode(normal))
    assert len(dataset) == manifest["examples"] == len(expected) // 16
    for index in (0, 1, len(dataset) // 2, len(dataset) - 1):
        np.testing.assert_array_equal(dataset[index]["tokens"], expected[index * 16 : (index + 1) * 16])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len", "0"], "seq_len=0 must be an int >= 1"),
        (["--shards", "100000"], "fewer than the 100000 shards"),
        (["--missing"], "no such file"),
        (["--nonempty"], "is not an empty directory"),
    ],
)
def test_prepare_refuses_bad_input_with_exit_2_before_writing(tmp_path, capsys, args, message):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "out"
    files = [str(text)]
    if args == ["--missing"]:
        files, args = [str(tmp_path / "nope.txt")], []
    if args == ["--nonempty"]:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        args = []
    assert cli.main(["data", "prepare", "--out", str(out), *args, *files]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def _read(data: ElasticData, steps: int) -> list[tuple[np.ndarray, tuple[int, int]]]:
    out = []
    for _ in range(steps):
        batch, span = data.next()
        out.append((batch["tokens"], span))
    return out


def _workers() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.slow
def test_worker_processes_give_the_batches_of_no_workers_across_a_resize_and_reuse_workers_on_a_rewind(prepared):
    dataset, _ = load(prepared)
    plain = ElasticData(dataset)
    plain.start(12)
    want = _read(plain, 3)
    plain.start(8, plain.get_state())
    want += _read(plain, 4)
    plain.close()

    data = ElasticData(dataset, workers=2)
    data.start(12)
    got = _read(data, 3)
    started = _workers()
    assert len(started) >= 2  # real worker processes
    data.start(8, data.get_state())  # another global batch: new workers, exactly once
    got += _read(data, 2)
    saved = data.get_state()
    resized = _workers()
    assert resized and not resized & started
    got += _read(data, 2)
    assert [span for _, span in got] == [span for _, span in want]
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_array_equal(g, w)

    data.start(8, saved)  # a restore to a position these workers passed: the same processes
    again = _read(data, 2)
    assert _workers() == resized
    assert [span for _, span in again] == [span for _, span in want[-2:]]
    for (g, _), (w, _) in zip(again, want[-2:]):
        np.testing.assert_array_equal(g, w)
    data.close()
    assert not _workers() & resized


class _NextElasticIterator(grain.DatasetIterator):
    """A stand-in, written here, for Grain's next ``ElasticIterator``, which no Grain release has
    yet (0.2.18 is the newest) and so cannot be installed here.

    It reproduces the shape of google/grain's ``grain/_src/python/dataset/elastic_iterator.py``
    at commit f5dd0d8a490004ecf07436bbb0222c73cf4c03b9 (its main branch after 0.2.18) that
    ``ElasticData`` relies on, and nothing else (no ``IterDataset`` input, no shard states):

    - a ``grain.DatasetIterator`` (the release's is an ``IterDataset``), built with the
      release's arguments ``(ds, global_batch_size, shard_options, *, read_options,
      multiprocessing_options)``;
    - the reading iterator is the instance attribute ``base_iterator``, created on first use
      (the release names it ``_default_iterator``); here it is the installed release's own
      MapDataset reader, so the batches, the ``global_next_index`` state, and the private
      ``_iterator``/``_global_next_index`` fields ``ElasticData``'s rewind uses are Grain's;
    - ``next``, ``get_state`` and ``set_state`` go to ``base_iterator``; ``set_state`` first
      closes and drops a ``base_iterator`` already created, so the state lands on a new one;
    - ``close()`` leaves ``base_iterator``, and so its worker processes, running (upstream's
      looks for an attribute under another name, which is never set).

    Replace it, and this test's use of it, by the real class when a Grain release ships it.
    """

    def __init__(self, ds, global_batch_size, shard_options, *, read_options=None,
                 multiprocessing_options=None):
        super().__init__()
        self._reader_args = (ds, global_batch_size, shard_options)
        self._reader_kwargs = {"read_options": read_options or grain.ReadOptions(),
                               "multiprocessing_options": multiprocessing_options}

    @functools.cached_property
    def base_iterator(self) -> grain.DatasetIterator:
        return grain_private.READING_ITERATOR.get()(*self._reader_args, **self._reader_kwargs)

    def __next__(self):
        return next(self.base_iterator)

    def get_state(self) -> dict:
        return self.base_iterator.get_state()

    def set_state(self, state) -> None:
        if "base_iterator" in vars(self):
            vars(self).pop("base_iterator").close()
        self.base_iterator.set_state(state)

    def close(self) -> None:
        """Leaves ``base_iterator`` and its workers running, as the next API does."""


@pytest.mark.slow
def test_grain_mains_elastic_iterator_reads_the_same_batches_and_its_workers_stop_on_close(prepared, monkeypatch):
    dataset, _ = load(prepared)
    current = ElasticData(dataset)
    current.start(8, {"global_next_index": 16})
    want = _read(current, 3)
    current.close()

    monkeypatch.setattr(grain.experimental, "ElasticIterator", _NextElasticIterator)
    data = ElasticData(dataset, workers=1)
    data.start(8, {"global_next_index": 16})
    got = _read(data, 3)
    assert isinstance(data._iterator, _NextElasticIterator)
    assert [span for _, span in got] == [span for _, span in want]
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_array_equal(g, w)
    workers = _workers()
    assert workers
    iterator = data._iterator  # held, so that only a close, not garbage collection, stops them
    iterator.close()
    assert _workers() >= workers  # the next API's own close() leaves them running
    data.close()
    assert not _workers() & workers


def test_a_bad_worker_count_is_refused():
    with pytest.raises(ValueError, match="workers=-1 must be an int >= 0"):
        ElasticData(grain.MapDataset.range(4), workers=-1)


class _TokenProgram:
    """Folds every batch of token windows into one int32 (exact on any mesh): a skipped,
    repeated or reordered example, or another example's tokens, change it."""

    width = 16
    microbatch = None  # no gradient accumulation

    def abstract_state(self, mesh):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import replicated

        return {"acc": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated(mesh))}

    def init_state(self, mesh):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import replicated

        return {"acc": jax.device_put(jnp.int32(1), replicated(mesh))}

    def compile(self, mesh, global_batch):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import batch_sharding, replicated

        def step(state, batch):
            folded = jnp.sum(batch["tokens"] * (jnp.arange(self.width, dtype=jnp.int32) + 1))
            acc = state["acc"] * 7 + folded
            return {"acc": acc}, {"loss": acc.astype(jnp.float32)}

        s = replicated(mesh)
        tokens = jax.ShapeDtypeStruct((global_batch, self.width), jnp.int32, sharding=batch_sharding(mesh))
        return jax.jit(step, out_shardings=(s, s)).lower(self.abstract_state(mesh), {"tokens": tokens}).compile()


def _run_files(prepared, tmp_path, workers, schedule, steps=10, notice=None):
    import jax

    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.loop.protocol import ElasticRun
    from elastic_dew.simulate import SimulatedSlices

    dataset, _ = load(prepared)
    config = ElasticConfig(
        minimum_slice_count=3, poll_interval=0.05, timeout=60, global_batch=24, snapshot_every=2,
        checkpoint_every=0, checkpoint_dir=str(tmp_path / f"w{workers}"), precompile_smaller_meshes=False,
    )
    events, pids = [], []
    data = ElasticData(dataset, workers=workers)

    def emit(event):
        events.append(event)
        if event.kind == "step":
            pids.append(frozenset(_workers()))

    try:
        with SimulatedSlices(4, 2, schedule=schedule, fault_log=tmp_path / f"faults{workers}.jsonl"):
            state, step = ElasticRun(_TokenProgram(), data, config, emit=emit, notice=notice).run(steps)
    except Preempted as stop:
        return stop, events, pids
    finally:
        data.close()
    assert step == steps
    return jax.device_get(state)["acc"], events, pids


@pytest.mark.slow
def test_file_data_through_workers_survives_a_slice_loss_and_a_preemption_exactly_once_as_without_workers(prepared, tmp_path):
    """Four simulated slices lose one at step 5 (constant global batch): the run restores the
    snapshot of step 4 on three slices with its workers rewound, not started again; a real
    SIGTERM at step 8 stops it with a checkpoint, and a new run (new workers) resumes there."""
    plain, _, _ = _run_files(prepared, tmp_path, 0, "lose:1@5")
    notice = PreemptionNotice()
    try:
        stop, first, pids = _run_files(prepared, tmp_path, 2, "lose:1@5,preempt@8", notice=notice)
    finally:
        notice.close()
    assert isinstance(stop, Preempted) and stop.step == 8
    assert len(set(pids)) == 1 and pids[0]  # the same worker processes before and after the loss
    acc, second, _ = _run_files(prepared, tmp_path, 2, "lose:1@5,preempt@8")  # both already fired
    assert acc == plain
    resumes = [(e.source, e.step) for e in first + second if e.kind == "resume"]
    assert resumes == [("fresh", 1), ("snapshot", 5), ("checkpoint", 9)]
    steps = record.as_events(record.committed_step_lines(first + second))  # the run record's rule
    assert [tuple(e.examples) for e in steps] == [(24 * k, 24 * (k + 1)) for k in range(10)]

