"""DoMIX (issue #28): per-domain LoRA modules trained independently, mixed by an identity-initialised bridge."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from cli_helpers import REPO, one_thread_env

from methods._shared.adapters import activate_adapters, adapter_parameters
from methods.domix import DoMIXConfig, attach_bridges, bridge_summary, inject_domain_modules, lora_layers, module_name


def _classifier_with_trained_modules(tiny_model, count: int):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=3)
    model = inject_domain_modules(model, count, DoMIXConfig(rank=4, alpha=8.0))
    with torch.no_grad():  # stand-ins for trained modules: LoRA's B starts at zero
        for k in range(count):
            for name, param in adapter_parameters(model, module_name(k)):
                if "lora_B" in name:
                    param.normal_(0, 0.05)
    return model.eval()


def test_the_bridge_starts_as_the_sum_of_the_domain_modules(tiny_model):
    model = _classifier_with_trained_modules(tiny_model, 3)
    ids = torch.randint(5, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    activate_adapters(model, [module_name(k) for k in range(3)])
    summed = model(input_ids=ids).logits
    activate_adapters(model, [])
    base = model(input_ids=ids).logits
    bridges = attach_bridges(model, [module_name(k) for k in range(3)])
    bridged = model(input_ids=ids).logits
    assert torch.allclose(bridged, summed, atol=1e-5) and not torch.allclose(bridged, base, atol=1e-4)
    assert len(bridges) == len(lora_layers(model)) and all(torch.equal(b.matrix, torch.eye(12)) for b in bridges)
    summary = bridge_summary(bridges, 4)
    assert summary["block_norms"] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]] and summary["max_change"] == 0


def test_the_bridge_trains_and_the_domain_modules_stay_fixed(tiny_model):
    model = _classifier_with_trained_modules(tiny_model, 2).train()
    bridges = attach_bridges(model, [module_name(0), module_name(1)])
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" not in name)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(5, 200, (4, 12), generator=torch.Generator().manual_seed(2))
    for _ in range(3):
        loss = model(input_ids=ids, labels=torch.tensor([0, 1, 2, 1])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert bridge_summary(bridges, 4)["max_change"] > 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if ".lora_" in n)


def test_a_domix_run_trains_one_module_per_domain_and_records_the_learned_bridges(world_root, tiny_model, tmp_path):
    args = [sys.executable, "-m", "benchmark.cli", "run", "--profile", "synthetic", "--model", str(tiny_model)]
    args += ["--data-root", str(world_root), "--general-heldout", str(world_root / "general_heldout.txt")]
    args += ["--sequence", "alpha,beta", "--methods", "domix", "--seeds", "1", "--output-dir", str(tmp_path)]
    args += ["--quiet", "--set", "dap.steps=4", "--set", "finetune.default_epochs=1"]
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900, env=one_thread_env())
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (tmp_path / "results" / "synthetic").glob("domix-*.json")
    record = json.loads(path.read_text())
    reports = record["finetune_reports"]
    assert sorted(reports) == ["0/0", "1/0", "1/1"]  # every cell of the full matrix
    assert [len(reports[cell]["block_norms"]) for cell in ("0/0", "1/1")] == [1, 2]  # the modules seen so far
    assert all(reports[cell]["max_change"] > 0 for cell in reports)  # fine-tuning moved every bridge
    trainable = [d["trainable_parameters"] for d in record["domains"]]
    assert trainable[0] == trainable[1] > 0  # one module per domain, of one size
