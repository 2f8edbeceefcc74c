"""Accelerator pieces shared by the DAP engine and the end-task protocols: compiled transformer blocks
(:mod:`benchmark.acceleration.compiling`), FSDP2 sharding (:mod:`benchmark.acceleration.sharding`) and the choice of
a fused optimizer step (:func:`benchmark.acceleration.fused.fused_adamw`). They sit below both, so that neither
imports the other for them."""
