"""Model loading, the per-architecture module map, and the efficient MLM loss."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmark.errors import DapbenchError


@dataclass(frozen=True)
class LayerModules:
    """The modules of one transformer layer that unit-level methods (DAS, HAT) act on."""

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    attn_out: nn.Linear
    """Attention output projection; its input columns are the concatenated heads."""
    intermediate: nn.Linear
    """First FFN projection (its output is the pre-activation of the intermediate neurons)."""
    output: nn.Linear
    """Second FFN projection (before dropout, residual and LayerNorm)."""


# Attribute paths inside one encoder layer, per architecture (stock transformers modules).
_BERT_LIKE = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
}
LAYER_PATHS = {"bert": _BERT_LIKE, "roberta": _BERT_LIKE, "xlm-roberta": _BERT_LIKE, "electra": _BERT_LIKE}


def encoder_of(model: nn.Module) -> nn.Module:
    """The bare encoder (``BertModel``/``RobertaModel``) inside a task model."""
    return getattr(model, model.base_model_prefix)


def mlm_head_of(model: nn.Module) -> nn.Module:
    """The MLM prediction head: the one child of a ``*ForMaskedLM`` model that is not the encoder."""
    heads = [child for name, child in model.named_children() if name != model.base_model_prefix]
    if len(heads) != 1:
        raise DapbenchError(f"cannot find the MLM head of {type(model).__name__}", "use a *ForMaskedLM model")
    return heads[0]


def layer_modules(model: nn.Module) -> list[LayerModules]:
    """The unit-bearing modules of every encoder layer, through the per-architecture map."""
    model_type = model.config.model_type
    if model_type not in LAYER_PATHS:
        raise DapbenchError(
            f"no module map for architecture {model_type!r}",
            f"add its layer paths to benchmark.modeling.LAYER_PATHS (known: {', '.join(LAYER_PATHS)})",
        )
    layers = encoder_of(model).encoder.layer
    return [LayerModules(**{k: layer.get_submodule(p) for k, p in LAYER_PATHS[model_type].items()}) for layer in layers]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report inside the block: loading a DAP checkpoint into a task model
    (or a checkpoint with method-added tensors) lists expected key differences, not problems."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_masked_lm(name_or_path: str, require_complete: bool = True):
    """Load a masked LM (in float32) and its tokenizer from a hub id or a local directory.

    Always float32: transformers 5 loads a checkpoint in its stored dtype, so a model saved in fp16
    would otherwise train and evaluate in pure half precision (mixed precision is accelerate's job).
    ``require_complete`` refuses a model whose file lacks weights the architecture needs: transformers
    would initialise them at random from the global RNG, so the "base" losses would differ from run to
    run. DAP checkpoints of methods that rename modules (peft) pass False and restore every tensor with
    :func:`restore_checkpoint_weights`.
    """
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    local = Path(name_or_path)
    if not local.exists() and (name_or_path.startswith((".", "/")) or name_or_path.count("/") > 1):
        raise DapbenchError(
            f"model directory not found: {name_or_path}",
            "pass --model with a local model directory or a hub id (e.g. roberta-base)",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        with quiet_transformers():
            model, info = AutoModelForMaskedLM.from_pretrained(
                name_or_path, dtype=torch.float32, output_loading_info=True
            )
    except (OSError, ValueError) as exc:
        raise DapbenchError(
            f"cannot load model {name_or_path!r}: {exc}",
            "without hub access use a local directory (see ../shared/models or `dapbench pretrain-base`)",
        ) from exc
    missing = list(info.get("missing_keys") or [])
    if require_complete and missing:
        raise DapbenchError(
            f"model {name_or_path!r} lacks {len(missing)} weight(s) its architecture needs ({', '.join(missing[:3])}):"
            " they would be initialised at random",
            "use a complete masked-LM checkpoint (with its MLM head), or train one with `dapbench pretrain-base`",
        )
    return model, tokenizer


def check_model_files(name_or_path: str) -> None:
    """A local model directory must exist, hold a config, and its safetensors weights must be readable to their
    end (a truncated download fails here with a named error, not in the middle of a run). Hub ids pass."""
    local = Path(name_or_path)
    looks_local = local.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if not looks_local:
        return
    if not local.is_dir() or not (local / "config.json").is_file():
        raise DapbenchError(
            f"model directory not found (or without config.json): {name_or_path}",
            "pass --model with a local model directory or a hub id (e.g. roberta-base)",
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for weights in sorted(local.glob("*.safetensors")):
        try:
            load_file(str(weights))
        except (SafetensorError, OSError) as exc:
            raise DapbenchError(
                f"model weights {weights} are unreadable ({exc})", "the file is truncated or corrupt: copy it again"
            ) from exc
    for weights in sorted(local.glob("*.bin")):
        _check_plain_tensors(weights)


def _check_plain_tensors(weights: Path) -> None:
    """A pickled weight file is read with ``weights_only`` (tensors and plain values, no code): one holding anything
    else, or a corrupt one, is a named error before any work."""
    import pickle

    try:
        torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as exc:
        raise DapbenchError(
            f"model weights {weights} are not plain tensors or are corrupt: refused without running them"
            f" ({type(exc).__name__})",
            "convert the checkpoint to safetensors with a trusted copy of its code, or use another model",
        ) from exc


def restore_checkpoint_weights(model: nn.Module, checkpoint_dir: str | Path) -> None:
    """Load every tensor of a checkpoint into a model after the method's ``setup``.

    ``from_pretrained`` skips (or re-initialises around) what a method adds in ``setup``: adapter
    weights, prompt vectors, task embeddings, and the ``base_layer`` renaming that peft's injection
    causes. Loading the whole file again into the set-up model restores all of it. Only tied weights,
    which the file stores once, may be absent from it.
    """
    from safetensors.torch import load_file

    path = Path(checkpoint_dir) / "model.safetensors"
    if not path.exists():
        raise DapbenchError(f"checkpoint weights missing: {path}", "delete the run directory and run again")
    tensors = load_file(str(path))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {
        name for name, _ in model.named_parameters()
    }
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise DapbenchError(
            f"checkpoint {checkpoint_dir} does not match the method's model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}",
            "resume with the same method options, or delete the run directory",
        )


def mlm_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean MLM cross-entropy at the masked positions, the last hidden state, and the logits at the
    masked positions (selected x vocabulary).

    The vocabulary projection dominates small models, so the head runs only on the selected
    positions. Their flat indices (``mlm_positions``) and targets (``mlm_targets``) are computed on
    the host by the collator, so this function never synchronises with the device.
    """
    hidden = encoder_of(model)(
        input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")
    ).last_hidden_state
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["mlm_positions"])
    logits = mlm_head_of(model)(selected)
    # Half-precision logits are promoted for a stable softmax; float64 stays float64.
    loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), batch["mlm_targets"])
    return loss, hidden, logits


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of the last hidden state over non-padding tokens (over all tokens without a mask: full packed chunks,
    bit-identical to an all-ones mask)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def mlm_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean MLM cross-entropy at the masked positions (see :func:`mlm_forward`)."""
    return mlm_forward(model, batch)[0]


def classifier_from_checkpoint(checkpoint_dir: str | Path, num_labels: int) -> nn.Module:
    """A sequence classifier with a fresh ``num_labels`` head on the encoder saved in ``checkpoint_dir``."""
    from transformers import AutoModelForSequenceClassification

    with quiet_transformers():
        return AutoModelForSequenceClassification.from_pretrained(checkpoint_dir, num_labels=num_labels)
