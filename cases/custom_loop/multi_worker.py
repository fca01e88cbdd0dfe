"""The seed's loop on several workers: `MultiWorkerMirroredStrategy`, one process per worker.

The migration: the tutorial's loop moved to `MultiWorkerMirroredStrategy` the way TensorFlow's
"Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial does it. Each
worker builds its own input with `strategy.distribute_datasets_from_function`: the training
set shuffled with the same seed on every worker, sharded by the `InputContext`
(`dataset.shard(num_input_pipelines, input_pipeline_id)`: worker w reads examples w, w+W, ...)
and batched with the per-replica share of the global batch
(`input_context.get_per_replica_batch_size`). At the end of each epoch the chief saves the
checkpoint; every other worker saves to a temporary directory of its own and deletes it.

Sharding by example interleaves the workers' examples: step k trains on the same global batch
of examples as one device fed global batches, in another order (2 workers x 2 replicas: the
replicas hold examples 0,2,4,.. / 32,34,.. / 1,3,.. / 33,35,.. of the batch). So the
references read the shuffled training set in global batches and put each batch in the order
the workers' replicas hold it (`worker_order`):
- `worker-order-reference-WxL`: the seed's loop without a strategy, one gradient of the whole
  global batch (the single-device reference);
- `worker-summed-reference-WxL`: the same, with the gradients of the replicas' batches summed
  in replica order (the order-matched reference; also calibration's other summation order).

Pairs: `multi-worker-2x1` (2 workers x 1 replica) and `multi-worker-2x2` against both, and
the negative controls of multi-worker input and checkpointing against the single-device one.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from verify import Expectation, Implementation
from verify.runners.loop.multi_worker import MultiWorkerLoopRunner

from cases.custom_loop.seed_loop import LoopContext, TutorialLoop, Variant, examples_dataset

BATCHES = ("per_replica", "global")
CHECKPOINTS = ("chief", "every_worker")
LAYOUTS = ((2, 1), (2, 2))        # (workers, replicas per worker) of the faithful pairs


@dataclasses.dataclass(frozen=True)
class WorkerInput:
    """How each worker reads its data and saves its checkpoints: the tutorial's way, or with
    one mistake (a negative control)."""

    batch: str = "per_replica"     # "global": each replica batches the whole global batch size
    shard: bool = True             # False: every worker reads every example
    checkpoint: str = "chief"      # "every_worker": every worker saves to the real path

    def __post_init__(self):
        if self.batch not in BATCHES or self.checkpoint not in CHECKPOINTS:
            raise ValueError(f"batch must be one of {BATCHES} and checkpoint one of "
                             f"{CHECKPOINTS}, got {self.batch!r}, {self.checkpoint!r}")


def is_chief(strategy) -> bool:
    """The multi-worker tutorial's `_is_chief`: no cluster, the "chief" task, or worker 0 of a
    cluster without one."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return True
    if resolver.task_type == "chief":
        return True
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in resolver.cluster_spec().as_dict())


class MultiWorkerLoop(TutorialLoop):
    """The seed's loop as the multi-worker migration writes it (see the module docstring);
    `setup` says how its input and checkpoints are written."""

    def __init__(self, strategy, context: LoopContext, variant: Variant = Variant(),
                 setup: WorkerInput = WorkerInput()):
        self.setup = setup
        super().__init__(strategy, context, variant)

    def distributed_datasets(self):
        strategy, context, setup = self.strategy, self.context, self.setup

        def per_worker(examples, training):
            def dataset_fn(input_context):
                batch = (input_context.get_per_replica_batch_size(context.global_batch_size)
                         if setup.batch == "per_replica" else context.global_batch_size)
                dataset = examples_dataset(examples, training, context.seed)
                if setup.shard:
                    dataset = dataset.shard(input_context.num_input_pipelines,
                                            input_context.input_pipeline_id)
                return dataset.batch(batch)
            return strategy.distribute_datasets_from_function(dataset_fn)

        test = None if context.eval_examples is None else per_worker(context.eval_examples,
                                                                     False)
        return per_worker(context.examples, True), test

    def train_epoch(self) -> dict[str, float]:
        metrics = super().train_epoch()
        self.save_checkpoint()
        return metrics

    def save_checkpoint(self) -> None:
        """The tutorial's multi-worker checkpointing: the chief writes the checkpoint
        directory, every other worker a temporary directory of its own, then deletes it."""
        import tensorflow as tf

        directory = self.context.workdir / "training_checkpoints"
        shared = self.setup.checkpoint == "every_worker" or is_chief(self.strategy)
        if shared:
            self.checkpoint.save(str(directory / "ckpt"))
        else:
            temporary = directory / f"workertemp_{self.strategy.cluster_resolver.task_id}"
            self.checkpoint.save(str(temporary / "ckpt"))
            tf.io.gfile.rmtree(str(temporary))


def worker_order(batch: int, workers: int, per_worker_batch: int) -> np.ndarray:
    """Where each example of a global batch of `batch` (the examples after shuffling) sits
    when `workers` workers shard the data by example and each batches `per_worker_batch`
    examples per step over its replicas: position i of the result holds the example at
    `order[i]`. A last, smaller batch is split the same way.

    >>> worker_order(8, 2, 4).tolist()
    [0, 2, 4, 6, 1, 3, 5, 7]
    >>> worker_order(5, 2, 4).tolist()
    [0, 2, 4, 1, 3]
    """
    return np.array([w + workers * i for w in range(workers)
                     for i in range(min(per_worker_batch, -(-(batch - w) // workers)))],
                    np.int64)


class WorkerOrderLoop(TutorialLoop):
    """The seed's loop without a strategy, fed each global batch in the order `workers`
    workers read it through InputContext sharding (`worker_order`)."""

    def __init__(self, strategy, context: LoopContext, variant: Variant = Variant(),
                 workers: int = 2):
        self.workers = workers
        super().__init__(strategy, context, variant)

    def distributed_datasets(self):
        import tensorflow as tf

        context, workers = self.context, self.workers
        batch, per_worker = context.global_batch_size, context.global_batch_size // workers
        full = tf.constant(worker_order(batch, workers, per_worker))
        last = len(context.examples) % batch
        smaller = tf.constant(worker_order(last, workers, per_worker)) if last else full

        def reorder(images, labels):
            order = tf.cond(tf.shape(labels)[0] == batch, lambda: full, lambda: smaller)
            return tf.gather(images, order), tf.gather(labels, order)

        train = examples_dataset(context.examples, True, context.seed).batch(batch).map(reorder)
        test = None if context.eval_examples is None else examples_dataset(
            context.eval_examples, False, context.seed).batch(batch)
        distribute = self.strategy.experimental_distribute_dataset
        return distribute(train), None if test is None else distribute(test)


def implementations_and_pairs(names, runner_fields: dict, train_examples: int,
                              batch_per_replica: int, full: bool):
    """The multi-worker implementations, their pairs and the references' noise variants.

    `runner_fields` are the case's loop-runner settings (data, variables_every); the
    multi-worker runs train one epoch. The quick tier runs the controls at 2 workers x 1
    replica; `--full` at 2 x 2 as well.
    """
    from verify import LoopRunner

    fields = {**runner_fields, "epochs": 1}
    implementations, noise = [], {}
    # A candidate's two pairs next to each other: pytest-xdist (-n 2) hands each process
    # consecutive tests, so its workers usually run once (traces are cached per process).
    pairs, controls = [], []

    def reference(name, workers, replicas, variant, description):
        implementations.append(Implementation(
            name, LoopRunner(build_loop=functools.partial(WorkerOrderLoop, variant=variant,
                                                          workers=workers),
                             strategy="default", global_batch_replicas=replicas, **fields),
            names, description=description, replicas=1))

    def multi_worker(name, workers, replicas, setup, description, expect=None):
        implementations.append(Implementation(
            name, MultiWorkerLoopRunner(build_loop=functools.partial(MultiWorkerLoop,
                                                                     setup=setup),
                                        workers=workers, **fields),
            names, description=description, replicas=replicas, expect=expect))

    for workers, per_worker in LAYOUTS:
        layout, replicas = f"{workers}x{per_worker}", workers * per_worker
        single, summed = f"worker-order-reference-{layout}", f"worker-summed-reference-{layout}"
        reference(single, workers, replicas, Variant(),
                  f"the seed's loop without a strategy, each global batch of {replicas} "
                  f"replicas in the order {workers} workers' InputContext shards hold it")
        reference(summed, workers, replicas, Variant(sum_like_replicas=replicas),
                  f"as {single}, with the gradients of the {replicas} replicas' batches "
                  f"summed in replica order")
        noise[single] = [summed]
        candidate = f"multi-worker-{layout}"
        multi_worker(candidate, workers, replicas, WorkerInput(),
                     f"the seed's loop under MultiWorkerMirroredStrategy, {workers} worker "
                     f"processes x {per_worker} replica(s), per-worker input sharded by "
                     f"InputContext, chief-only checkpoints")
        pairs += [(single, candidate), (summed, candidate)]
        if per_worker > 1 and not full:
            continue
        epoch = -(-train_examples // (batch_per_replica * replicas))
        mistakes = [
            ("control-worker-global-batch", WorkerInput(batch="global"),
             "each worker batches the global batch size instead of its replicas' share",
             Expectation(step=1, quantity="input", cause="input",
                         why=f"every replica's batch holds {batch_per_replica * replicas} "
                             f"examples instead of {batch_per_replica}")),
            ("control-worker-unsharded", WorkerInput(shard=False),
             "per-worker input not sharded: every worker reads every example",
             Expectation(step=1, quantity="input", cause="input",
                         why="every worker's replicas hold the same examples (the first "
                             "of the shuffle): the step trains on each of them once per "
                             "worker and never on the rest of the global batch")),
            ("control-worker-shared-checkpoint", WorkerInput(checkpoint="every_worker"),
             "every worker saves its checkpoint to the same path",
             Expectation(step=epoch + 1, quantity="run",
                         why=f"the workers write the same checkpoint files after step "
                             f"{epoch} (the epoch's end): on a shared filesystem they race")),
        ]
        for name, setup, description, expect in mistakes:
            multi_worker(f"{name}-{layout}", workers, replicas, setup,
                         f"control: {description}", expect)
            controls.append((single, f"{name}-{layout}"))
    return implementations, pairs + controls, noise
