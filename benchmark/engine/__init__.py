"""The engine: one method with one seed through a domain sequence (:mod:`.runner`), stage by stage (:mod:`.stages`,
:mod:`.training`, :mod:`.schedule`), evaluated on held-out text (:mod:`.evaluation`, :mod:`.heldout`) and end tasks
(:mod:`.cells`, :mod:`.finetune`), resumably (:mod:`.layout`), on the device accelerate gives (:mod:`.environment`)."""
