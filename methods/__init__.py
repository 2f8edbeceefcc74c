"""Built-in method plugins, one file each. This mapping is the single source of registered names.

A method that is not faithful yet is not listed here.
"""

BUILTIN_METHODS: dict[str, str] = {
    "none": "methods.none:NoDap",
    "ncl": "methods.ncl:NCL",
    "one": "methods.one:ONE",
    "das": "methods.das:DAS",
    "dga": "methods.dga:DGA",
    "kd": "methods.kd:KD",
    "ewc": "methods.ewc:EWC",
    "derpp": "methods.derpp:DERPP",
    "pool": "methods.pool:Pool",
    "adapter_ncl": "methods.adapter_ncl:AdapterNCL",
    "adapter_one": "methods.adapter_one:AdapterONE",
    "demix": "methods.demix:DEMIX",
    "prompt_one": "methods.prompt_one:PromptONE",
    "hat": "methods.hat:HAT",
    "hat_all": "methods.hat_all:HATAll",
    "domix": "methods.domix:DoMIX",
    "freeze_bottom": "methods.freeze_bottom:FreezeBottom",
    "merge": "methods.merge:Merge",
    "lora_merge": "methods.lora_merge:LoraMerge",
    "oracle": "methods.oracle:Oracle",
}
