"""Tools around runs: fanning a grid out (:mod:`.launch`) and measuring the cost of every method's update
(:mod:`.bench`)."""
