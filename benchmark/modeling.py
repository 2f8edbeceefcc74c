"""Model loading for both model kinds (masked and causal LMs), the per-architecture module map of the units that
unit-level methods act on, and the loss at the positions a batch names.

Model kinds: a **masked** LM (BERT, RoBERTa: ``AutoModelForMaskedLM``) predicts masked tokens from both sides; a
**causal** LM (GPT-2, Llama, Qwen, Mistral: ``AutoModelForCausalLM``) predicts every next token. Each kind is a
model family (:mod:`benchmark.families`), read from the model's configuration (:func:`benchmark.families.family_of`),
never from a flag. Batches of both kinds name the positions
whose outputs the loss reads (``mlm_positions``, flat indices) and their targets (``mlm_targets``): the masked
positions and the original tokens for a masked LM, every position but each chunk's last and the next token for a
causal LM. So one forward (:func:`mlm_forward`: backbone, then the LM head on those positions only) serves both.

Units (attention heads, intermediate neurons, output neurons) per architecture (:func:`layer_modules`):

* BERT/RoBERTa: ``query``/``key``/``value`` rows of head h, ``attention.output.dense`` columns of head h;
  ``intermediate.dense`` row j; ``output.dense`` row d.
* GPT-2: the fused ``c_attn`` (a ``Conv1D``: weight in x out) holds q, k and v as thirds of its output; head h is
  its slice of each third, and rows h of ``attn.c_proj``'s input; ``mlp.c_fc`` output j; ``mlp.c_proj`` output d.
* Llama/Qwen/Mistral: ``q_proj`` rows of query head h, ``o_proj`` columns of head h. Under grouped-query attention
  a key/value head serves ``heads // kv_heads`` query heads: the unit is the query head, and the shared ``k_proj``
  and ``v_proj`` rows of its key/value head are protected as much as the most protected query head it serves
  (the keep factor of a key/value head is the smallest of its query heads'). The gated MLP's intermediate unit j is
  row j of ``gate_proj`` and of ``up_proj`` and column j of ``down_proj``; output unit d is row d of ``down_proj``.
"""

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
    """The modules of one transformer layer that unit-level methods (DAS, HAT) act on (see the module docstring).
    ``query``/``key``/``value`` are None where one fused projection (``qkv``) holds all three."""

    query: nn.Module | None
    key: nn.Module | None
    value: nn.Module | None
    attn_out: nn.Module
    """Attention output projection; its input is the concatenated heads."""
    intermediate: nn.Module
    """First FFN projection (its output is the pre-activation of the intermediate neurons; ``up_proj`` when gated)."""
    output: nn.Module
    """Last FFN projection (before dropout and residual); its outputs are the output neurons."""
    qkv: nn.Module | None = None
    """A fused query/key/value projection (GPT-2's ``c_attn``), thirds of its output."""
    gate: nn.Module | None = None
    """The gate projection of a gated MLP (Llama's ``gate_proj``): the intermediate unit reads it too."""
    kv_heads: int | None = None
    """Key/value heads under grouped-query attention (None: as many as query heads)."""

    @property
    def projections(self) -> tuple[nn.Module, ...]:
        """Every projection the layer's units own."""
        named = (self.query, self.key, self.value, self.qkv, self.attn_out, self.gate, self.intermediate, self.output)
        return tuple(m for m in named if m is not None)


def out_axis(module: nn.Module) -> int:
    """The weight axis of a projection's outputs: 0 for ``nn.Linear`` (out x in), 1 for transformers' ``Conv1D``."""
    return 1 if type(module).__name__ == "Conv1D" else 0


def layer_paths(model_type: str) -> Mapping[str, str]:
    """Where a model type's layers are (below its base model) and the unit-bearing modules of one layer, as its
    family declares them (:attr:`benchmark.families.ModelFamily.unit_maps`); a type no family maps is a named
    error."""
    from benchmark.families import FAMILIES

    for family in FAMILIES.values():
        if model_type in family.unit_maps:
            return family.unit_maps[model_type]
    known = sorted(t for family in FAMILIES.values() for t in family.unit_maps)
    raise DapbenchError(
        f"no module map for architecture {model_type!r}",
        f"add its layer paths to its model family's unit_maps (known: {', '.join(known)})",
    )


def encoder_of(model: nn.Module) -> nn.Module:
    """The bare backbone inside a task model (``BertModel``, ``GPT2Model``, ``LlamaModel``): hidden states out."""
    return getattr(model, model.base_model_prefix)


def mlm_head_of(model: nn.Module) -> nn.Module:
    """The language-model head: the one child of a ``*ForMaskedLM``/``*ForCausalLM`` model that is not the backbone."""
    heads = [child for name, child in model.named_children() if name != model.base_model_prefix]
    if len(heads) != 1:
        raise DapbenchError(
            f"cannot find the LM head of {type(model).__name__}", "use a *ForMaskedLM/*ForCausalLM model"
        )
    return heads[0]


def layer_modules(model: nn.Module) -> list[LayerModules]:
    """The unit-bearing modules of every layer, through the per-architecture map."""
    paths = layer_paths(model.config.model_type)
    kv_heads = getattr(model.config, "num_key_value_heads", None)
    layers = encoder_of(model).get_submodule(paths["layers"])
    names = ("query", "key", "value", "attn_out", "intermediate", "output", "qkv", "gate")
    return [
        LayerModules(**{k: layer.get_submodule(paths[k]) if k in paths else None for k in names}, kv_heads=kv_heads)
        for layer in layers
    ]


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


@contextlib.contextmanager
def model_mode(model: nn.Module, training: bool) -> Iterator[None]:
    """``model`` in train (``training``) or eval mode inside the block, its previous mode after it."""
    was_training = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was_training)


def load_lm(name_or_path: str, require_complete: bool = True):
    """Load a language model of its family's kind (:func:`benchmark.families.family_of`; in float32) and its
    tokenizer from a hub id or a
    local directory. A causal LM's tokenizer without a padding token pads with its end-of-sequence token (classifiers
    and batched inference need one; packed training chunks are never padded).

    Always float32: transformers 5 loads a checkpoint in its stored dtype, so a model saved in fp16 or bf16
    would otherwise train and evaluate in pure half precision (mixed precision is accelerate's job).
    ``require_complete`` refuses a model whose file lacks weights the architecture needs: transformers
    would initialise them at random from the global RNG, so the "base" losses would differ from run to
    run. DAP checkpoints of methods that rename modules (peft) pass False and restore every tensor with
    :func:`restore_checkpoint_weights`.
    """
    from transformers import AutoConfig

    from benchmark.families import family_of

    local = Path(name_or_path)
    if not local.exists() and (name_or_path.startswith((".", "/")) or name_or_path.count("/") > 1):
        raise DapbenchError(
            f"model directory not found: {name_or_path}",
            "pass --model with a local model directory or a hub id (e.g. roberta-base)",
        )
    try:
        tokenizer = load_tokenizer(name_or_path)
        auto = family_of(AutoConfig.from_pretrained(name_or_path)).auto_class()
        with quiet_transformers():
            model, info = auto.from_pretrained(name_or_path, dtype=torch.float32, output_loading_info=True)
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
            "use a complete checkpoint (with its LM head), or train one with `dapbench pretrain-base`",
        )
    if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


load_masked_lm = load_lm
"""The name plugins written before causal LMs were supported use: it loads a model of either kind."""


def load_tokenizer(name_or_path: str):
    """The model's tokenizer; one without a padding token pads with its end-of-sequence token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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
    """Mean cross-entropy of the LM at the positions the batch names, the last hidden state, and the logits at those
    positions (selected x vocabulary): the masked positions of a masked LM, every next token of a causal LM.

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
    """A sequence classifier with a fresh ``num_labels`` head on the backbone saved in ``checkpoint_dir`` (a decoder
    classifies from its last non-padding token, so it needs the padding token's id)."""
    from transformers import AutoModelForSequenceClassification

    pad = load_tokenizer(str(checkpoint_dir)).pad_token_id
    with quiet_transformers():
        # fp32 whatever the checkpoint stores: transformers 5 loads its dtype ("auto"), and a bf16 hub model would
        # otherwise be fine-tuned in bf16 weights while DAP trains the same weights in fp32.
        return AutoModelForSequenceClassification.from_pretrained(
            checkpoint_dir, num_labels=num_labels, pad_token_id=pad, dtype=torch.float32
        )
