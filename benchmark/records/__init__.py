"""Run records and what they are checked against: the declared schema (:mod:`.schema`), reading and migrating
(:mod:`.store`), building (:mod:`.build`), the run identity (:mod:`.identity`), the checks every record passes when
read (:mod:`.checks`) and re-deriving a record from scratch (:mod:`.reproduce`)."""
