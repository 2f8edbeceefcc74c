"""Every setting declares its type and range where it is defined, and validation reads the declarations."""

import dataclasses

import pytest

from benchmark.config import PROFILES, DapConfig, FinetuneConfig, RunConfig, apply_overrides, profile_config
from benchmark.errors import DapbenchError
from benchmark.registry import default_registry
from benchmark.settings import undeclared_fields


def test_no_numeric_or_text_setting_lacks_a_declared_range_or_choices():
    classes = [RunConfig, DapConfig, FinetuneConfig]
    classes += [default_registry().get(name).config_cls for name in default_registry().names()]
    missing = [field for cls in classes for field in undeclared_fields(cls)]
    assert not missing, f"declare these with benchmark.settings.setting(...): {missing}"


def test_values_are_coerced_to_one_spelling():
    config = apply_overrides(profile_config("mini"), ["dap.lr=1", "finetune.epochs.aclarc_sup=3", "seeds=1,2"])
    assert config.dap.lr == 1.0 and isinstance(config.dap.lr, float)
    assert config.finetune.epochs["aclarc_sup"] == 3.0 and isinstance(config.finetune.epochs["aclarc_sup"], float)
    assert config.seeds == (1, 2)
    assert RunConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("dap.steps=2.5", "dap.steps expects a whole number"),
        ("dap.steps=true", "dap.steps expects a number"),
        ("dap.warmup_ratio=1", "dap.warmup_ratio=1.0 is out of range: it must be a finite number >= 0 and < 1"),
        ("dap.mixed_precision=fp8", "invalid dap.mixed_precision='fp8'"),
        ("finetune.epochs.aclarc_sup=-1", "finetune.epochs.aclarc_sup=-1.0 is out of range"),
        ("das.temperature=0", "das.temperature=0.0 is out of range"),
        ("das.units=head,neurons", "invalid das.units='neurons'"),
        ("kd.weight=-Infinity", "kd.weight=-inf is not a finite number"),
    ],
)
def test_declarations_refuse_by_name(override, message):
    from benchmark.api import validate_config

    with pytest.raises(DapbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(apply_overrides(profile_config("mini"), [override]))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_round_trips_through_its_dict(profile):
    config = dataclasses.replace(profile_config(profile), method_options={"das": {"fidelity": "reference"}})
    assert RunConfig.from_dict(config.to_dict()) == config
    assert RunConfig.from_dict(__import__("json").loads(__import__("json").dumps(config.to_dict()))) == config
