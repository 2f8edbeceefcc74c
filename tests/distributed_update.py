"""Two DAP updates per stage of every given method, with one process or under ``torchrun``: the harness of
``tests/test_distributed.py``.

The runner's own stage code runs unchanged (its sampled stream, masks and dropout, ``before_domain``, the
updates, ``after_domain``, held-out evaluation, checkpoint): with one process an update accumulates the
global batch's two micro-batches, with two processes each takes one. The stream is drawn per micro-batch
(``benchmark.data.sampling``), so the checkpoints written under ``OUT/<method>`` must agree between the two within
float rounding. Every process also writes a digest of its parameters, to show that the processes stay identical.

    python tests/distributed_update.py OUT MODEL DATA_ROOT METHOD [METHOD ...]
    torchrun --nproc_per_node 2 tests/distributed_update.py OUT MODEL DATA_ROOT METHOD [METHOD ...]
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

MICRO_BATCH, GLOBAL_BATCH = 4, 8


def main(out: Path, model: str, data_root: Path, methods: list[str]) -> None:
    from accelerate import PartialState

    from benchmark.api import continual_run, quiet_libraries, resolve_config
    from benchmark.data.inputs import prepare_data

    quiet_libraries()
    state = PartialState(cpu=True)  # gloo processes (what `benchmark.engine.environment.process_state` makes on CPU)
    config = resolve_config(
        "synthetic",
        model=model,
        data_root=str(data_root),
        general_heldout=str(data_root / "general_heldout.txt"),
        sequence="alpha,beta",
        methods=methods,
        seeds=[3],
        output_dir=str(out / "run"),
        overrides=[
            "dap.steps=2",
            f"dap.batch_size={GLOBAL_BATCH}",
            f"dap.per_device_batch_size={MICRO_BATCH}",
            "dap.heldout_chunks=8",
            "dap.probe_chunks=8",
            "dap.probe_batch_size=4",
            "dap.log_every=1",
            "finetune.max_train_examples=8",
            "prompt_one.num_tokens=8",
        ],
    )
    with state.main_process_first():
        data = prepare_data(config)
    stage = _digest_models_as_evaluated(out / "digests", state.process_index)
    for method in methods:
        run = continual_run(config, data, method, 3, show_progress=False)
        for t in run.schedule.stages():
            stage["name"] = f"{method}-stage{t}"
            run.stages.run(t)
            if state.is_main_process:
                _copy_checkpoint(run, t, out / method)


def _digest_models_as_evaluated(folder: Path, rank: int) -> dict:
    """Wrap the runner's held-out evaluation and checkpoint (which every process runs on its trained model, the
    no-DAP baseline's base model included) so that it also writes a digest of that model's parameters; returns the
    holder of the current stage's name."""
    from benchmark.engine import stages as runner

    evaluate, stage = runner.evaluate_and_checkpoint, {"name": ""}

    def digest_then_evaluate(p, base, model, *args, **kwargs):
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stage['name']}-rank{rank}.digest").write_text(digest.hexdigest())
        return evaluate(p, base, model, *args, **kwargs)

    runner.evaluate_and_checkpoint = digest_then_evaluate
    return stage


def _copy_checkpoint(run, t: int, folder: Path) -> None:
    import shutil

    shutil.copytree(run.layout.checkpoint(t), folder / f"checkpoint-{t}", dirs_exist_ok=True)


def _without_ddp() -> None:
    """The negative control (``DAPBENCH_TEST_WITHOUT_DDP=1``): models are not wrapped, so nothing is synchronised
    and the processes must drift apart; the test checks that it notices."""
    from accelerate import Accelerator

    Accelerator.prepare_model = lambda self, model, device_placement=None, evaluation_mode=False: model


if __name__ == "__main__":
    if os.environ.get("DAPBENCH_TEST_WITHOUT_DDP") == "1":
        _without_ddp()
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
