"""The algorithms as pure pieces: outer-step math, groups, quorum and grace, constant work, and the
strategy object of each method (`methods.build_method`). Nothing here does I/O or imports hivemind."""
